// Floodgate's console: reads /api/v1/console and /api/v1/series, follows
// /api/v1/events and applies each event where it belongs (a tick moves the
// charts and the breaker rows, a transition changes one row), and offers the
// Admin actions. Every value from the server is set as text.
"use strict";

const $ = (id) => document.getElementById(id);
const NS = "http://www.w3.org/2000/svg";
const SECONDS = 900;
const PAGE = 25;
let token = sessionStorage.getItem("floodgate-token") || "";
let refreshing = null;
let snap = null;

// The charts: per second, oldest first, the last being second `t`.
const charts = { t: 0, resources: new Map(), other: null, breakers: new Map(), levels: new Map() };
// Resources the operator asked to chart, besides the busiest.
const pinned = new Set();
let seriesWanted = null;
const pages = { resources: 0, breakers: 0 };

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

function svg(tag, attrs) {
  const e = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
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

function count(n) {
  return Number(n).toLocaleString("en");
}

async function load() {
  // The resources are listed a page at a time, filtered by the server.
  const q = new URLSearchParams({
    resource_filter: $("resource-filter").value.trim(),
    resource_offset: String(pages.resources * PAGE),
    resource_count: String(PAGE),
  });
  const r = await fetch("/api/v1/console?" + q, { headers: headers(), cache: "no-store" });
  const body = await r.json().catch(() => ({}));
  if (!r.ok) {
    say((r.status === 401 ? "A token is needed: " : "Refused: ") + (body.error || r.status), "error");
    return false;
  }
  snap = body;
  render();
  return true;
}

// Reads the state and series soon; never two reads at once (one more
// follows the one in flight when asked for during it).
let loading = false;
let again = false;
function scheduleLoad() {
  if (loading) { again = true; return; }
  if (refreshing) return;
  refreshing = setTimeout(async () => {
    refreshing = null;
    loading = true;
    try {
      if (await load()) await loadSeries();
    } catch (e) {
      say("Cannot reach the server: " + e, "error");
    } finally {
      loading = false;
      if (again) { again = false; scheduleLoad(); }
    }
  }, 50);
}

// The series of the busiest resources and breakers, and of those pinned.
async function loadSeries() {
  const q = new URLSearchParams({ top: "6" });
  const r = await fetch("/api/v1/series?" + q, { headers: headers(), cache: "no-store" });
  if (!r.ok) return;
  const busiest = await r.json();
  let named = null;
  if (pinned.size) {
    const p = new URLSearchParams();
    for (const name of [...pinned].slice(0, 32)) p.append("resource", name);
    const answer = await fetch("/api/v1/series?" + p, { headers: headers(), cache: "no-store" });
    if (answer.ok) named = await answer.json();
  }
  charts.t = busiest.t;
  charts.started = busiest.started;
  charts.resources = new Map();
  for (const s of busiest.resources.concat(named ? named.resources : [])) {
    charts.resources.set(s.name, { admitted: s.admitted, denied: s.denied });
  }
  for (const name of pinned) {
    if (!charts.resources.has(name)) charts.resources.set(name, { admitted: zeros(busiest.seconds), denied: zeros(busiest.seconds) });
  }
  charts.other = { admitted: busiest.other.admitted, denied: busiest.other.denied };
  charts.tracked = busiest.tracked;
  charts.breakers = new Map();
  for (const b of busiest.breakers) charts.breakers.set(b.resource, b);
  charts.levels = new Map();
  for (const l of busiest.levels) charts.levels.set(l.system, l.level);
  drawCharts();
}

function zeros(n) {
  return new Array(n).fill(0);
}

// Asks for the series again soon (a new resource is busy), at most every 5 s.
function wantSeries() {
  if (seriesWanted) return;
  seriesWanted = setTimeout(async () => {
    try { await loadSeries(); } finally { seriesWanted = setTimeout(() => { seriesWanted = null; }, 5000); }
  }, 200);
}

function push(list, v) {
  list.push(v);
  if (list.length > SECONDS) list.splice(0, list.length - SECONDS);
}

// One second's sample from the server: the charts move, the breaker rows change.
function applyTick(tick) {
  if (!charts.t) return;
  const steps = Math.min(SECONDS, Math.max(0, tick.t - charts.t));
  if (steps === 0) return;
  charts.t = tick.t;
  const now = new Map(tick.resources.map(([name, a, d]) => [name, [a, d]]));
  for (const [name, s] of charts.resources) {
    for (let i = 1; i < steps; i++) { push(s.admitted, 0); push(s.denied, 0); }
    const [a, d] = now.get(name) || [0, 0];
    push(s.admitted, a);
    push(s.denied, d);
  }
  if (charts.other) {
    for (let i = 1; i < steps; i++) { push(charts.other.admitted, 0); push(charts.other.denied, 0); }
    push(charts.other.admitted, tick.other[0]);
    push(charts.other.denied, tick.other[1]);
  }
  const changed = new Map(tick.breakers.map((b) => [b.resource, b]));
  for (const [name, b] of charts.breakers) {
    const c = changed.get(name);
    for (let i = 0; i < steps; i++) {
      const last = i === steps - 1 && c;
      push(b.failure_rate, last ? c.failure_rate : b.failure_rate[b.failure_rate.length - 1]);
      push(b.slow_call_rate, last ? c.slow_call_rate : b.slow_call_rate[b.slow_call_rate.length - 1]);
      push(b.state, last ? c.state : b.state[b.state.length - 1]);
    }
  }
  for (const [system, level] of tick.levels) {
    const l = charts.levels.get(system);
    if (!l) continue;
    for (let i = 0; i < steps; i++) push(l, level);
  }
  // Every tick names every system: one it no longer names was removed
  // from the rules, and its chart goes with it.
  const named = new Set(tick.levels.map(([system]) => system));
  for (const system of [...charts.levels.keys()]) {
    if (!named.has(system)) charts.levels.delete(system);
  }
  // A busy resource not charted yet, while there is room: fetch its history.
  const busy = tick.resources.some(([name]) => !charts.resources.has(name)) && charts.resources.size < 6 + pinned.size;
  const newBreaker = tick.breakers.some((b) => !charts.breakers.has(b.resource)) && charts.breakers.size < 6;
  if (busy || newBreaker) wantSeries();
  if (snap && changed.size) updateBreakers(changed.values());
  drawCharts();
}

function applyEvent(e) {
  switch (e.kind) {
    case "tick":
      applyTick(e);
      return;
    case "resync":
      scheduleLoad();
      return;
    case "breaker": {
      if (snap) {
        const b = { resource: e.resource, state: e.to };
        if (e.to === "OPEN" || e.to === "FORCED_OPEN") b.opened_at = e.at;
        if (e.to === "CLOSED") { b.opened_at = null; b.next_probe_at = null; }
        updateBreakers([b]);
      }
      const c = charts.breakers.get(e.resource);
      if (c) c.transitions.push({ t: Math.floor(new Date(e.at).getTime() / 1000), from: e.from, to: e.to });
      else wantSeries();
      drawCharts();
      break;
    }
    case "degradation":
      if (snap) {
        const scope = e.system ? snap.systems.find((s) => s.system === e.system) : snap.level;
        if (scope) {
          scope.level = e.to;
          scope.manual = e.manual;
          if (e.reason !== undefined) scope.reason = e.reason;
        }
        renderOverview();
        renderSystems();
      }
      break;
    default:
      // Rules and overrides change what the page lists: read it again.
      scheduleLoad();
  }
  if (snap) {
    snap.timeline.push(e);
    if (snap.timeline.length > 200) snap.timeline.shift();
    $("timeline").prepend(el("li", line(e)));
    while ($("timeline").children.length > 200) $("timeline").lastChild.remove();
  }
}

function render() {
  renderOverview();
  renderSystems();
  renderBreakers();
  renderResources();
  renderConcurrency(snap.concurrency || []);
  const tl = $("timeline");
  tl.replaceChildren();
  for (const e of snap.timeline.slice().reverse()) tl.append(el("li", line(e)));
}

// Rules that a source offered and the server refused: a banner until rules
// from that source are installed again.
function renderRefused() {
  const box = $("rules-refused");
  const refused = snap.rules_refused || [];
  box.replaceChildren();
  box.hidden = refused.length === 0;
  for (const r of refused) {
    const item = el("div");
    item.append(el("b", "Rules refused"), " from " + r.source + " at " + new Date(r.at).toLocaleTimeString() +
      ": the rules in force keep deciding until a valid version is installed.", el("pre", r.error));
    box.append(item);
  }
}

function renderOverview() {
  const s = snap;
  renderRefused();
  $("rules-version").textContent = "rules v" + s.rules.version;
  $("rules-source").textContent = s.rules.source + " (" + count(s.rules.pattern_count) + (s.rules.pattern_count === 1 ? " pattern" : " patterns") + ", loaded " + when(s.rules.loaded_at) + ")";
  renderEarlier(s.rules.earlier || []);
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
    ? "Redis " + (rep.redis_up ? "up" : "DOWN") + ", " + rep.live_replicas + " live replicas" +
      (rep.rules_differ && rep.rules_differ.length
        ? "; WARNING: " + rep.rules_differ.length + " decide by other rules (" + rep.rules_differ.join(", ") + ")"
        : "")
    : "memory only (one replica)";
  $("overrides").textContent = s.overrides;
}

// The rules files kept from before, each with a button that puts it back
// (the server asks for an admin token).
function renderEarlier(earlier) {
  const list = $("rules-earlier");
  list.replaceChildren();
  if (earlier.length === 0) list.append(el("li", "none kept"));
  for (const e of earlier) {
    const item = el("li");
    item.dataset.version = e.version;
    const button = el("button", "Revert to v" + e.version);
    button.type = "button";
    button.addEventListener("click", () => revertRules(e.version));
    item.append("v" + e.version + " from " + e.source + " (" + count(e.pattern_count) +
      (e.pattern_count === 1 ? " pattern" : " patterns") + ", replaced " + when(e.replaced_at) + ") ", button);
    list.append(item);
  }
}

async function revertRules(version) {
  const { ok, status, answer } = await post("/api/v1/rules/revert", { to_version: version });
  if (ok) say("Rules of v" + answer.reverted_to + " put back: v" + answer.version + " in force", "ok");
  else say("Refused (" + status + "): " + (answer.error || ""), "error");
}

function renderSystems() {
  const s = snap;
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
  if (s.systems.length === 0) systems.append(emptyRow("the rules name no system", 5));
}

function emptyRow(text, columns) {
  const tr = el("tr");
  const td = el("td", text, "muted");
  td.colSpan = columns;
  tr.append(td);
  return tr;
}

// The rows of one page of a list, after the filter; the pager says where.
function paged(list, name, key, which) {
  const filter = $(which + "-filter").value.trim().toLowerCase();
  const shown = filter ? list.filter((x) => name(x).toLowerCase().includes(filter)) : list;
  const pageCount = Math.max(1, Math.ceil(shown.length / PAGE));
  pages[key] = Math.min(pages[key], pageCount - 1);
  const from = pages[key] * PAGE;
  const rows = shown.slice(from, from + PAGE);
  $(which + "-count").textContent = shown.length
    ? count(from + 1) + "-" + count(from + rows.length) + " of " + count(shown.length) + (filter ? " matching (" + count(list.length) + " in all)" : "")
    : (filter ? "none matches (" + count(list.length) + " in all)" : "");
  $(which + "-prev").disabled = pages[key] === 0;
  $(which + "-next").disabled = pages[key] >= pageCount - 1;
  return rows;
}

function renderBreakers() {
  const tbody = document.querySelector("#breakers tbody");
  tbody.replaceChildren();
  const list = snap.breakers.slice().sort((a, b) => (a.resource < b.resource ? -1 : a.resource > b.resource ? 1 : 0));
  for (const b of paged(list, (b) => b.resource, "breakers", "breaker")) {
    const tr = el("tr");
    tr.dataset.resource = b.resource;
    for (let i = 0; i < 6; i++) tr.append(el("td"));
    fillBreaker(tr, b);
    const cell = el("td");
    const actions = el("div", null, "actions");
    for (const [label, to] of [["Reset", "CLOSED"], ["Force open", "FORCED_OPEN"], ["Disable", "DISABLED"]]) {
      const button = el("button", label);
      button.type = "button";
      button.dataset.action = to;
      button.addEventListener("click", () => setBreaker(b.resource, to));
      actions.append(button);
    }
    cell.append(actions);
    tr.append(cell);
    tbody.append(tr);
  }
  if (snap.breakers.length === 0) tbody.append(emptyRow("no breaker has been used yet", 7));
}

function fillBreaker(tr, b) {
  const cells = tr.children;
  cells[0].textContent = b.resource;
  cells[1].textContent = b.state;
  cells[1].className = "state state-" + b.state;
  cells[2].textContent = count(b.calls);
  cells[3].textContent = pct(b.failure_rate) + " / " + pct(b.slow_call_rate);
  cells[4].textContent = count(b.not_permitted);
  cells[5].textContent = when(b.opened_at) + " / " + when(b.next_probe_at);
}

// Breakers changed: their rows change in place (a button being clicked is
// not replaced); a breaker the page did not list redraws the table.
function updateBreakers(changed) {
  let redraw = false;
  for (const c of changed) {
    let b = snap.breakers.find((x) => x.resource === c.resource);
    if (!b) {
      b = { resource: c.resource, state: "CLOSED", calls: 0, failure_rate: 0, slow_call_rate: 0, not_permitted: 0, opened_at: null, next_probe_at: null };
      snap.breakers.push(b);
      redraw = true;
    }
    Object.assign(b, c);
    const tr = [...document.querySelectorAll("#breakers tbody tr")].find((r) => r.dataset.resource === b.resource);
    if (tr) fillBreaker(tr, b);
  }
  if (redraw) renderBreakers();
}

function renderResources() {
  const resources = $("resources");
  resources.replaceChildren();
  const listed = snap.resources_listed;
  const filter = $("resource-filter").value.trim();
  const shown = snap.resources.length;
  $("resource-count").textContent = shown
    ? count(listed.offset + 1) + "-" + count(listed.offset + shown) + " of " + count(listed.matching) + (filter ? " matching (" + count(listed.total) + " in all)" : "")
    : (filter ? "none matches (" + count(listed.total) + " in all)" : "");
  $("resource-prev").disabled = listed.offset === 0;
  $("resource-next").disabled = listed.offset + shown >= listed.matching;
  if (!shown && listed.offset > 0 && listed.matching > 0) {
    // Past the end (the rules changed): the last page.
    pages.resources = Math.floor((listed.matching - 1) / PAGE);
    scheduleLoad();
  }
  const top = listed.total ? null : "no rules";
  for (const r of snap.resources) {
    const box = el("div");
    box.dataset.rule = r.rule;
    const extras = [];
    if (r.breaker) extras.push("breaker");
    if (r.adaptive) extras.push("adaptive concurrency limit (" + r.adaptive + "), at most " + r.concurrency + " in flight");
    else if (r.concurrency) extras.push("at most " + r.concurrency + " in flight");
    if (r.shed_at_level) extras.push("shed at level " + r.shed_at_level);
    if (r.overrides) extras.push(r.overrides + " overrides");
    const title = el("h3", r.rule + (extras.length ? "  (" + extras.join(", ") + ")" : "") + " ");
    const pin = el("button", pinned.has(r.rule) ? "Charted" : "Chart", "chart-pin");
    pin.type = "button";
    pin.setAttribute("aria-pressed", String(pinned.has(r.rule)));
    pin.addEventListener("click", () => {
      if (pinned.has(r.rule)) pinned.delete(r.rule); else pinned.add(r.rule);
      renderResources();
      loadSeries();
    });
    title.append(pin);
    box.append(title);
    const t = el("table");
    for (const l of r.limits) {
      const tr = el("tr");
      tr.append(el("td", l.name + (l.shadow ? " (shadow)" : "")), el("td", l.algorithm, "muted"),
        el("td", l.key.length ? "per " + l.key.join(", ") : "global"));
      const use = el("td");
      if (l.history) {
        // A limit whose traffic the server records: a proposal from it.
        const propose = el("button", "Propose a limit", "propose");
        propose.type = "button";
        propose.addEventListener("click", () => showProposal(r.rule, l.name));
        use.append(propose);
      }
      if (l.global && l.global.remaining === null) {
        // A limit Redis decides, not asked through this replica yet.
        use.append(el("span", "decided by Redis; not asked through this replica yet", "muted"));
      } else if (l.global) {
        const m = el("meter");
        m.max = l.global.limit;
        m.value = l.global.limit - l.global.remaining;
        use.append(m, el("span", " " + (l.global.limit - l.global.remaining) + " / " + l.global.limit + " used"));
        if (l.global.from_redis) {
          use.append(el("span", " (as Redis said at this replica's last call)", "muted"));
        }
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
  if (top) resources.append(el("p", top, "muted"));
}

function renderConcurrency(list) {
  const tbody = document.querySelector("#concurrency tbody");
  tbody.replaceChildren();
  const box = $("concurrency-charts");
  box.replaceChildren();
  for (const c of list) {
    const tr = el("tr");
    tr.dataset.resource = c.resource;
    const ms = (x) => (x ? x + " ms" : "-");
    let latency = c.algorithm ? [c.short_rtt_ms, c.long_rtt_ms, c.no_load_rtt_ms].map(ms).join(" / ") : "";
    if (c.algorithm && c.min_rtt_ms) latency += ", measured " + ms(c.min_rtt_ms);
    if (c.probing) latency += " (measuring at the floor)";
    const parts = c.partitions.map((p) => p.priority + " " + p.in_flight + "/" + p.guaranteed + " (" + p.percent + "%)").join(", ");
    tr.append(el("td", c.resource), el("td", c.algorithm || "static"), el("td", c.limit, "limit"),
      el("td", c.in_flight), el("td", latency), el("td", parts));
    tbody.append(tr);
    if (c.windows.length > 1) box.append(concurrencyChart(c));
  }
  if (list.length === 0) tbody.append(emptyRow("no concurrency limit has been used yet", 6));
}

// A chart: lines of values scaled to `top`, in a box that stretches to its
// card. `shade` marks seconds (an open breaker), `marks` seconds with a label.
function chart(lines, top, opts) {
  const w = 600, h = 100;
  const n = Math.max(2, ...lines.map((l) => l.values.length));
  const s = svg("svg", { viewBox: "0 0 " + w + " " + h, preserveAspectRatio: "none", role: "img" });
  const x = (i) => (i / (n - 1)) * w;
  const y = (v) => h - 1 - (Math.min(v, top) / top) * (h - 2);
  if (opts && opts.shade) {
    let start = -1;
    for (let i = 0; i <= n; i++) {
      const on = i < n && opts.shade(i);
      if (on && start < 0) start = i;
      if (!on && start >= 0) {
        s.append(svg("rect", { class: "open", x: x(start).toFixed(1), y: 0, width: Math.max(1, x(i) - x(start)).toFixed(1), height: h }));
        start = -1;
      }
    }
  }
  for (const l of lines) {
    const off = n - l.values.length;
    const points = l.values.map((v, i) => x(i + off).toFixed(1) + "," + y(v || 0).toFixed(1)).join(" ");
    s.append(svg("polyline", { class: l.cls, "data-series": l.name, points }));
  }
  for (const m of (opts && opts.marks) || []) {
    const mark = svg("line", { class: "mark", x1: x(m.i).toFixed(1), x2: x(m.i).toFixed(1), y1: 0, y2: h, "data-transition": m.label });
    mark.append(svg("title"));
    mark.firstChild.textContent = m.label;
    s.append(mark);
  }
  return s;
}

function figure(cls, attrs, svgElement, caption) {
  const f = el("figure", null, cls);
  for (const [k, v] of Object.entries(attrs)) f.dataset[k] = v;
  f.append(svgElement, caption);
  return f;
}

// How many seconds the charts span: since the server started sampling, at
// least a minute, at most the 15 minutes kept.
function span() {
  return Math.max(60, Math.min(SECONDS, charts.t - (charts.started || charts.t) + 1));
}

function drawCharts() {
  const last = span();
  const recent = (list) => list.slice(-last);
  const traffic = $("traffic-charts");
  traffic.replaceChildren();
  const shown = [...charts.resources.entries()];
  if (charts.other && charts.other.admitted.some((v, i) => v || charts.other.denied[i])) shown.push(["other", charts.other]);
  for (const [name, s] of shown) {
    const admitted = recent(s.admitted), denied = recent(s.denied);
    const top = Math.max(1, ...admitted, ...denied);
    const a = admitted[admitted.length - 1] || 0, d = denied[denied.length - 1] || 0;
    const caption = el("figcaption");
    const other = name === "other" && s === charts.other;
    caption.append(el("b", other ? "other (resources past the " + count(charts.tracked || 0) + " with a series of their own)" : name),
      el("span", "  now " + count(a) + "/s admitted, " + count(d) + "/s denied; scale 0-" + count(top) + "/s"));
    const f = figure("traffic", { resource: name, admitted: a, denied: d }, chart([
      { name: "admitted", cls: "admitted", values: admitted },
      { name: "denied", cls: "denied", values: denied },
    ], top), caption);
    f.querySelector("svg").setAttribute("aria-label", "decisions per second of " + name);
    traffic.append(f);
  }
  $("traffic-note").textContent = (shown.length ? "" : "no decisions lately; ") + "the last " + (last < SECONDS ? last + " seconds (since the server started)" : "15 minutes");

  const breakers = $("breaker-charts");
  breakers.replaceChildren();
  for (const [name, all] of charts.breakers) {
    const b = { failure_rate: recent(all.failure_rate), slow_call_rate: recent(all.slow_call_rate), state: recent(all.state), transitions: all.transitions };
    const n = b.failure_rate.length;
    const start = charts.t - n + 1;
    const marks = b.transitions
      .filter((t) => t.t >= start)
      .map((t) => ({ i: Math.min(n - 1, t.t - start), label: t.from + "->" + t.to }));
    const open = (i) => b.state[i] === "OPEN" || b.state[i] === "FORCED_OPEN";
    const state = b.state[n - 1] || "-";
    const caption = el("figcaption");
    caption.append(el("b", name), el("span", "  " + state + ", failing " + pct(b.failure_rate[n - 1] || 0) +
      ", slow " + pct(b.slow_call_rate[n - 1] || 0) + (marks.length ? "; " + marks.length + " transitions" : "")));
    const f = figure("breaker", { breaker: name, state }, chart([
      { name: "failure_rate", cls: "failure", values: b.failure_rate },
      { name: "slow_call_rate", cls: "slow", values: b.slow_call_rate },
    ], 1, { shade: open, marks }), caption);
    f.querySelector("svg").setAttribute("aria-label", "failure and slow-call rates of " + name);
    breakers.append(f);
  }

  const levels = $("level-charts");
  levels.replaceChildren();
  for (const [system, all] of charts.levels) {
    const values = recent(all);
    const caption = el("figcaption");
    caption.append(el("b", "level of " + (system || "global")), el("span", "  now " + values[values.length - 1] + " (0-3)"));
    levels.append(figure("level", { system }, chart([{ name: "level", cls: "level", values }], 3), caption));
  }
}

// The limit, the most in flight and the mean latency of each window.
function concurrencyChart(c) {
  const top = Math.max(1, ...c.windows.map((p) => Math.max(p.limit, p.max_in_flight)));
  const slowest = Math.max(1, ...c.windows.map((p) => p.mean_rtt_ms || 0));
  const s = chart([
    { name: "limit", cls: "failure", values: c.windows.map((p) => p.limit / top) },
    { name: "in flight", cls: "admitted", values: c.windows.map((p) => p.max_in_flight / top) },
    { name: "latency", cls: "slow", values: c.windows.map((p) => (p.mean_rtt_ms || 0) / slowest) },
  ], 1);
  s.setAttribute("aria-label", "limit, in flight and latency of " + c.resource);
  return figure("concurrency", { resource: c.resource }, s, el("figcaption", c.resource + ": limit (red) and in flight (green), 0 to " + top +
    "; mean latency (purple), 0 to " + slowest + " ms; the last " + c.windows.length + " windows"));
}

function line(e) {
  const t = new Date(e.at).toLocaleTimeString();
  switch (e.kind) {
    case "breaker": return t + "  breaker " + e.resource + ": " + e.from + " -> " + e.to + " (" + e.reason + ")";
    case "degradation": return t + "  level of " + (e.system || "global") + " " + e.from + " -> " + e.to + (e.manual ? " (manual)" : "") + (e.reason ? ": " + e.reason : "");
    case "rules": return t + "  rules v" + e.version + " from " + e.source;
    case "rules_refused": return t + "  rules from " + e.source + " refused: " + e.error.split("\n").slice(0, 2).join(" ");
    case "overrides": return t + "  overrides: " + e.set + " set, " + e.deleted + " deleted, " + e.expired + " expired";
    default: return t + "  " + e.kind;
  }
}

async function post(path, body) {
  const r = await fetch(path, { method: "POST", headers: headers({ "Content-Type": "application/json" }), body: JSON.stringify(body) });
  const answer = await r.json().catch(() => ({}));
  return { ok: r.ok, status: r.status, answer };
}

// A proposal for a limit with history, made by the server from what it
// recorded, and what it would have denied; with buttons that try it in
// shadow for ten minutes or put it in force (an admin token is needed).
async function showProposal(resource, limit) {
  const box = $("proposal");
  box.hidden = false;
  const q = new URLSearchParams({ resource, limit });
  const r = await fetch("/api/v1/propose?" + q, { headers: headers(), cache: "no-store" });
  const p = await r.json().catch(() => ({}));
  const body = $("proposal-body");
  body.replaceChildren();
  $("proposal-title").textContent = "Proposal for " + resource + "/" + limit;
  if (!r.ok) {
    body.append(el("p", "No proposal (" + r.status + "): " + (p.error || ""), "error"));
    return;
  }
  const day = (s) => new Date(s * 1000).toISOString().slice(0, 10);
  const list = el("dl");
  const row = (name, value) => list.append(el("dt", name), el("dd", value));
  row("Limit", p.current + " -> " + p.per_minute + " calls a minute (" + p.algorithm + ")" +
    (p.observed !== p.per_minute ? "; observed figure " + p.observed + ", held by the guard rail (at most " +
      Math.round(p.settings.max_decrease * 100) + "% down at once)" : ""));
  row("From", p.keys + " keys, " + day(p.from) + " to " + day(p.to - 1) +
    (p.shared ? " (every replica's calls, from Redis)" : " (this replica's own record)"));
  row("Settings", "quantile " + p.settings.quantile + ", headroom " + p.settings.headroom);
  row("Replay", p.replayed_denied + " of " + p.replayed_calls + " calls denied (each key's busiest minute of each day)");
  body.append(list);
  if (p.overrides.length) {
    const t = el("table");
    t.append(el("caption", "Overrides for heavier keys"));
    for (const o of p.overrides) {
      const tr = el("tr");
      tr.append(el("td", o.key), el("td", o.per_minute + " a minute"));
      t.append(tr);
    }
    body.append(t);
  }
  if (p.kept.length) body.append(el("p", "Left to the overrides the rules have: " + p.kept.join(", "), "muted"));
  if (p.most_denied.length) {
    const t = el("table");
    t.append(el("caption", "Keys the proposal would deny most"));
    for (const k of p.most_denied) {
      const tr = el("tr");
      tr.append(el("td", k.key), el("td", k.denied + " of " + k.calls + " denied at " + k.per_minute + " a minute"));
      t.append(tr);
    }
    body.append(t);
  }
  const shadow = el("button", "Try in shadow for 10 minutes");
  shadow.type = "button";
  shadow.addEventListener("click", () => applyProposal(resource, limit, p, 600));
  const enforce = el("button", "Apply");
  enforce.type = "button";
  enforce.addEventListener("click", () => applyProposal(resource, limit, p, null));
  body.append(el("p", "", "controls"));
  body.lastChild.append(shadow, " ", enforce);
}

async function applyProposal(resource, limit, p, whatIfSeconds) {
  const ask = { resource, limit, fingerprint: p.fingerprint };
  if (whatIfSeconds) ask.what_if_seconds = whatIfSeconds;
  const { ok, status, answer } = await post("/api/v1/propose/apply", ask);
  const perMinute = p.per_minute;
  if (!ok) say("Refused (" + status + "): " + (answer.error || ""), "error");
  else if (whatIfSeconds) say("Proposal of " + perMinute + " a minute runs in shadow, ending " + when(answer.what_if_until * 1000), "ok");
  else say("Proposal of " + perMinute + " a minute in force: rules v" + answer.version + " (revert it under Earlier rules)", "ok");
}

async function setBreaker(resource, to) {
  const { ok, status, answer } = await post("/api/v1/breakers/" + encodeURIComponent(resource) + "/state", { state: to });
  if (ok) say("Breaker " + answer.resource + " is " + answer.state, "ok");
  else say("Refused (" + status + "): " + (answer.error || ""), "error");
}

async function setLevel() {
  const v = $("level-choice").value;
  const system = $("level-system").value;
  const body = v === "auto" ? { automatic: true, system } : { level: Number(v), system };
  const { ok, status, answer } = await post("/api/v1/level", body);
  const of = system ? "of " + system + " " : "";
  if (ok) say("Degradation level " + of + answer.level + (answer.manual ? " (manual)" : " (automatic)"), "ok");
  else say("Refused (" + status + "): " + (answer.error || ""), "error");
}

// Server-sent events, read with fetch so that the token goes in a header.
// Once connected the page reads the state and series afresh (events may
// have been missed while it was away), then applies each event.
// The stream in use, and what wakes the wait before the next attempt.
let stream = null;
let wake = null;

async function follow() {
  for (;;) {
    stream = new AbortController();
    try {
      const r = await fetch("/api/v1/events", { headers: headers(), cache: "no-store", signal: stream.signal });
      if (!r.ok || !r.body) {
        const body = await r.json().catch(() => ({}));
        say((r.status === 401 ? "A token is needed: " : "Refused: ") + (body.error || r.status), "error");
        throw new Error("HTTP " + r.status);
      }
      $("live").textContent = "live";
      $("live").className = "pill on";
      scheduleLoad();
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
          if (!chunk.startsWith("data: ")) continue;
          let event;
          try { event = JSON.parse(chunk.slice(6)); } catch (e) { continue; }
          applyEvent(event);
        }
      }
    } catch (e) {
      // Reconnect below.
    }
    $("live").textContent = "reconnecting";
    $("live").className = "pill off";
    await new Promise((resolve) => { wake = resolve; setTimeout(resolve, 1000); });
    wake = null;
  }
}

// Follows again at once (a new token).
function reconnect() {
  if (stream) stream.abort();
  if (wake) wake();
}

function pager(which, key, render) {
  $(which + "-filter").addEventListener("input", () => { pages[key] = 0; if (snap) render(); });
  $(which + "-prev").addEventListener("click", () => { pages[key] = Math.max(0, pages[key] - 1); if (snap) render(); });
  $(which + "-next").addEventListener("click", () => { pages[key] += 1; if (snap) render(); });
}

$("auth").addEventListener("submit", (ev) => {
  ev.preventDefault();
  token = $("token").value.trim();
  sessionStorage.setItem("floodgate-token", token);
  $("token").value = "";
  say(token ? "Token set for this tab." : "Token cleared.", "ok");
  reconnect();
});
$("level-set").addEventListener("click", setLevel);
// The resources' pager asks the server for the page (the filter once typing pauses).
let filtering = null;
$("resource-filter").addEventListener("input", () => {
  pages.resources = 0;
  clearTimeout(filtering);
  filtering = setTimeout(scheduleLoad, 150);
});
$("resource-prev").addEventListener("click", () => { pages.resources = Math.max(0, pages.resources - 1); scheduleLoad(); });
$("resource-next").addEventListener("click", () => { pages.resources += 1; scheduleLoad(); });
pager("breaker", "breakers", renderBreakers);

// Connecting reads the state (and says when a token is needed).
// What no event carries (global limits' use, hottest keys, concurrency
// windows) is read again every 10 s.
setInterval(() => { if (!refreshing && !loading) load().catch(() => {}); }, 10000);
follow();
