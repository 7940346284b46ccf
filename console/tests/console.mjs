// The console's acceptance checks in headless Chromium (run by run.sh):
//   1. connect-and-call: connect to /mcp, list tools, call `thought`, see the result;
//   2. reload-mid-call: a long call on /mcp/slow, the page reloaded in the middle:
//      same session, no initialize, progress resumed with no gap and no repeat,
//      the result shown once, the tool ran once upstream;
//   3. kill-9-and-restart: a long call on /mcp/remote (a URL upstream: a second
//      tether in front of the same slow server, which lives on), tether killed with
//      SIGKILL while the page waits, restarted on the same store: the page, still
//      open, re-attaches, the call is carried on (its progress goes on with no gap
//      and no repeat) and its real result is shown once, in the same session; the
//      tool ran once upstream;
//   4. elicitation: the server asks through the gateway, the page's form answers,
//      the tool's result uses the answer;
// and two more of the issue's promises:
//   5. two-tabs: two tabs on one session, one reloaded mid-call: each gets all of
//      its own call and nothing of the other's;
//   6. unknown-session: a stored session the server does not know (404) gives a
//      visible notice and a fresh session;
//   7. token: with --auth-tokens, a 401 brings up the token field, and the token
//      typed is kept in sessionStorage only (not localStorage, not the URL);
// and one of virtual servers:
//   8. virtual-server: a tether whose --config file serves `team`, two stdio
//      fixture members `a` and `b`, at /mcp/team: the merged tools carry their
//      member's badge, the selected tool's description names its member, and a
//      call of `b__whoami` from the form is answered by member `b`.
// and one of signing in:
//   9. oauth-sign-in: a tether with --oauth-issuer in front of a real
//      authorization server (interop/oauth/provider.mjs, oidc-provider):
//      Connect takes the tab to the provider's login page (the console read
//      tether's resource metadata, registered itself and asked for a code
//      with PKCE); after the login and consent forms the tab is back in the
//      console, connected and signed in as the login; a call of `thought`
//      works; the access token (aud = the endpoint, sub = the login) is in
//      sessionStorage only; after a reload the session, the call's result
//      and a new call work with no sign-in; an expired token, then a refused
//      one, bring back the Sign in button, and signing in again goes on in
//      the same session; in Chromium, the console page cannot reach the
//      provider (connect-src 'self'), the sign-in page can only when its URL
//      names the provider's origin.
// usage: node console.mjs TETHER_BIN PYTHON CHROMIUM
// CONSOLE_CHECKS=name,name runs only those checks.

import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';
import { assert, freePort, sleep, waitFor } from './support.mjs';

const [BIN, PYTHON, CHROMIUM] = process.argv.slice(2);
const HERE = path.dirname(fileURLToPath(import.meta.url));
const ROOT = path.resolve(HERE, '..', '..');
const SHOTS = path.join(ROOT, 'target', 'console-shots');
const TMP = fs.mkdtempSync(path.join(os.tmpdir(), 'tether-console-'));
const RUNLOG = path.join(TMP, 'runs.log');
const LOG = path.join(TMP, 'server.log');
const VERBOSE = process.env.CONSOLE_VERBOSE === '1';
fs.mkdirSync(SHOTS, { recursive: true });
for (const f of fs.readdirSync(SHOTS)) if (f.endsWith('.png')) fs.rmSync(path.join(SHOTS, f));
fs.writeFileSync(RUNLOG, '');

const shq = (s) => `'${s.replaceAll("'", `'\\''`)}'`;
let port;
let base;
let server = null;
// The second tether: /mcp/slow in front of the slow server, the console
// tether's URL upstream /mcp/remote. It is not killed with the first.
let upstream = null;
let upstreamBase;

const slowUpstream = () => `slow=stdio:${shq(PYTHON)} ${shq(path.join(HERE, 'slow_server.py'))} ${shq(RUNLOG)}`;

async function startUpstream() {
  const uport = await freePort();
  upstreamBase = `http://127.0.0.1:${uport}`;
  const args = ['serve', '--listen', `127.0.0.1:${uport}`, '--store', `sqlite:${path.join(TMP, 'u.db')}`, '--no-console', '--upstream', slowUpstream()];
  const out = fs.openSync(path.join(TMP, 'upstream.log'), 'a');
  upstream = spawn(BIN, args, { stdio: ['ignore', out, out] });
  fs.closeSync(out);
  await waitFor('the upstream tether', async () => (await fetch(`${upstreamBase}/healthz`).catch(() => null))?.ok, 30_000);
}

async function startTether() {
  const args = [
    'serve', '--listen', `127.0.0.1:${port}`, '--store', `sqlite:${path.join(TMP, 't.db')}`,
    '--upstream', slowUpstream(), '--upstream', `remote=${upstreamBase}/mcp/slow`,
  ];
  fs.appendFileSync(LOG, `==== tether ${args.join(' ')} (${new Date().toISOString()}) ====\n`);
  console.log(`console tests: starting ${BIN} ${args.join(' ')}`);
  const out = fs.openSync(LOG, 'a');
  server = spawn(BIN, args, { stdio: ['ignore', out, out] });
  fs.closeSync(out);
  const deadline = Date.now() + 30_000;
  while (Date.now() < deadline) {
    if (server.exitCode !== null) throw new Error(`tether exited with ${server.exitCode}`);
    try {
      const r = await fetch(`${base}/healthz`);
      if (r.ok) return;
    } catch {
      // not yet
    }
    await sleep(100);
  }
  throw new Error('tether did not answer /healthz within 30 s');
}

async function stopTether(signal = 'SIGTERM') {
  if (!server || server.exitCode !== null) return;
  const exited = new Promise((resolve) => server.once('exit', resolve));
  server.kill(signal);
  await Promise.race([exited, sleep(10_000)]);
  if (server.exitCode === null && server.signalCode === null) {
    server.kill('SIGKILL');
    await exited;
  }
}

function runs(prefix) {
  return fs.readFileSync(RUNLOG, 'utf8').split('\n').filter((l) => l.startsWith(prefix)).length;
}

async function shot(page, name) {
  await page.screenshot({ path: path.join(SHOTS, `${name}.png`) });
}

async function sessionId(page) {
  return (await page.getByTestId('session-id').textContent()).trim();
}

async function connect(page, endpoint) {
  await page.getByTestId('endpoint').fill(endpoint);
  await page.getByTestId('connect').click();
  await page.waitForFunction(() => /^[0-9a-f]{16,}$/.test(document.querySelector('[data-testid=session-id]').textContent.trim()));
}

/** Fills a tool's form, calls it, returns the new call card's locator. */
async function call(page, tool, args) {
  await page.getByTestId(`tool-${tool}`).click();
  for (const [name, value] of Object.entries(args)) {
    const field = page.getByTestId(`arg-${name}`);
    if (typeof value === 'boolean') await field.setChecked(value);
    else await field.fill(String(value));
  }
  const before = await page.locator('li.call').count();
  await page.getByTestId('call').click();
  await page.waitForFunction((n) => document.querySelectorAll('li.call').length > n, before);
  const key = await page.locator('li.call').first().getAttribute('data-call');
  return { key, card: page.locator(`li.call[data-call="${key}"]`) };
}

async function seen(card) {
  const text = (await card.getAttribute('data-progress-seen')) || '';
  return text ? text.split(',').map(Number) : [];
}

const counting = (n) => Array.from({ length: n }, (_, i) => i + 1).join(',');

// ------------------------------------------------------------------ checks

async function connectAndCall(page) {
  await page.goto(`${base}/console`);
  await connect(page, '/mcp');
  await page.getByTestId('tool-thought').waitFor();
  await page.getByTestId('tool-session').waitFor();
  const { card } = await call(page, 'thought', { thought: 'Read the failing test first', thoughtNumber: 1, totalThoughts: 3, nextThoughtNeeded: true });
  const result = card.getByTestId('result');
  await result.waitFor();
  const text = await result.textContent();
  assert(text.includes('thoughtHistoryLength'), `the thought's result is shown: ${text}`);
  await page.locator('#thoughts li', { hasText: 'Read the failing test first' }).waitFor();
  await shot(page, '1-connect-and-call');
  return `session ${await sessionId(page)}; thought recorded and shown in the notebook panel`;
}

async function reloadMidCall(page) {
  await page.goto(`${base}/console?endpoint=/mcp/slow`);
  await connect(page, '/mcp/slow');
  await page.getByTestId('tool-slow').waitFor();
  const session = await sessionId(page);
  const steps = 16;
  const { key, card } = await call(page, 'slow', { steps, ms: 400, label: 'reload' });
  await waitFor('4 progress notifications', async () => (await seen(card)).length >= 4);
  const before = await seen(card);
  await shot(page, '2a-before-reload');
  const initializes = [];
  page.on('request', (r) => {
    if (r.method() === 'POST' && (r.postData() || '').includes('"method":"initialize"')) initializes.push(r.url());
  });
  await page.reload();
  const after = page.locator(`li.call[data-call="${key}"]`);
  await waitFor('the same session after the reload', async () => (await sessionId(page)) === session);
  await waitFor('more progress after the reload', async () => (await seen(after)).length > before.length);
  await shot(page, '2b-progress-after-reload');
  await after.getByTestId('result').waitFor({ timeout: 30_000 });
  const all = await seen(after);
  assert(all.join(',') === counting(steps), `progress 1..${steps} once each, in order (before the reload: ${before}); got ${all}`);
  assert((await after.getAttribute('data-log-count')) === String(steps), `every log message once: ${await after.getAttribute('data-log-count')}`);
  assert((await page.getByTestId('result').count()) === 1, `one result on the page, got ${await page.getByTestId('result').count()}`);
  const text = await after.getByTestId('result').textContent();
  assert(text.includes(`slow reload done after ${steps} steps`), `the result: ${text}`);
  assert(initializes.length === 0, `no initialize after the reload: ${initializes}`);
  assert(runs('start slow reload') === 1 && runs('end slow reload') === 1, `the tool ran once upstream: ${fs.readFileSync(RUNLOG, 'utf8')}`);
  await shot(page, '2c-result-once');
  return `session ${session} kept; progress ${before.length} before the reload, ${all.length - before.length} after, no gap; tool ran once`;
}

async function killAndRestart(page) {
  await page.goto(`${base}/console?endpoint=/mcp/remote`);
  await connect(page, '/mcp/remote');
  await page.getByTestId('tool-slow').waitFor();
  const session = await sessionId(page);
  const steps = 16;
  const { card } = await call(page, 'slow', { steps, ms: 300, label: 'crash' });
  await waitFor('3 progress notifications', async () => (await seen(card)).length >= 3);
  await stopTether('SIGKILL');
  console.log('console tests: killed tether with SIGKILL');
  await waitFor('the page to say the server is unreachable', async () => (await page.locator('#status').getAttribute('data-kind')) === 'reconnecting', 10_000);
  await shot(page, '3a-server-down');
  const shown = await seen(card);
  await sleep(1500);
  await startTether();
  await card.getByTestId('error').or(card.getByTestId('result')).waitFor({ timeout: 30_000 });
  assert((await card.getByTestId('error').count()) === 0, `the call was carried on, not cut off: ${await card.locator('.outcome').textContent()}`);
  assert((await card.getByTestId('result').count()) === 1, 'the result is shown once');
  const text = await card.getByTestId('result').textContent();
  assert(text.includes(`slow crash done after ${steps} steps`), `the call's real result: ${text}`);
  const progress = await seen(card);
  assert(progress.join(',') === counting(steps), `progress 1..${steps} once each, in order, across the crash (${shown.length} before it); got ${progress}`);
  assert((await card.getAttribute('data-log-count')) === String(steps), `every log message once: ${await card.getAttribute('data-log-count')}`);
  assert((await sessionId(page)) === session, 'the same session after the restart');
  assert(runs('start slow crash') === 1 && runs('end slow crash') === 1, `the call ran once upstream: ${fs.readFileSync(RUNLOG, 'utf8')}`);
  await page.waitForFunction(() => document.querySelector('#status').dataset.kind === 'ok');
  const next = await call(page, 'echo', { text: 'after the restart' });
  await next.card.getByTestId('result').waitFor();
  assert((await next.card.getByTestId('result').textContent()).includes('after the restart'), 'a new call in the same session works');
  await shot(page, '3b-after-restart');
  // The checks after this one work on /mcp/slow, as before it.
  await page.goto(`${base}/console?endpoint=/mcp/slow`);
  await connect(page, '/mcp/slow');
  await page.getByTestId('tool-slow').waitFor();
  return `the page re-attached after the restart; the call went on (${shown.length} of ${steps} progress steps before the crash) and its result was shown once`;
}

async function elicitation(page) {
  const { card } = await call(page, 'greet', {});
  const form = card.getByTestId('elicitation');
  await form.waitFor();
  await form.getByTestId('elicit-name').fill('Ada');
  await form.getByTestId('elicit-mood').selectOption('curious');
  await shot(page, '4a-elicitation');
  await form.getByTestId('elicitation-submit').click();
  await card.getByTestId('result').waitFor();
  const text = await card.getByTestId('result').textContent();
  assert(text.includes('Hello, Ada! (curious)'), `the result uses the answer: ${text}`);
  assert((await card.getByTestId('elicitation').count()) === 0, 'the form is gone once answered');
  await shot(page, '4b-elicitation-answered');
  await page.setViewportSize({ width: 420, height: 800 });
  await shot(page, '5-narrow');
  await page.setViewportSize({ width: 1280, height: 800 });
  return text.trim();
}

async function twoTabs(page) {
  const session = await sessionId(page);
  const other = await page.context().newPage();
  try {
    await other.goto(`${base}/console?endpoint=/mcp/slow`);
    await waitFor('the second tab to take the stored session', async () => (await sessionId(other)) === session);
    await other.getByTestId('tool-slow').waitFor();
    const steps = 12;
    const b = await call(other, 'slow', { steps, ms: 300, label: 'tabB' });
    const a = await call(page, 'slow', { steps, ms: 300, label: 'tabA' });
    await waitFor('progress in both tabs', async () => (await seen(a.card)).length >= 3 && (await seen(b.card)).length >= 3);
    await page.reload();
    const aAfter = page.locator(`li.call[data-call="${a.key}"]`);
    await aAfter.getByTestId('result').waitFor({ timeout: 30_000 });
    await b.card.getByTestId('result').waitFor({ timeout: 30_000 });
    assert((await seen(aAfter)).join(',') === counting(steps), `tab A (reloaded) saw all its progress: ${await seen(aAfter)}`);
    assert((await seen(b.card)).join(',') === counting(steps), `tab B saw all its progress: ${await seen(b.card)}`);
    assert((await other.locator(`li.call[data-call="${a.key}"]`).count()) === 0, "tab B does not show tab A's call");
    assert((await page.locator(`li.call[data-call="${b.key}"]`).count()) === 0, "tab A does not show tab B's call");
    assert((await aAfter.getByTestId('result').textContent()).includes('slow tabA done'), 'tab A got its own result');
    assert((await b.card.getByTestId('result').textContent()).includes('slow tabB done'), 'tab B got its own result');
    assert(runs('start slow tabA') === 1 && runs('start slow tabB') === 1, 'each ran once upstream');
    await other.screenshot({ path: path.join(SHOTS, '6-second-tab.png') });
  } finally {
    await other.close();
  }
  return `one session ${session}, two tabs, tab A reloaded mid-call: each tab got all its own progress and result`;
}

async function unknownSession(page) {
  const old = await sessionId(page);
  await page.evaluate(() => {
    const key = 'tether-console:session:/mcp/slow';
    const stored = JSON.parse(localStorage.getItem(key));
    localStorage.setItem(key, JSON.stringify({ ...stored, id: 'f'.repeat(48) }));
  });
  await page.reload();
  const notice = page.getByTestId('notice');
  await notice.waitFor();
  const text = await notice.textContent();
  assert(/no longer knows session/.test(text) && /new session/.test(text), `the notice says what happened: ${text}`);
  await waitFor('a fresh session', async () => /^[0-9a-f]{48}$/.test(await sessionId(page)) && (await sessionId(page)) !== 'f'.repeat(48));
  assert((await sessionId(page)) !== old, 'a new session, not the old one');
  await page.getByTestId('tool-echo').waitFor();
  const next = await call(page, 'echo', { text: 'fresh' });
  await next.card.getByTestId('result').waitFor();
  await shot(page, '7-unknown-session');
  return `404 on the stored session: notice shown, new session ${await sessionId(page)}`;
}

async function token(page) {
  const secret = 'console-test-token-5f0c2a9e71d4';
  const file = path.join(TMP, 'tokens');
  fs.writeFileSync(file, `${secret} alice\n`, { mode: 0o600 });
  const authPort = await freePort();
  const authBase = `http://127.0.0.1:${authPort}`;
  const out = fs.openSync(LOG, 'a');
  const guarded = spawn(BIN, ['serve', '--listen', `127.0.0.1:${authPort}`, '--store', 'memory', '--auth-tokens', file], { stdio: ['ignore', out, out] });
  fs.closeSync(out);
  try {
    await waitFor('the server with --auth-tokens', async () => (await fetch(`${authBase}/healthz`).catch(() => null))?.ok, 30_000);
    await page.goto(`${authBase}/console`);
    assert(!(await page.getByTestId('token').isVisible()), 'no token field before the server asks for one');
    await page.getByTestId('connect').click();
    await page.getByTestId('token').waitFor();
    assert(/token/i.test(await page.getByTestId('notice').textContent()), 'the notice says a token is needed');
    await page.getByTestId('token').fill(secret);
    await page.getByTestId('connect').click();
    await page.waitForFunction(() => /^[0-9a-f]{48}$/.test(document.querySelector('[data-testid=session-id]').textContent.trim()));
    await page.getByTestId('tool-thought').waitFor();
    const where = await page.evaluate((t) => ({
      local: Object.keys(localStorage).some((k) => (localStorage.getItem(k) || '').includes(t)),
      session: Object.keys(sessionStorage).some((k) => (sessionStorage.getItem(k) || '').includes(t)),
      url: location.href.includes(t),
    }), secret);
    assert(where.session && !where.local && !where.url, `the token is in sessionStorage only: ${JSON.stringify(where)}`);
    await shot(page, '8-token');
  } finally {
    guarded.kill('SIGKILL');
  }
  return 'a 401 shows the token field; with the token typed the page connects; the token is only in sessionStorage';
}

async function virtualServer(page) {
  const fixture = path.join(ROOT, 'crates', 'tether-gateway', 'tests', 'fixtures', 'stdio_server.py');
  assert(fs.existsSync(fixture), `the stdio fixture is at ${fixture}`);
  // JSON strings are TOML basic strings.
  const member = (name) => `[upstreams.${name}]\ncommand = [${JSON.stringify(PYTHON)}, ${JSON.stringify(fixture)}]\nenv = { FIXTURE_NAME = "${name}" }\n`;
  const file = path.join(TMP, 'team.toml');
  fs.writeFileSync(file, `${member('a')}\n${member('b')}\n[servers.team]\nupstreams = ["a", "b"]\n`);
  const teamPort = await freePort();
  const teamBase = `http://127.0.0.1:${teamPort}`;
  const args = ['serve', '--listen', `127.0.0.1:${teamPort}`, '--store', 'memory', '--config', file];
  fs.appendFileSync(LOG, `==== tether ${args.join(' ')} (${new Date().toISOString()}) ====\n`);
  const out = fs.openSync(LOG, 'a');
  const team = spawn(BIN, args, { stdio: ['ignore', out, out] });
  fs.closeSync(out);
  try {
    await waitFor('the server with [servers.team]', async () => {
      if (team.exitCode !== null) throw new Error(`tether --config ${file} exited with ${team.exitCode}`);
      return (await fetch(`${teamBase}/healthz`).catch(() => null))?.ok;
    }, 30_000);
    await page.goto(`${teamBase}/console?endpoint=/mcp/team`);
    await connect(page, '/mcp/team');
    // 1. both members' whoami, each with its member's badge inside its button.
    for (const name of ['a', 'b']) {
      const tool = page.getByTestId(`tool-${name}__whoami`);
      await tool.waitFor({ timeout: 30_000 });
      const badge = tool.getByTestId(`tool-member-${name}__whoami`);
      await badge.waitFor();
      const text = (await badge.textContent()).trim();
      assert(text === name, `the badge of ${name}__whoami names member ${name}: ${JSON.stringify(text)}`);
    }
    // 2. the selected tool's description names its member.
    await page.getByTestId('tool-b__whoami').click();
    await waitFor('b__whoami selected', async () => (await page.getByTestId('tool-b__whoami').getAttribute('aria-pressed')) === 'true', 20_000);
    const desc = page.locator('#tool-desc');
    await waitFor('the description of b__whoami', async () => ((await desc.textContent()) || '').startsWith('From member b.'), 20_000)
      .catch(async (e) => { throw new Error(`${e.message}; #tool-desc is ${JSON.stringify(await desc.textContent())}`); });
    await shot(page, '9a-virtual-server-tools');
    // 3. a call from the form is answered by member b.
    const { card } = await call(page, 'b__whoami', {});
    await card.getByTestId('error').or(card.getByTestId('result')).waitFor({ timeout: 30_000 });
    assert((await card.getByTestId('error').count()) === 0, `the call succeeded: ${await card.textContent()}`);
    const result = (await card.getByTestId('result').textContent()) || '';
    assert(/"name":\s*"b"/.test(result) && !/"name":\s*"a"/.test(result), `the result names member b: ${result}`);
    await shot(page, '9b-virtual-server-call');
    return `session ${await sessionId(page)} on /mcp/team: a__whoami and b__whoami badged a and b; "${(await desc.textContent()).trim()}"; b__whoami answered {"name": "b"}`;
  } finally {
    team.kill('SIGKILL');
  }
}

async function oauthSignIn(page) {
  const login = 'console-user';
  const provider = path.join(ROOT, 'interop', 'oauth', 'provider.mjs');
  assert(fs.existsSync(path.join(ROOT, 'interop', 'oauth', 'node_modules', 'oidc-provider')), 'oidc-provider is installed in interop/oauth (run.sh does it)');
  const asPort = await freePort();
  const issuer = `http://127.0.0.1:${asPort}`;
  const asLog = path.join(TMP, 'oauth-provider.log');
  let out = fs.openSync(asLog, 'a');
  const as = spawn(process.execPath, [provider, String(asPort), path.join(TMP, 'oauth-key.pem')], { stdio: ['ignore', out, out] });
  fs.closeSync(out);
  const guardedPort = await freePort();
  const guardedBase = `http://127.0.0.1:${guardedPort}`;
  const resource = `${guardedBase}/mcp`;
  let guarded = null;
  const context = page.context();
  // Nothing leaves the machine (the provider's dev pages import a web font).
  const local = (route) => (new URL(route.request().url()).hostname === '127.0.0.1' ? route.continue() : route.abort());
  await context.route('**/*', local);
  const toProvider = [];
  const onRequest = (r) => { if (r.url().startsWith(issuer)) toProvider.push(`${r.method()} ${r.url()}`); };
  try {
    await waitFor('the authorization server to print READY', async () => {
      if (as.exitCode !== null) throw new Error(`provider.mjs exited with ${as.exitCode}: ${fs.readFileSync(asLog, 'utf8')}`);
      return fs.readFileSync(asLog, 'utf8').includes('READY');
    }, 60_000);
    const args = ['serve', '--listen', `127.0.0.1:${guardedPort}`, '--store', `sqlite:${path.join(TMP, 'oauth.db')}`,
      '--oauth-issuer', issuer, '--oauth-scopes', 'tools:read,tools:write'];
    fs.appendFileSync(LOG, `==== tether ${args.join(' ')} (${new Date().toISOString()}) ====\n`);
    out = fs.openSync(LOG, 'a');
    guarded = spawn(BIN, args, { stdio: ['ignore', out, out] });
    fs.closeSync(out);
    await waitFor('the tether with --oauth-issuer', async () => {
      if (guarded.exitCode !== null) throw new Error(`tether --oauth-issuer exited with ${guarded.exitCode}`);
      return (await fetch(`${guardedBase}/healthz`).catch(() => null))?.ok;
    }, 30_000);

    // 1. Connect: the 401 names the resource metadata; the tab goes to the provider.
    await page.goto(`${guardedBase}/console`);
    assert(!(await page.getByTestId('sign-in').isVisible()), 'no Sign in button before the server asks');
    const authorizing = page.waitForRequest((r) => r.url().startsWith(`${issuer}/auth?`), { timeout: 30_000 });
    await page.getByTestId('connect').click();
    const authorize = new URL((await authorizing).url());
    await page.waitForURL((u) => u.origin === issuer, { timeout: 30_000 });
    await page.locator('input[name="login"]').waitFor({ timeout: 30_000 });
    await shot(page, '10a-provider-login');
    await page.fill('input[name="login"]', login);
    await page.fill('input[name="password"]', 'any-password');
    await page.click('button[type="submit"]');
    await page.locator('input[name="prompt"][value="consent"]').waitFor({ state: 'attached', timeout: 30_000 });
    await page.click('button[type="submit"]');

    // 2. Back in the console, connected and signed in.
    await page.waitForURL((u) => u.origin === guardedBase && u.pathname === '/console/', { timeout: 30_000 });
    await page.waitForFunction(() => /^[0-9a-f]{48}$/.test(document.querySelector('[data-testid=session-id]').textContent.trim()), null, { timeout: 30_000 });
    const who = page.getByTestId('signed-in-as');
    await who.waitFor();
    assert((await who.textContent()).includes(login), `signed in as ${login}: ${await who.textContent()}`);
    await page.getByTestId('tool-thought').waitFor({ timeout: 30_000 });
    const first = await call(page, 'thought', { thought: 'Signed in through the provider', thoughtNumber: 1, totalThoughts: 2, nextThoughtNeeded: true });
    await first.card.getByTestId('result').waitFor({ timeout: 30_000 });
    assert((await first.card.getByTestId('result').textContent()).includes('thoughtHistoryLength'), 'the thought call answered');
    await page.evaluate(() => window.scrollTo(0, 0));
    await shot(page, '10b-signed-in');
    const session = await sessionId(page);

    // What went to the provider: the code flow with PKCE for the endpoint.
    const q = authorize.searchParams;
    for (const [k, v] of Object.entries({ response_type: 'code', code_challenge_method: 'S256', resource, scope: 'tools:read tools:write', redirect_uri: `${guardedBase}/console/sign-in` })) {
      assert(q.get(k) === v, `the authorization request's ${k} is ${q.get(k)}, want ${v}`);
    }
    assert(q.get('code_challenge') && q.get('state') && q.get('client_id'), `PKCE challenge, state and client_id sent: ${authorize.href}`);
    // The token: in this tab's sessionStorage only, for the endpoint, of the login.
    const where = await page.evaluate(() => {
      const t = JSON.parse(sessionStorage.getItem('tether-console:oauth-token:/mcp') || 'null');
      const token = t?.accessToken || '';
      return {
        token,
        local: !!token && Object.keys(localStorage).some((k) => (localStorage.getItem(k) || '').includes(token)),
        url: !!token && location.href.includes(token),
      };
    });
    assert(where.token && !where.local && !where.url, `the access token is in sessionStorage only: ${JSON.stringify({ ...where, token: !!where.token })}`);
    const claims = JSON.parse(Buffer.from(where.token.split('.')[1], 'base64url').toString());
    assert([].concat(claims.aud).includes(resource) && claims.iss === issuer && claims.sub === login, `the token's claims: ${JSON.stringify(claims)}`);

    // 3. A reload: the same session, the result still shown, a new call, no sign-in.
    page.on('request', onRequest);
    const initializes = [];
    const onInit = (r) => { if (r.method() === 'POST' && (r.postData() || '').includes('"method":"initialize"')) initializes.push(r.url()); };
    page.on('request', onInit);
    await page.reload();
    await waitFor('the same session after the reload', async () => (await sessionId(page)) === session);
    await page.getByTestId('tool-thought').waitFor({ timeout: 30_000 });
    const kept = page.locator(`li.call[data-call="${first.key}"]`);
    await kept.getByTestId('result').waitFor();
    assert((await who.textContent()).includes(login), 'still signed in after the reload');
    const second = await call(page, 'thought', { thought: 'After the reload', thoughtNumber: 2, totalThoughts: 2, nextThoughtNeeded: false });
    await second.card.getByTestId('result').waitFor({ timeout: 30_000 });
    assert((await second.card.getByTestId('error').count()) === 0, 'the call after the reload succeeded');
    await page.locator('#thoughts li', { hasText: 'After the reload' }).waitFor();
    page.off('request', onInit);
    assert(toProvider.length === 0, `no trip to the provider on reload: ${toProvider}`);
    assert(initializes.length === 0, `no initialize after the reload: ${initializes}`);
    await shot(page, '10c-after-reload');

    // 4. An expired token, then a refused one (its signature spoilt), bring
    //    the sign-in back; signing in again goes on in the same session.
    await page.evaluate(() => {
      const key = 'tether-console:oauth-token:/mcp';
      sessionStorage.setItem(key, JSON.stringify({ ...JSON.parse(sessionStorage.getItem(key)), expiresAt: Date.now() - 1000 }));
    });
    await page.reload();
    await page.getByTestId('sign-in').waitFor({ timeout: 30_000 });
    assert(!(await who.isVisible()), 'not shown as signed in with an expired token');
    assert(/expired/.test(await page.getByTestId('notice').textContent()), `the notice says the sign-in expired: ${await page.getByTestId('notice').textContent()}`);
    assert(await page.evaluate(() => sessionStorage.getItem('tether-console:oauth-token:/mcp') === null), 'the expired token is forgotten');
    await page.evaluate((token) => {
      sessionStorage.setItem('tether-console:oauth-token:/mcp', JSON.stringify({ accessToken: token, expiresAt: Date.now() + 600_000, subject: 'console-user' }));
    }, where.token);
    await page.evaluate(() => {
      const key = 'tether-console:oauth-token:/mcp';
      const t = JSON.parse(sessionStorage.getItem(key));
      const [h, p] = t.accessToken.split('.');
      sessionStorage.setItem(key, JSON.stringify({ ...t, accessToken: `${h}.${p}.AAAA` }));
    });
    await page.reload();
    await page.getByTestId('sign-in').waitFor({ timeout: 30_000 });
    assert(!(await who.isVisible()), 'not shown as signed in with a refused token');
    assert(/refused/.test(await page.getByTestId('notice').textContent()), `the notice says the token was refused: ${await page.getByTestId('notice').textContent()}`);
    await shot(page, '10d-token-refused');
    await page.getByTestId('sign-in').click();
    // The provider may remember the login and the consent: then the tab comes straight back.
    const forms = [];
    await waitFor('the console after signing in again', async () => {
      try {
        const u = new URL(page.url());
        if (u.origin === issuer) {
          if (await page.locator('input[name="login"]').isVisible()) {
            forms.push('login');
            await page.fill('input[name="login"]', login);
            await page.fill('input[name="password"]', 'any-password');
            await page.click('button[type="submit"]');
          } else if ((await page.locator('input[name="prompt"][value="consent"]').count()) > 0) {
            forms.push('consent');
            await page.click('button[type="submit"]');
          }
          return false;
        }
        return u.origin === guardedBase && u.pathname === '/console/' && (await sessionId(page)) === session && (await who.isVisible());
      } catch {
        return false; // the page navigated while being looked at: look again
      }
    }, 60_000);
    const third = await call(page, 'thought', { thought: 'Signed in again', thoughtNumber: 3, totalThoughts: 3, nextThoughtNeeded: false });
    await third.card.getByTestId('result').waitFor({ timeout: 30_000 });
    assert((await third.card.getByTestId('error').count()) === 0, 'the call after signing in again succeeded');
    await page.evaluate(() => window.scrollTo(0, 0));
    await shot(page, '10e-signed-in-again');

    // 5. The policies in Chromium: the console page cannot reach the provider;
    //    the sign-in page can, only when its URL names the provider's origin.
    const probe = await context.newPage();
    try {
      const reach = async (url) => {
        await probe.goto(url);
        return probe.evaluate(async (target) => {
          const violation = new Promise((resolve) => document.addEventListener('securitypolicyviolation', (e) => resolve(e.effectiveDirective), { once: true }));
          try {
            return `HTTP ${(await fetch(target, { cache: 'no-store' })).status}`;
          } catch {
            const deadline = new Promise((resolve) => setTimeout(() => resolve('failed without a policy violation'), 10_000));
            return Promise.race([violation.then((directive) => `blocked by ${directive}`), deadline]);
          }
        }, `${issuer}/.well-known/oauth-authorization-server`);
      };
      const fromConsole = await reach(`${guardedBase}/console/`);
      const fromSignIn = await reach(`${guardedBase}/console/sign-in?connect=${encodeURIComponent(issuer)}`);
      const fromBareSignIn = await reach(`${guardedBase}/console/sign-in`);
      assert(fromConsole === 'blocked by connect-src', `the console page and the provider: ${fromConsole}`);
      assert(fromSignIn === 'HTTP 200', `the sign-in page naming the provider could not reach it: ${fromSignIn}`);
      assert(fromBareSignIn === 'blocked by connect-src', `the sign-in page naming nothing and the provider: ${fromBareSignIn}`);
    } finally {
      await probe.close();
    }
    return `Connect -> ${issuer} login + consent -> back signed in as ${login} (aud ${resource}); session ${session} kept across a reload with no sign-in; an expired and a refused token brought Sign in back, signing in again (${forms.length ? `forms: ${forms.join(', ')}` : 'the provider remembered the login and consent'}) went on in the same session; connect-src: the console page blocked, the sign-in page allowed only when it names the provider`;
  } finally {
    page.off('request', onRequest);
    await context.unroute('**/*', local).catch(() => {});
    guarded?.kill('SIGKILL');
    as.kill('SIGKILL');
  }
}

// ------------------------------------------------------------------ main

async function main() {
  port = await freePort();
  base = `http://127.0.0.1:${port}`;
  await startUpstream();
  await startTether();
  const context = await chromium.launchPersistentContext(path.join(TMP, 'profile'), {
    executablePath: CHROMIUM,
    headless: true,
    viewport: { width: 1280, height: 800 },
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
  const page = context.pages()[0] || (await context.newPage());
  page.setDefaultTimeout(20_000);
  const problems = [];
  page.on('console', (m) => {
    if (m.type() === 'error' && /Content Security Policy|Refused to/i.test(m.text())) problems.push(m.text());
  });
  page.on('pageerror', (e) => problems.push(`uncaught: ${e.message}`));

  const checks = [
    ['connect-and-call', connectAndCall],
    ['reload-mid-call', reloadMidCall],
    ['kill-9-and-restart', killAndRestart],
    ['elicitation', elicitation],
    ['two-tabs', twoTabs],
    ['unknown-session', unknownSession],
    ['token', token],
    ['virtual-server', virtualServer],
    ['oauth-sign-in', oauthSignIn],
  ].filter(([name]) => !process.env.CONSOLE_CHECKS || process.env.CONSOLE_CHECKS.split(',').includes(name));
  let failed = 0;
  const summary = [];
  for (const [name, check] of checks) {
    try {
      const what = await check(page);
      if (problems.length) throw new Error(`the page reported: ${problems.splice(0).join(' | ')}`);
      summary.push(`PASS ${name}: ${what}`);
      console.log(`PASS ${name}`);
    } catch (e) {
      failed += 1;
      summary.push(`FAIL ${name}: ${e.message}`);
      console.log(`FAIL ${name}: ${e.stack || e.message}`);
      await shot(page, `fail-${name}`).catch(() => {});
      if (server?.exitCode !== null) await startTether().catch(() => {});
    }
  }
  await context.close();
  await stopTether();
  upstream?.kill('SIGTERM');
  if (failed || VERBOSE) {
    console.log('---- tether log (last 60 lines) ----');
    console.log(fs.readFileSync(LOG, 'utf8').split('\n').slice(-60).join('\n'));
  }
  console.log('\nconsole summary:');
  for (const line of summary) console.log(`  ${line}`);
  console.log(`console: ${checks.length - failed} passed, ${failed} failed; screenshots in ${path.relative(process.cwd(), SHOTS) || SHOTS}`);
  fs.rmSync(TMP, { recursive: true, force: true });
  process.exit(failed ? 1 : 0);
}

main().catch(async (e) => {
  console.error(`console tests: ${e.stack || e.message}`);
  await stopTether().catch(() => {});
  upstream?.kill('SIGKILL');
  if (fs.existsSync(LOG)) console.error(fs.readFileSync(LOG, 'utf8').split('\n').slice(-40).join('\n'));
  process.exit(1);
});
