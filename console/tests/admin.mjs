// The admin page's acceptance checks (/console/admin) in headless Chromium,
// run by run.sh after console.mjs. One tether with the admin API on
// (--admin-token-env), a --config file with:
//   - /mcp/slow and /mcp/helper: console/tests/admin_server.py (a slow tool,
//     and a tool whose name is full of HTML),
//   - /mcp/broken: a command that exits at once with an error,
//   - /mcp/team: a virtual server of slow and helper,
//   - [[policies]] and --audit-log, so decisions are audited.
// Clients are the official TypeScript SDK's (@modelcontextprotocol/sdk).
// Checks:
//   1. sign-in: a wrong token is refused (admin-error, nothing else shown),
//      the right one shows the panels; a token refused later (401) shows
//      the sign-in again;
//   2. session-and-calls: an SDK client's session (its client name full of
//      HTML) is listed with its ID, the name shown as text; its slow call
//      appears among the calls in flight while it runs and goes when it
//      ends, pushed by /admin/calls/stream (the page never polls
//      /admin/calls); a call of the tool whose name is HTML shows the name
//      as text and no script runs (window.__pwned stays undefined);
//   3. upstreams: slow, helper and broken are listed with their state, the
//      broken one (after a client tried it) with its error; the virtual
//      server with its members; the keeper's facts;
//   4. audit: a denied call and allowed ones are listed, filtered by decision;
//   5. end-session: ending the SDK client's session from the page (after a
//      confirmation) gives the client 404 on its next request.
// Screenshots go to target/console-shots/admin-*.png; with ADMIN_BOOK_SHOT=1
// a last step (book-shot: a few sessions and calls, the charts after some
// samples) writes the book's picture, docs/src/operations/admin.png.
//
// usage: node admin.mjs TETHER_BIN PYTHON CHROMIUM
// ADMIN_CHECKS=name,name runs only those checks (sign-in always runs).

import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';
import { assert, freePort, sleep, waitFor } from './support.mjs';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

const [BIN, PYTHON, CHROMIUM] = process.argv.slice(2);
const HERE = path.dirname(fileURLToPath(import.meta.url));
const ROOT = path.resolve(HERE, '..', '..');
const SHOTS = path.join(ROOT, 'target', 'console-shots');
const BOOK_SHOT = path.join(ROOT, 'docs', 'src', 'operations', 'admin.png');
const TMP = fs.mkdtempSync(path.join(os.tmpdir(), 'tether-admin-'));
const LOG = path.join(TMP, 'server.log');
const VERBOSE = process.env.CONSOLE_VERBOSE === '1';
const TOKEN = 'admin-page-token-0123456789abcdef';
const HTML_TOOL = '<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>b&lt;';
const HTML_CLIENT = '<img src=x onerror="window.__pwned=3"><b>evil</b> client';
fs.mkdirSync(SHOTS, { recursive: true });

let base;
let server = null;
const clients = [];

async function shot(page, name) {
  await page.screenshot({ path: path.join(SHOTS, `admin-${name}.png`), fullPage: true });
}

async function startTether() {
  const port = await freePort();
  base = `http://127.0.0.1:${port}`;
  const fixture = path.join(HERE, 'admin_server.py');
  // JSON strings are TOML basic strings.
  const q = JSON.stringify;
  const config = path.join(TMP, 'admin.toml');
  fs.writeFileSync(config, [
    `[upstreams.slow]\ncommand = [${q(PYTHON)}, ${q(fixture)}]\n`,
    `[upstreams.helper]\ncommand = [${q(PYTHON)}, ${q(fixture)}]\n`,
    `[upstreams.broken]\ncommand = [${q(PYTHON)}, "-c", ${q("import sys; sys.stderr.write('<b>boom</b>: cannot start\\n'); sys.exit(3)")}]\n`,
    '[servers.team]\nupstreams = ["slow", "helper"]\n',
    '[[policies]]\nendpoint = "slow"\ntools = ["forbidden*"]\nallow = \'false\'\n',
  ].join('\n'));
  const args = ['serve', '--listen', `127.0.0.1:${port}`, '--store', `sqlite:${path.join(TMP, 'a.db')}`,
    '--config', config, '--audit-log', path.join(TMP, 'audit.jsonl'), '--admin-token-env', 'TETHER_ADMIN_PAGE_TOKEN'];
  fs.appendFileSync(LOG, `==== tether ${args.join(' ')} (${new Date().toISOString()}) ====\n`);
  console.log(`admin tests: starting ${BIN} ${args.join(' ')}`);
  const out = fs.openSync(LOG, 'a');
  server = spawn(BIN, args, { stdio: ['ignore', out, out], env: { ...process.env, TETHER_ADMIN_PAGE_TOKEN: TOKEN } });
  fs.closeSync(out);
  await waitFor('tether /healthz', async () => {
    if (server.exitCode !== null) throw new Error(`tether exited with ${server.exitCode}`);
    return (await fetch(`${base}/healthz`).catch(() => null))?.ok;
  }, 30_000);
}

async function stopTether() {
  if (!server || server.exitCode !== null) return;
  const exited = new Promise((resolve) => server.once('exit', resolve));
  server.kill('SIGTERM');
  await Promise.race([exited, sleep(15_000)]);
  if (server.exitCode === null && server.signalCode === null) server.kill('SIGKILL');
}

/** An official SDK client connected to `endpoint`. */
async function sdkClient(endpoint, name) {
  const client = new Client({ name, version: '1.0.0' });
  const transport = new StreamableHTTPClientTransport(new URL(`${base}${endpoint}`));
  await client.connect(transport);
  clients.push(client);
  return { client, transport };
}

async function signIn(page, token) {
  await page.getByTestId('admin-token').fill(token);
  await page.getByTestId('admin-sign-in').click();
}

// ------------------------------------------------------------------ checks

async function signInCheck(page) {
  await page.goto(`${base}/console/admin`);
  await signIn(page, 'not-the-admin-token-0123456789');
  const error = page.getByTestId('admin-error');
  await error.waitFor();
  assert(/refused/i.test(await error.textContent()), `the error says the token was refused: ${await error.textContent()}`);
  assert(!(await page.locator('#dashboard').isVisible()), 'nothing but the sign-in is shown after a wrong token');
  assert((await page.getByTestId('upstream-row').count()) === 0, 'no upstream is listed after a wrong token');
  assert(await page.evaluate(() => !sessionStorage.getItem('tether-admin-token')), 'a refused token is not kept');
  await shot(page, '1-refused');

  await signIn(page, TOKEN);
  await page.getByTestId('upstream-row').first().waitFor();
  assert(!(await error.isVisible()), 'the error is gone once signed in');
  const stored = await page.evaluate(() => ({ session: sessionStorage.getItem('tether-admin-token'), local: localStorage.length, cookie: document.cookie, url: location.href }));
  assert(stored.session === TOKEN && stored.local === 0 && stored.cookie === '' && !stored.url.includes(TOKEN), `the token is in sessionStorage only: ${JSON.stringify(stored)}`);

  // A token the server refuses later (401 on any request) brings the sign-in back.
  await page.evaluate(() => sessionStorage.setItem('tether-admin-token', 'a-token-that-was-rotated-000000'));
  await page.reload();
  await error.waitFor();
  assert(!(await page.locator('#dashboard').isVisible()), 'a 401 shows the sign-in again and nothing else');
  await signIn(page, TOKEN);
  await page.getByTestId('upstream-row').first().waitFor();
  return 'a wrong token got admin-error and no panel; the right one showed the panels (token in sessionStorage only); a later 401 showed the sign-in again';
}

async function sessionAndCalls(page, requests) {
  const { client, transport } = await sdkClient('/mcp/slow', HTML_CLIENT);
  const sid = transport.sessionId;
  assert(sid && sid.length >= 12, `the SDK client has a session: ${sid}`);
  await page.getByRole('button', { name: 'Apply' }).first().click();
  const row = page.getByTestId('session-row').filter({ hasText: sid.slice(0, 12) });
  await waitFor(`the session ${sid} listed`, async () => {
    if ((await row.count()) === 1) return true;
    await page.getByRole('button', { name: 'Apply' }).first().click();
    await sleep(500);
    return false;
  });
  const rowText = await row.textContent();
  assert(rowText.includes(HTML_CLIENT), `the client name is shown as text: ${rowText}`);
  assert((await row.locator('img, b').count()) === 0, 'the client name made no element');
  // Its detail view: the record, its streams and heads, its operations.
  await row.getByRole('button', { name: 'Details' }).click();
  const detail = page.locator('#session-detail');
  await detail.getByText('Streams and their heads').waitFor();
  const detailText = await detail.textContent();
  assert(detailText.includes(sid) && detailText.includes('anonymous') && detailText.includes('Operations'), `the detail view: ${detailText}`);

  // The slow call: listed while it runs, gone when it ends.
  const slow = client.callTool({ name: 'slow', arguments: { ms: 4000 } });
  const callRow = page.getByTestId('call-row').filter({ hasText: 'slow' });
  await callRow.first().waitFor({ timeout: 20_000 });
  const callText = await callRow.first().textContent();
  assert(callText.includes(sid.slice(0, 12)), `the call row names its session: ${callText}`);
  await shot(page, '2-call-running');
  const result = await slow;
  assert(JSON.stringify(result).includes('slept 4000 ms'), `the slow call's result: ${JSON.stringify(result)}`);
  await waitFor('the slow call to leave the calls in flight', async () => (await callRow.count()) === 0, 20_000);

  // A tool whose name is HTML: shown as text, no script runs.
  const html = client.callTool({ name: HTML_TOOL, arguments: { ms: 3000 } });
  const htmlRow = page.getByTestId('call-row').filter({ hasText: 'window.__pwned' });
  await htmlRow.first().waitFor({ timeout: 20_000 });
  const htmlText = await htmlRow.first().textContent();
  assert(htmlText.includes(HTML_TOOL), `the tool's name is shown literally: ${htmlText}`);
  assert((await page.locator('#calls-rows img, #calls-rows script').count()) === 0, 'the tool name made no element');
  await shot(page, '3-html-tool-name');
  await html;
  await waitFor('the HTML call to leave', async () => (await htmlRow.count()) === 0, 20_000);
  assert(await page.evaluate(() => window.__pwned === undefined), 'no script of a name ran');

  // Pushed, not polled.
  assert(requests.some((u) => u.endsWith('/admin/calls/stream')), 'the page follows /admin/calls/stream');
  assert(!requests.some((u) => /\/admin\/calls(\?|$)/.test(u)), `the page never polls /admin/calls: ${requests.filter((u) => u.includes('/admin/calls')).join(', ')}`);
  return `session ${sid.slice(0, 12)}… listed with its HTML client name as text, its detail view shown; the 4 s slow call listed while it ran and gone after; the HTML tool name shown literally, window.__pwned undefined; calls pushed on /admin/calls/stream`;
}

async function upstreams(page) {
  // A client tries the broken upstream: its start fails, and the page says why.
  let refused = null;
  try {
    await sdkClient('/mcp/broken', 'tries-broken');
  } catch (e) {
    refused = e;
  }
  assert(refused, 'the broken upstream refused the client');
  const rowOf = (name) => page.locator(`[data-testid=upstream-row][data-upstream="${name}"]`);
  await waitFor('the broken upstream to show its error', async () => {
    await page.locator('#upstreams-refresh').click();
    await sleep(300);
    const text = (await rowOf('broken').textContent()) || '';
    return /restarting|failing/.test(text) && text.includes('<b>boom</b>') ? text : false;
  });
  for (const name of ['slow', 'helper', 'broken']) {
    const text = await rowOf(name).textContent();
    assert(text.includes(name), `upstream-row ${name}: ${text}`);
  }
  const states = {};
  for (const name of ['slow', 'helper', 'broken']) states[name] = (await rowOf(name).getByTestId('state').textContent()).trim();
  assert(states.slow === 'up' && states.helper === 'up', `slow and helper are up: ${JSON.stringify(states)}`);
  assert(['restarting', 'failing'].includes(states.broken), `broken is restarting or failing: ${JSON.stringify(states)}`);
  assert((await rowOf('broken').locator('b').count()) === 0, 'the error text made no element');
  const team = page.locator('[data-testid=virtual-row][data-server="team"]');
  await team.waitFor();
  const teamText = await team.textContent();
  assert(teamText.includes('slow') && teamText.includes('helper'), `the virtual server lists its members: ${teamText}`);
  const keeper = await page.locator('#keeper').isVisible();
  await shot(page, '4-upstreams');
  return `slow (${states.slow}), helper (${states.helper}) and broken (${states.broken}) listed; broken shows its error as text; team lists slow and helper${keeper ? '; the keeper\'s facts shown' : ''}`;
}

async function audit(page) {
  const { client } = await sdkClient('/mcp/slow', 'audited');
  let denied = false;
  try {
    await client.callTool({ name: 'forbidden_tool', arguments: {} });
  } catch {
    denied = true;
  }
  assert(denied, 'the policy refused forbidden_tool');
  await page.locator('#a-decision').selectOption('deny');
  const rows = page.getByTestId('audit-row');
  await waitFor('the denial in the audit panel', async () => {
    await page.locator('#audit-filter button[type=submit]').click();
    await sleep(300);
    return (await rows.filter({ hasText: 'forbidden_tool' }).count()) > 0;
  });
  const decisions = await rows.evaluateAll((trs) => trs.map((tr) => tr.dataset.decision));
  assert(decisions.every((d) => d === 'deny'), `filtered by decision: ${decisions}`);
  await page.locator('#a-decision').selectOption('');
  await page.locator('#audit-filter button[type=submit]').click();
  return `the denial of forbidden_tool listed; filtered to deny: ${decisions.length} row(s)`;
}

async function endSession(page) {
  const { client, transport } = await sdkClient('/mcp/slow', 'to-be-ended');
  const sid = transport.sessionId;
  const row = page.getByTestId('session-row').filter({ hasText: sid.slice(0, 12) });
  await waitFor(`the session ${sid} listed`, async () => {
    await page.getByRole('button', { name: 'Apply' }).first().click();
    await sleep(300);
    return (await row.count()) === 1;
  });
  await row.getByTestId('session-end').click();
  await page.getByTestId('confirm-end').waitFor();
  await shot(page, '5-confirm-end');
  await page.getByTestId('confirm-end').click();
  await waitFor('the session to leave the list', async () => (await row.count()) === 0, 20_000);
  let status = null;
  try {
    await client.listTools();
  } catch (e) {
    status = e.code ?? e.message;
  }
  assert(status === 404, `the client's next request got 404, not ${status}`);
  return `session ${sid.slice(0, 12)}… ended from the page after a confirmation; the SDK client's next request got 404`;
}

/** The book's picture (ADMIN_BOOK_SHOT=1): a few sessions and calls, the charts after some samples. */
async function bookShot(page) {
  const made = [];
  for (const name of ['claude-code', 'cursor', 'inspector']) made.push(await sdkClient('/mcp/slow', name));
  const team = await sdkClient('/mcp/team', 'agent-runner');
  const running = [
    made[0].client.callTool({ name: 'slow', arguments: { ms: 25_000 } }),
    made[1].client.callTool({ name: 'slow', arguments: { ms: 25_000 } }),
    team.client.callTool({ name: 'slow__slow', arguments: { ms: 25_000 } }).catch(() => null),
  ];
  // Some traffic for the charts, over a few samples.
  const until = Date.now() + 16_000;
  while (Date.now() < until) {
    await made[2].client.listTools();
    await sleep(150);
  }
  await page.locator('#upstreams-refresh').click();
  await page.getByRole('button', { name: 'Apply' }).first().click();
  await waitFor('three calls in flight', async () => (await page.getByTestId('call-row').count()) >= 3, 20_000);
  await sleep(1500);
  await page.evaluate(() => window.scrollTo(0, 0));
  await page.screenshot({ path: BOOK_SHOT, fullPage: true });
  await Promise.all(running);
  return `${path.relative(ROOT, BOOK_SHOT)} written`;
}

// ------------------------------------------------------------------ main

async function main() {
  await startTether();
  const browser = await chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
  const context = await browser.newContext({ viewport: { width: 1400, height: 1000 } });
  const page = await context.newPage();
  page.setDefaultTimeout(20_000);
  const problems = [];
  const requests = [];
  page.on('console', (m) => {
    if (m.type() === 'error' && /Content Security Policy|Refused to|TrustedHTML|Trusted Type/i.test(m.text())) problems.push(m.text());
  });
  page.on('pageerror', (e) => problems.push(`uncaught: ${e.message}`));
  page.on('request', (r) => requests.push(r.url()));

  const wanted = process.env.ADMIN_CHECKS?.split(',');
  const checks = [
    ['sign-in', signInCheck],
    ['session-and-calls', (p) => sessionAndCalls(p, requests)],
    ['upstreams', upstreams],
    ['audit', audit],
    ['end-session', endSession],
    ...(process.env.ADMIN_BOOK_SHOT === '1' ? [['book-shot', bookShot]] : []),
  ].filter(([name]) => name === 'sign-in' || !wanted || wanted.includes(name));
  let failed = 0;
  const summary = [];
  for (const [name, check] of checks) {
    try {
      const what = await check(page);
      if (problems.length) throw new Error(`the page reported: ${problems.splice(0).join(' | ')}`);
      summary.push(`PASS admin-${name}: ${what}`);
      console.log(`PASS admin-${name}`);
    } catch (e) {
      failed += 1;
      summary.push(`FAIL admin-${name}: ${e.message}`);
      console.log(`FAIL admin-${name}: ${e.stack || e.message}`);
      await shot(page, `fail-${name}`).catch(() => {});
    }
  }
  for (const c of clients) await c.close().catch(() => {});
  await browser.close();
  await stopTether();
  if (failed || VERBOSE) {
    console.log('---- tether log (last 60 lines) ----');
    console.log(fs.readFileSync(LOG, 'utf8').split('\n').slice(-60).join('\n'));
  }
  console.log('\nadmin page summary:');
  for (const line of summary) console.log(`  ${line}`);
  console.log(`admin page: ${checks.length - failed} passed, ${failed} failed; screenshots in ${path.relative(process.cwd(), SHOTS) || SHOTS}`);
  fs.rmSync(TMP, { recursive: true, force: true });
  process.exit(failed ? 1 : 0);
}

main().catch(async (e) => {
  console.error(`admin tests: ${e.stack || e.message}`);
  await stopTether().catch(() => {});
  if (fs.existsSync(LOG)) console.error(fs.readFileSync(LOG, 'utf8').split('\n').slice(-40).join('\n'));
  process.exit(1);
});
