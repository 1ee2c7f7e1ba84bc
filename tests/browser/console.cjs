// Drives Floodgate's console in a real Chromium (playwright-core), for
// tests/e2e/console.rs: prints one word per step on stdout, and waits for a
// line on stdin where the Rust side checks the server in between.
//
//   node console.cjs URL READ_TOKEN ADMIN_TOKEN SCREENSHOT
"use strict";

const { chromium } = require("playwright-core");
const readline = require("readline");

const [url, readToken, adminToken, screenshot] = process.argv.slice(2);
const lines = readline.createInterface({ input: process.stdin });
const nextLine = () => new Promise((resolve) => lines.once("line", resolve));
const step = (word) => console.log(word);

(async () => {
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
  });
  try {
    const page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
    const errors = [];
    page.on("pageerror", (e) => errors.push(String(e)));
    page.on("console", (m) => { if (m.type() === "error" && !/status of 40[13]/.test(m.text())) errors.push(m.text()); });
    await page.goto(url);
    await page.locator("#message", { hasText: "A token is needed" }).waitFor({ timeout: 20000 });
    step("NEEDS_TOKEN");

    const use = async (token) => {
      await page.fill("#token", token);
      await page.click("#auth button");
    };
    await use(readToken);
    const state = page.locator('#breakers tr[data-resource="payments"] td.state');
    await state.filter({ hasText: /^CLOSED$/ }).waitFor({ timeout: 20000 });
    await page.locator("#live", { hasText: "live" }).waitFor({ timeout: 20000 });
    step("READY");

    // The adaptive limit's row and its chart of windows.
    await page.locator('#concurrency tr[data-resource="db"]', { hasText: "aimd" }).waitFor({ timeout: 20000 });
    const limitLine = page.locator('#concurrency-charts figure[data-resource="db"] polyline[data-series="limit"]');
    await limitLine.waitFor({ timeout: 20000 });
    const points = (await limitLine.getAttribute("points")).trim().split(" ").length;
    if (points < 2) throw new Error("the chart has " + points + " points");
    step("SAW_CONCURRENCY");

    // The Rust side reports failures now: the page must see OPEN by itself.
    await state.filter({ hasText: /^OPEN$/ }).waitFor({ timeout: 30000 });
    await page.locator("#timeline li", { hasText: "breaker payments: CLOSED -> OPEN" }).waitFor({ timeout: 10000 });
    step("SAW_OPEN");

    // A read token may look, not act.
    await page.click('#breakers tr[data-resource="payments"] button[data-action="CLOSED"]');
    await page.locator("#message", { hasText: "Refused (403)" }).waitFor({ timeout: 10000 });
    step("REFUSED");
    await nextLine();

    await use(adminToken);
    // The page redraws the table once the new token is read: a click that
    // lands on the row being replaced is lost, so click until it takes (on a
    // busy machine the redraw can come after the first click).
    const done = page.locator("#message", { hasText: "Breaker payments is CLOSED" });
    for (let attempt = 0; ; attempt++) {
      await page.click('#breakers tr[data-resource="payments"] button[data-action="CLOSED"]');
      try {
        await done.waitFor({ timeout: 10000 });
        break;
      } catch (e) {
        if (attempt >= 2) throw e;
      }
    }
    await state.filter({ hasText: /^CLOSED$/ }).waitFor({ timeout: 10000 });
    step("RESET");

    // The Rust side writes a rules file the server refuses: a banner and a
    // timeline entry say so, and the banner stays until a good file.
    await nextLine();
    await page.locator("#rules-refused", { hasText: "Rules refused" }).waitFor({ state: "visible", timeout: 20000 });
    await page.locator("#timeline li", { hasText: "refused" }).waitFor({ timeout: 10000 });
    step("SAW_REFUSED");
    await nextLine();
    await page.locator("#rules-refused").waitFor({ state: "hidden", timeout: 20000 });
    step("BANNER_GONE");

    // The Rust side applies other rules: the ones they replaced are listed,
    // and one click (with the admin token) puts them back.
    await nextLine();
    const earlier = page.locator("#rules-earlier li[data-version] button").first();
    await earlier.waitFor({ timeout: 20000 });
    const reverted = page.locator("#message", { hasText: "put back" });
    for (let attempt = 0; ; attempt++) {
      await page.locator("#rules-earlier li[data-version] button").first().click();
      try {
        await reverted.waitFor({ timeout: 10000 });
        break;
      } catch (e) {
        if (attempt >= 2) throw e;
      }
    }
    await page.locator("#timeline li", { hasText: "from admin" }).first().waitFor({ timeout: 10000 });
    step("REVERTED");

    // The Rust side sends calls to a limit with history: its proposal, then
    // a shadow run of it (with the admin token).
    await nextLine();
    const shown = page.locator("#proposal-body dd", { hasText: " -> " });
    for (let attempt = 0; ; attempt++) {
      await page.locator("#resources button.propose").first().click();
      try {
        await shown.first().waitFor({ timeout: 10000 });
        break;
      } catch (e) {
        if (attempt >= 2) throw e;
      }
    }
    await page.locator("#proposal-body dd", { hasText: "3 keys" }).waitFor({ timeout: 10000 });
    step("PROPOSED");
    await page.locator("#proposal-body button", { hasText: "Try in shadow" }).click();
    await page.locator("#message", { hasText: "runs in shadow" }).waitFor({ timeout: 10000 });
    step("SHADOWED");

    await page.screenshot({ path: screenshot, fullPage: true });
    if (errors.length) throw new Error("errors in the page: " + errors.join("; "));
    step("DONE");
  } finally {
    await browser.close();
    lines.close();
  }
})().catch((e) => {
  console.error(e && e.stack ? e.stack : String(e));
  process.exit(1);
});
