// Drives Floodgate's console charts in a real Chromium (playwright-core),
// for tests/e2e/console.rs. One word (and a figure) per step on stdout;
// waits for a line on stdin where the Rust side acts in between.
//
//   node console_charts.cjs charts URL TOKEN SHOTS_DIR
//   node console_charts.cjs many URL TOKEN
"use strict";

const { chromium } = require("playwright-core");
const readline = require("readline");

const [mode, url, token, shots] = process.argv.slice(2);
const lines = readline.createInterface({ input: process.stdin });
const queued = [];
let waiting = null;
lines.on("line", (l) => (waiting ? (waiting(l), (waiting = null)) : queued.push(l)));
const nextLine = () => (queued.length ? Promise.resolve(queued.shift()) : new Promise((resolve) => (waiting = resolve)));
const step = (...words) => console.log(words.join(" "));

// Waits until `f` (run in the page) is true; how long it took, in ms.
async function until(page, f, arg, timeout) {
  const t0 = Date.now();
  await page.waitForFunction(f, arg, { timeout, polling: 50 });
  return Date.now() - t0;
}

// Every card's content fits it, and the page fits the window.
async function fits(page) {
  return page.evaluate(() => {
    const over = [];
    for (const s of document.querySelectorAll("section")) {
      if (s.scrollWidth > s.clientWidth) over.push((s.id || s.querySelector("h2").textContent) + " " + s.scrollWidth + ">" + s.clientWidth);
    }
    const d = document.documentElement;
    if (d.scrollWidth > d.clientWidth) over.push("the page " + d.scrollWidth + ">" + d.clientWidth);
    return over;
  });
}

async function login(page) {
  await page.goto(url);
  await page.fill("#token", token);
  await page.click("#auth button");
}

async function charts(page) {
  await login(page);
  await page.locator("#live", { hasText: "live" }).waitFor({ timeout: 20000 });
  await page.locator('#breakers tr[data-resource="payments"]').waitFor({ timeout: 20000 });
  step("READY");

  // The Rust side sends a burst to "burst" from now on.
  await nextLine();
  const rose = await until(page, () => {
    const f = document.querySelector('#traffic-charts figure[data-resource="burst"]');
    return f && Number(f.dataset.admitted) > 0 && Number(f.dataset.denied) > 0;
  }, null, 20000);
  const points = await page.locator('#traffic-charts figure[data-resource="burst"] polyline[data-series="denied"]').getAttribute("points");
  // At least the last minute, a value a second.
  const drawn = points.trim().split(" ").length;
  if (drawn < 60) throw new Error("the denied series has " + drawn + " points");
  step("ROSE", rose);

  // The burst has stopped: both fall back to nothing.
  await nextLine();
  const fell = await until(page, () => {
    const f = document.querySelector('#traffic-charts figure[data-resource="burst"]');
    return f && Number(f.dataset.admitted) === 0 && Number(f.dataset.denied) === 0;
  }, null, 20000);
  step("FELL", fell);

  // The Rust side opens payments' breaker by reporting failures.
  await nextLine();
  await page.locator('#breaker-charts figure[data-breaker="payments"] line[data-transition="CLOSED->OPEN"]').waitFor({ state: "attached", timeout: 20000 });
  await page.locator('#breaker-charts figure[data-breaker="payments"] rect.open').waitFor({ state: "attached", timeout: 20000 });
  const row = page.locator('#breakers tr[data-resource="payments"] td.state');
  await row.filter({ hasText: /^OPEN$/ }).waitFor({ timeout: 10000 });
  // The level chart is there, for the global scope and the system.
  await page.locator('#level-charts figure[data-system="shop"] polyline').waitFor({ state: "attached", timeout: 10000 });
  step("MARKED");

  for (const width of [1280, 800]) {
    await page.setViewportSize({ width, height: 900 });
    await page.waitForTimeout(400);
    const over = await fits(page);
    if (over.length) throw new Error("overflow at " + width + " px: " + over.join("; "));
    await page.screenshot({ path: shots + "/console-" + width + ".png", fullPage: true });
    step("FITS", width);
  }
}

async function many(page) {
  await page.goto(url);
  await page.locator("#message", { hasText: "A token is needed" }).waitFor({ timeout: 20000 });
  // From the token to the first page of each list: the state read and drawn.
  const t0 = Date.now();
  await page.fill("#token", token);
  await page.click("#auth button");
  await page.locator("#resource-count", { hasText: "of 5,000" }).waitFor({ timeout: 20000 });
  await page.locator("#breaker-count", { hasText: "of 1,000" }).waitFor({ timeout: 20000 });
  const rendered = Date.now() - t0;
  const rows = await page.locator("#resources > div[data-rule]").count();
  const breakerRows = await page.locator("#breakers tbody tr[data-resource]").count();
  if (rows !== 25 || breakerRows !== 25) throw new Error("a page shows " + rows + " resources and " + breakerRows + " breakers");
  step("RENDERED", rendered);

  // The tab answers at once (no long task holds it) while ticks arrive.
  const answer = await page.evaluate(async () => {
    let worst = 0;
    for (let i = 0; i < 20; i++) {
      const t = performance.now();
      await new Promise((r) => setTimeout(r, 50));
      worst = Math.max(worst, performance.now() - t - 50);
    }
    return Math.round(worst);
  });
  step("RESPONSIVE", answer);

  // The filter finds one among 5,000; the pager moves.
  const t1 = Date.now();
  await page.fill("#resource-filter", "r4321");
  await page.locator('#resources > div[data-rule="r4321"]').waitFor({ timeout: 5000 });
  const filtered = await page.locator("#resources > div[data-rule]").count();
  if (filtered !== 1) throw new Error("the filter shows " + filtered);
  step("FILTERED", Date.now() - t1);
  await page.fill("#resource-filter", "");
  await page.click("#resource-next");
  await page.locator("#resource-count", { hasText: "26-50 of 5,000" }).waitFor({ timeout: 5000 });
  await page.fill("#breaker-filter", "r0999");
  await page.locator('#breakers tbody tr[data-resource="r0999"]').waitFor({ timeout: 5000 });
  step("PAGED");
  const over = await fits(page);
  if (over.length) throw new Error("overflow: " + over.join("; "));
  step("DONE");
}

(async () => {
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
  });
  try {
    const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
    const errors = [];
    page.on("pageerror", (e) => errors.push(String(e)));
    page.on("console", (m) => { if (m.type() === "error" && !/status of 401/.test(m.text())) errors.push(m.text()); });
    if (mode === "charts") await charts(page);
    else await many(page);
    if (errors.length) throw new Error("errors in the page: " + errors.join("; "));
    step("END");
  } finally {
    await browser.close();
    lines.close();
  }
})().catch((e) => {
  console.error(e && e.stack ? e.stack : String(e));
  process.exit(1);
});
