// Floodgate's console: reads /api/v1/console, follows /api/v1/events, and
// offers the Admin actions. Every value from the server is set as text.
"use strict";

const $ = (id) => document.getElementById(id);
let token = sessionStorage.getItem("floodgate-token") || "";
let refreshing = null;

function headers(extra) {
  const h = Object.assign({}, extra || {});
  if (token) h["Authorization"] = "Bearer " + token;
  return h;
}

function say(text, kind) {
  const m = $("message");
  m.textContent = text;
  m.className = kind || "";
}

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

function when(iso) {
  if (!iso) return "-";
  const d = new Date(iso);
  const s = Math.round((d.getTime() - Date.now()) / 1000);
  return s >= 0 ? "in " + s + "s" : -s + "s ago";
}

function pct(x) {
  return (100 * x).toFixed(1) + "%";
}

async function load() {
  const r = await fetch("/api/v1/console", { headers: headers(), cache: "no-store" });
  const body = await r.json().catch(() => ({}));
  if (!r.ok) {
    say((r.status === 401 ? "A token is needed: " : "Refused: ") + (body.error || r.status), "error");
    return false;
  }
  render(body);
  return true;
}

function scheduleLoad() {
  if (refreshing) return;
  refreshing = setTimeout(async () => {
    refreshing = null;
    try { await load(); } catch (e) { say("Cannot reach the server: " + e, "error"); }
  }, 100);
}

function render(s) {
  $("rules-version").textContent = "rules v" + s.rules.version;
  $("rules-source").textContent = s.rules.source + " (" + s.rules.patterns.length + " patterns, loaded " + when(s.rules.loaded_at) + ")";
  const envoy = s.envoy;
  $("envoy-source").textContent = envoy
    ? envoy.source + (envoy.version ? " version " + envoy.version : "") + " (" + envoy.domains + " domains, loaded " + when(envoy.loaded_at) + ")"
    : "none";
  const sentinel = s.sentinel;
  $("sentinel-source").textContent = sentinel
    ? sentinel.source + " (" + sentinel.resources + " resources" +
      (sentinel.ignored ? ", " + sentinel.ignored + " rules not enforced" : "") + ", loaded " + when(sentinel.loaded_at) + ")"
    : "none";
  $("level").textContent = s.level.level + (s.level.manual ? " (manual; automatic " + s.level.automatic + ")" : " (automatic)");
  $("level").dataset.level = s.level.level;
  const rep = s.replication;
  $("replication").textContent = rep.mode === "redis"
    ? "Redis " + (rep.redis_up ? "up" : "DOWN") + ", " + rep.live_replicas + " live replicas"
    : "memory only (one replica)";
  $("overrides").textContent = s.overrides;

  const systems = document.querySelector("#systems tbody");
  systems.replaceChildren();
  const choice = $("level-system");
  const chosen = choice.value;
  choice.replaceChildren(el("option", "global"));
  choice.firstChild.value = "";
  for (const sys of s.systems) {
    const tr = el("tr");
    tr.dataset.system = sys.system;
    tr.append(el("td", sys.system), el("td", sys.level),
      el("td", sys.manual ? "operator (automatic " + sys.automatic + ")" : "automatic"), el("td", sys.reason),
      el("td", sys.signals.instances));
    systems.append(tr);
    const option = el("option", sys.system);
    option.value = sys.system;
    choice.append(option);
  }
  choice.value = chosen;
  if (choice.value !== chosen) choice.value = "";
  if (s.systems.length === 0) {
    const tr = el("tr");
    const td = el("td", "the rules name no system", "muted");
    td.colSpan = 5;
    tr.append(td);
    systems.append(tr);
  }

  const tbody = document.querySelector("#breakers tbody");
  tbody.replaceChildren();
  for (const b of s.breakers) {
    const tr = el("tr");
    tr.dataset.resource = b.resource;
    tr.append(el("td", b.resource), el("td", b.state, "state state-" + b.state), el("td", b.calls),
      el("td", pct(b.failure_rate)), el("td", pct(b.slow_call_rate)), el("td", b.not_permitted),
      el("td", when(b.opened_at)), el("td", when(b.next_probe_at)));
    const actions = el("td");
    for (const [label, to] of [["Reset", "CLOSED"], ["Force open", "FORCED_OPEN"], ["Disable", "DISABLED"]]) {
      const button = el("button", label);
      button.type = "button";
      button.dataset.action = to;
      button.addEventListener("click", () => setBreaker(b.resource, to));
      actions.append(button);
    }
    tr.append(actions);
    tbody.append(tr);
  }
  if (s.breakers.length === 0) {
    const tr = el("tr");
    const td = el("td", "no breaker has been used yet", "muted");
    td.colSpan = 9;
    tr.append(td);
    tbody.append(tr);
  }

  const resources = $("resources");
  resources.replaceChildren();
  for (const r of s.resources) {
    const box = el("div");
    box.dataset.rule = r.rule;
    const extras = [];
    if (r.breaker) extras.push("breaker");
    if (r.adaptive) extras.push("adaptive concurrency limit (" + r.adaptive + "), at most " + r.concurrency + " in flight");
    else if (r.concurrency) extras.push("at most " + r.concurrency + " in flight");
    if (r.shed_at_level) extras.push("shed at level " + r.shed_at_level);
    if (r.overrides) extras.push(r.overrides + " overrides");
    box.append(el("h3", r.rule + (extras.length ? "  (" + extras.join(", ") + ")" : "")));
    const t = el("table");
    for (const l of r.limits) {
      const tr = el("tr");
      tr.append(el("td", l.name + (l.shadow ? " (shadow)" : "")), el("td", l.algorithm, "muted"),
        el("td", l.key.length ? "per " + l.key.join(", ") : "global"));
      const use = el("td");
      if (l.global) {
        const m = el("meter");
        m.max = l.global.limit;
        m.value = l.global.limit - l.global.remaining;
        use.append(m, el("span", " " + (l.global.limit - l.global.remaining) + " / " + l.global.limit + " used"));
      }
      tr.append(use);
      t.append(tr);
    }
    box.append(t);
    for (const h of r.top) {
      const list = el("ul");
      for (const k of h.denied) list.append(el("li", "denied " + k.count + "  " + k.key));
      for (const k of h.admitted) list.append(el("li", "admitted ~" + k.count + "  " + k.key, "muted"));
      box.append(el("div", "hottest keys of " + h.limit + ":", "muted"), list);
    }
    resources.append(box);
  }

  renderConcurrency(s.concurrency || []);

  const tl = $("timeline");
  tl.replaceChildren();
  for (const e of s.timeline.slice().reverse()) tl.append(el("li", line(e)));
}

function renderConcurrency(list) {
  const tbody = document.querySelector("#concurrency tbody");
  tbody.replaceChildren();
  const charts = $("concurrency-charts");
  charts.replaceChildren();
  for (const c of list) {
    const tr = el("tr");
    tr.dataset.resource = c.resource;
    const ms = (x) => (x ? x + " ms" : "-");
    const latency = c.algorithm ? [c.short_rtt_ms, c.long_rtt_ms, c.no_load_rtt_ms].map(ms).join(" / ") : "";
    const parts = c.partitions.map((p) => p.priority + " " + p.in_flight + "/" + p.guaranteed + " (" + p.percent + "%)").join(", ");
    tr.append(el("td", c.resource), el("td", c.algorithm || "static"), el("td", c.limit, "limit"),
      el("td", c.in_flight), el("td", latency), el("td", parts));
    tbody.append(tr);
    if (c.windows.length > 1) charts.append(chart(c));
  }
  if (list.length === 0) {
    const tr = el("tr");
    const td = el("td", "no concurrency limit has been used yet", "muted");
    td.colSpan = 6;
    tr.append(td);
    tbody.append(tr);
  }
}

// The limit, the most in flight and the mean latency of each window.
function chart(c) {
  const NS = "http://www.w3.org/2000/svg";
  const w = 480, h = 120;
  const box = el("figure");
  box.dataset.resource = c.resource;
  const svg = document.createElementNS(NS, "svg");
  svg.setAttribute("width", w);
  svg.setAttribute("height", h);
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", "limit, in flight and latency of " + c.resource);
  const top = Math.max(1, ...c.windows.map((p) => Math.max(p.limit, p.max_in_flight)));
  const slowest = Math.max(1, ...c.windows.map((p) => p.mean_rtt_ms || 0));
  const x = (i) => (i / (c.windows.length - 1)) * (w - 2) + 1;
  const series = [
    ["limit", "#c00", (p) => p.limit / top],
    ["in flight", "#06c", (p) => p.max_in_flight / top],
    ["latency", "#080", (p) => (p.mean_rtt_ms || 0) / slowest],
  ];
  for (const [name, color, f] of series) {
    const line = document.createElementNS(NS, "polyline");
    line.setAttribute("fill", "none");
    line.setAttribute("stroke", color);
    line.setAttribute("data-series", name);
    line.setAttribute("points", c.windows.map((p, i) => x(i).toFixed(1) + "," + (h - 1 - f(p) * (h - 2)).toFixed(1)).join(" "));
    svg.append(line);
  }
  box.append(svg, el("figcaption", c.resource + ": limit (red) and in flight (blue), 0 to " + top +
    "; mean latency (green), 0 to " + slowest + " ms; the last " + c.windows.length + " windows"));
  return box;
}

function line(e) {
  const t = new Date(e.at).toLocaleTimeString();
  switch (e.kind) {
    case "breaker": return t + "  breaker " + e.resource + ": " + e.from + " -> " + e.to + " (" + e.reason + ")";
    case "degradation": return t + "  level of " + (e.system || "global") + " " + e.from + " -> " + e.to + (e.manual ? " (manual)" : "") + (e.reason ? ": " + e.reason : "");
    case "rules": return t + "  rules v" + e.version + " from " + e.source;
    case "overrides": return t + "  overrides: " + e.set + " set, " + e.deleted + " deleted, " + e.expired + " expired";
    default: return t + "  " + e.kind;
  }
}

async function post(path, body) {
  const r = await fetch(path, { method: "POST", headers: headers({ "Content-Type": "application/json" }), body: JSON.stringify(body) });
  const answer = await r.json().catch(() => ({}));
  return { ok: r.ok, status: r.status, answer };
}

async function setBreaker(resource, to) {
  const { ok, status, answer } = await post("/api/v1/breakers/" + encodeURIComponent(resource) + "/state", { state: to });
  if (ok) say("Breaker " + answer.resource + " is " + answer.state, "ok");
  else say("Refused (" + status + "): " + (answer.error || ""), "error");
  scheduleLoad();
}

async function setLevel() {
  const v = $("level-choice").value;
  const system = $("level-system").value;
  const body = v === "auto" ? { automatic: true, system } : { level: Number(v), system };
  const { ok, status, answer } = await post("/api/v1/level", body);
  const of = system ? "of " + system + " " : "";
  if (ok) say("Degradation level " + of + answer.level + (answer.manual ? " (manual)" : " (automatic)"), "ok");
  else say("Refused (" + status + "): " + (answer.error || ""), "error");
  scheduleLoad();
}

// Server-sent events, read with fetch so that the token goes in a header.
async function follow() {
  for (;;) {
    try {
      const r = await fetch("/api/v1/events", { headers: headers(), cache: "no-store" });
      if (!r.ok || !r.body) throw new Error("HTTP " + r.status);
      $("live").textContent = "live";
      $("live").className = "pill on";
      const reader = r.body.getReader();
      const decoder = new TextDecoder();
      let buffered = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffered += decoder.decode(value, { stream: true });
        let end;
        while ((end = buffered.indexOf("\n\n")) >= 0) {
          const chunk = buffered.slice(0, end);
          buffered = buffered.slice(end + 2);
          if (chunk.startsWith("data: ")) scheduleLoad();
        }
      }
    } catch (e) {
      // Reconnect below.
    }
    $("live").textContent = "reconnecting";
    $("live").className = "pill off";
    await new Promise((resolve) => setTimeout(resolve, 1000));
  }
}

$("auth").addEventListener("submit", (ev) => {
  ev.preventDefault();
  token = $("token").value.trim();
  sessionStorage.setItem("floodgate-token", token);
  $("token").value = "";
  say(token ? "Token set for this tab." : "Token cleared.", "ok");
  scheduleLoad();
});
$("level-set").addEventListener("click", setLevel);

scheduleLoad();
setInterval(scheduleLoad, 5000);
follow();
