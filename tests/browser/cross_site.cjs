// Another site's page against Floodgate's console in a real Chromium
// (playwright-core), for tests/e2e/console.rs. The server runs without a
// token file (loopback is the credential) and with `--http-host
// floodgate.test`; Chromium resolves floodgate.test and evil.test to
// 127.0.0.1, as a DNS rebinding attacker would make it.
//
//   node cross_site.cjs CONSOLE_PORT
//
// Prints one line per step; waits for a line on stdin after ATTACKED, while
// the Rust side checks that nothing changed.
"use strict";

const http = require("http");
const { chromium } = require("playwright-core");
const readline = require("readline");

const [port] = process.argv.slice(2);
const lines = readline.createInterface({ input: process.stdin });
const nextLine = () => new Promise((resolve) => lines.once("line", resolve));
const step = (line) => console.log(line);

// What evil.test serves: a no-cors fetch, a CORS fetch that needs a
// preflight, and a text/plain form, all aimed at the console's actions.
const target = `http://127.0.0.1:${port}`;
const evilPage = `<!doctype html><html><body>
<iframe name="sink" id="sink"></iframe>
<form id="f" method="POST" enctype="text/plain" target="sink"
      action="${target}/api/v1/breakers/payments/state">
  <input name='{"state":"DISABLED","x":"' value='"}'>
</form>
<script>
window.attack = async () => {
  const results = [];
  const post = (path, body, init) =>
    fetch("${target}" + path, Object.assign({ method: "POST", body }, init))
      .then((r) => results.push(path + " " + r.type + " " + r.status), (e) => results.push(path + " blocked"));
  await post("/api/v1/level", '{"level":3}', { mode: "no-cors", headers: { "Content-Type": "text/plain" } });
  await post("/api/v1/breakers/payments/state", '{"state":"FORCED_OPEN"}', { mode: "no-cors" });
  await post("/api/v1/level", '{"level":3}', { headers: { "Content-Type": "application/json" } });
  await new Promise((resolve) => {
    document.getElementById("sink").addEventListener("load", resolve, { once: true });
    document.getElementById("f").submit();
  });
  return results.join("; ");
};
</script></body></html>`;

(async () => {
  const evil = http.createServer((req, res) => {
    res.writeHead(200, { "Content-Type": "text/html" });
    res.end(evilPage);
  });
  await new Promise((resolve) => evil.listen(0, "127.0.0.1", resolve));
  const evilPort = evil.address().port;
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    args: [
      "--no-sandbox",
      "--disable-gpu",
      "--disable-dev-shm-usage",
      "--host-resolver-rules=MAP evil.test 127.0.0.1, MAP floodgate.test 127.0.0.1",
    ],
  });
  try {
    const page = await browser.newPage();

    // The console itself, by the name it was given: it still acts.
    await page.goto(`http://floodgate.test:${port}/`);
    await page.locator("#live", { hasText: "live" }).waitFor({ timeout: 20000 });
    await page.selectOption("#level-choice", "1");
    await page.click("#level-set");
    await page.locator("#message", { hasText: "Degradation level 1 (manual)" }).waitFor({ timeout: 10000 });
    step("OWN_PAGE_ACTS");

    await page.goto(`http://evil.test:${evilPort}/`);
    const results = await page.evaluate(() => window.attack());
    step("ATTACKED " + results);
    await nextLine();

    // DNS rebinding: evil.test now points at the console's address and port.
    const rebound = await page.goto(`http://evil.test:${port}/api/v1/console`);
    step("REBIND " + rebound.status());
    const pageRebound = await page.goto(`http://evil.test:${port}/`);
    step("REBIND_PAGE " + pageRebound.status());
    step("DONE");
  } finally {
    await browser.close();
    evil.close();
    lines.close();
  }
})().catch((e) => {
  console.error(e && e.stack ? e.stack : String(e));
  process.exit(1);
});
