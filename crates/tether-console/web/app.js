// The console page: connect to an endpoint of this server, list what it
// offers, call tools, and keep every call across a reload (see store.js for
// what is kept where, mcp.js for how a stream is re-attached, oauth.js for
// the sign-in at an OAuth authorization server).

import { Client, SessionGone, AuthNeeded, RpcError, newRequestId } from './mcp.js';
import { buildForm, el } from './form.js';
import * as oauth from './oauth.js';
import * as store from './store.js';

const $ = (id) => document.getElementById(id);
const ENDPOINT_RE = /^\/mcp(\/[A-Za-z0-9_-]{1,64})?$/;
const MAX_LOGS = 200;
const MAX_SEEN = 1000;
const CAPABILITIES = { roots: { listChanged: true }, elicitation: {} };

const state = {
  endpoint: '/mcp',
  client: null,
  generation: 0, // bumped on every (re)connect; stale async work checks it
  tools: [],
  selected: null,
  form: null,
  calls: [], // this tab's calls on this endpoint (store.calls)
  cards: new Map(), // call key -> DOM parts
  recovering: false,
  signIn: null, // {endpoint, challenge, granted} while the server wants a sign-in
};

// ------------------------------------------------------------------ status

function setStatus(text, kind = '') {
  const s = $('status');
  s.textContent = text;
  s.dataset.kind = kind;
}

function notice(text) {
  const n = $('notice');
  n.replaceChildren(el('span', { text }), el('button', { type: 'button', class: 'dismiss', 'aria-label': 'Dismiss notice', text: '×' }));
  n.hidden = false;
  n.querySelector('button').addEventListener('click', () => { n.hidden = true; });
}

function showSession(session) {
  $('session-id').textContent = session ? session.id : 'none';
  $('disconnect').hidden = !session;
}

// ------------------------------------------------------------------ calls

function saveCalls() {
  store.calls.save(state.endpoint, state.calls);
}

function callByRequest(id) {
  return state.calls.find((c) => c.requestId === id);
}

/** Starts a tools/call as a durable call: recorded before it is POSTed. */
function startCall(tool, args) {
  const key = newRequestId();
  const call = {
    key,
    requestId: key,
    tool,
    args,
    sessionId: state.client.session.id,
    state: 'running',
    startedAt: Date.now(),
    lastEventId: null,
    resumeToken: null,
    rounds: 0,
    joined: [],
    progress: null,
    seen: [],
    logs: [],
    asks: [],
  };
  state.calls.push(call);
  saveCalls();
  renderCall(call);
  runCall(call, state.generation);
  return call;
}

function paramsOf(call) {
  const meta = { progressToken: call.key };
  if (call.resumeToken !== null) meta.resumeToken = call.resumeToken;
  return { name: call.tool, arguments: call.args, _meta: meta };
}

/** Every event of a call's stream, handled and stored in one step. */
function onCallEvent(call, msg, eventId) {
  const isAnswer = !!msg && typeof msg === 'object' && msg.method === undefined && msg.id === call.requestId;
  if (msg && typeof msg === 'object') {
    if (typeof msg.method === 'string' && 'id' in msg) {
      if (!call.asks.some((a) => a.id === msg.id)) call.asks.push({ id: msg.id, method: msg.method, params: msg.params || {} });
    } else if (msg.method === 'notifications/progress') {
      const p = msg.params || {};
      if (p.progressToken === call.key && typeof p.progress === 'number') {
        call.progress = { progress: p.progress, total: typeof p.total === 'number' ? p.total : null, message: typeof p.message === 'string' ? p.message : '' };
        call.seen.push(p.progress);
        if (call.seen.length > MAX_SEEN) call.seen.splice(0, call.seen.length - MAX_SEEN);
      }
    } else if (msg.method === 'notifications/message') {
      const p = msg.params || {};
      call.logs.push({ level: String(p.level || 'info'), logger: p.logger ? String(p.logger) : '', data: p.data });
    } else if (typeof msg.method === 'string') {
      call.logs.push({ level: 'notice', logger: '', data: msg.method });
    } else if (msg.id === call.requestId && ('result' in msg || 'error' in msg)) {
      finishRound(call, msg);
    }
    if (call.logs.length > MAX_LOGS) call.logs.splice(0, call.logs.length - MAX_LOGS);
  }
  if (eventId && call.state === 'running' && !isAnswer) call.lastEventId = eventId;
  saveCalls();
  renderCall(call);
  if (msg && typeof msg.method === 'string' && 'id' in msg) serveAsk(call, call.asks.find((a) => a.id === msg.id));
}

/** The answer to one round: the call ends, or (a resumable tool) goes on with its resume token. */
function finishRound(call, msg) {
  call.lastEventId = null;
  if (msg.error) {
    call.state = 'error';
    call.error = { code: msg.error.code, message: String(msg.error.message ?? 'error'), data: msg.error.data };
    return;
  }
  const result = msg.result && typeof msg.result === 'object' ? msg.result : {};
  const meta = result._meta && typeof result._meta === 'object' ? result._meta : {};
  const next = meta.nextResumeToken;
  const pending = meta['dev.tether/pending'] === true;
  if (call.rounds === 0 && (next === undefined || next === null)) {
    call.state = 'done';
    call.result = result;
    return;
  }
  call.rounds += 1;
  if (!pending && Array.isArray(result.content)) call.joined.push(...result.content);
  if (next === undefined || next === null) {
    call.state = 'done';
    call.result = { ...result, content: call.joined };
    call.joined = [];
    return;
  }
  // Another round: a new request with the same params but the token; safe to resend.
  call.resumeToken = next;
  call.requestId = newRequestId();
  call.progress = { progress: call.rounds, total: null, message: pending ? 'still working' : `received ${call.rounds} part(s)` };
}

async function runCall(call, generation) {
  const client = state.client;
  try {
    while (call.state === 'running' && generation === state.generation) {
      const requestId = call.requestId;
      await client.call({
        id: requestId,
        method: 'tools/call',
        params: paramsOf(call),
        lastEventId: call.lastEventId,
        onEvent: (msg, eventId) => onCallEvent(call, msg, eventId),
      });
      if (call.state === 'running' && call.rounds > 0) await new Promise((r) => setTimeout(r, 200));
    }
  } catch (e) {
    if (generation !== state.generation) return; // reconnected meanwhile: the new client owns the call
    if (e instanceof SessionGone) {
      sessionGone(e);
      return;
    }
    if (e instanceof AuthNeeded) {
      if (call.lastEventId === null && call.resumeToken === null) {
        // The POST itself was refused: the call never started.
        call.state = 'error';
        call.error = { message: `refused (${e.message}); it did not run` };
        saveCalls();
        renderCall(call);
      }
      authNeeded(e);
      return;
    }
    call.state = 'error';
    call.error = { message: callFailure(e, call) };
    saveCalls();
    renderCall(call);
  }
  if (call.state !== 'running' && generation === state.generation) {
    setStatus('connected', 'ok');
    afterCall(call);
  }
}

function callFailure(e, call) {
  if (e instanceof TypeError && call.lastEventId === null) {
    return `could not reach the server (${e.message}); the call may or may not have started`;
  }
  return e.message || String(e);
}

function afterCall(call) {
  if (call.tool === 'thought' || call.tool === 'init') refreshNotebook();
}

// ------------------------------------------------------------------ server requests

function parseRoots() {
  return store.roots
    .get()
    .split('\n')
    .map((line) => line.trim())
    .filter(Boolean)
    .map((line) => {
      const space = line.search(/\s/);
      return space < 0 ? { uri: line } : { uri: line.slice(0, space), name: line.slice(space + 1).trim() };
    });
}

async function answerAsk(call, ask, result, error) {
  const client = state.client;
  try {
    if (error) await client.answerError(ask.id, error.code, error.message);
    else await client.answer(ask.id, result);
  } catch (e) {
    if (e instanceof SessionGone) return sessionGone(e);
    if (call) {
      call.logs.push({ level: 'error', logger: 'console', data: `could not answer ${ask.method}: ${e.message}` });
      renderCall(call);
    }
    return;
  }
  if (call) {
    call.asks = call.asks.filter((a) => a.id !== ask.id);
    call.logs.push({ level: 'info', logger: 'console', data: `answered ${ask.method}` });
    saveCalls();
    renderCall(call);
  }
}

/** What the console answers by itself; elicitations wait for the person (their form is in the call's card). */
function serveAsk(call, ask) {
  if (!ask) return;
  switch (ask.method) {
    case 'roots/list':
      return answerAsk(call, ask, { roots: parseRoots() });
    case 'ping':
      return answerAsk(call, ask, {});
    case 'elicitation/create':
      return; // renderCall shows its form
    default:
      return answerAsk(call, ask, null, { code: -32601, message: `the tether console does not support ${ask.method}` });
  }
}

// ------------------------------------------------------------------ rendering

function card(call) {
  let parts = state.cards.get(call.key);
  if (parts) return parts;
  const li = el('li', { class: 'call', 'data-call': call.key, 'aria-labelledby': `h-${call.key}` });
  const heading = el('h3', { id: `h-${call.key}` });
  const args = el('details', {}, el('summary', { text: 'Arguments' }), el('pre', { text: JSON.stringify(call.args, null, 2) }));
  const bar = el('progress', { testid: 'progress', 'aria-label': `progress of ${call.tool}` });
  const barText = el('span', { class: 'progress-text' });
  const progress = el('div', { class: 'progress-row' }, bar, barText);
  const logs = el('ul', { class: 'logs', 'aria-label': 'log messages' });
  const asks = el('div', { class: 'asks' });
  const outcome = el('div', { class: 'outcome' });
  const cancel = el('button', { type: 'button', class: 'cancel', text: 'Cancel call' });
  cancel.addEventListener('click', () => cancelCall(call));
  li.append(heading, args, progress, logs, asks, outcome, cancel);
  $('calls').prepend(li);
  parts = { li, heading, bar, barText, progress, logs, asks, outcome, cancel, askForms: new Map(), logCount: 0, shown: null };
  state.cards.set(call.key, parts);
  return parts;
}

function renderCall(call) {
  const p = card(call);
  p.li.dataset.state = call.state;
  p.li.dataset.progressSeen = call.seen.join(',');
  p.li.dataset.logCount = String(call.logs.length);
  p.heading.replaceChildren(
    el('span', { class: 'tool-name', text: call.tool }),
    el('span', { class: `badge ${call.state}`, text: call.state }),
    el('small', { class: 'rid', text: call.key }),
  );
  if (call.progress) {
    const { progress, total, message } = call.progress;
    if (total && total > 0) {
      p.bar.max = total;
      p.bar.value = Math.min(progress, total);
    } else {
      p.bar.removeAttribute('value');
    }
    p.barText.textContent = `${progress}${total ? ` / ${total}` : ''}${message ? ` — ${message}` : ''}`;
  } else if (call.state === 'running') {
    p.bar.removeAttribute('value');
    p.barText.textContent = call.lastEventId ? 'working' : 'starting';
  }
  p.progress.hidden = !call.progress && call.state !== 'running';
  // Logs: append what is new (the list is kept, so a reload re-renders it all).
  if (p.logCount > call.logs.length) {
    p.logs.replaceChildren();
    p.logCount = 0;
  }
  for (const log of call.logs.slice(p.logCount)) {
    const data = typeof log.data === 'string' ? log.data : JSON.stringify(log.data);
    p.logs.append(el('li', { class: `log ${log.level}` }, el('span', { class: 'level', text: log.level }), log.logger ? el('span', { class: 'logger', text: log.logger }) : '', ' ', data));
  }
  p.logCount = call.logs.length;
  p.logs.hidden = call.logs.length === 0;
  renderAsks(call, p);
  p.cancel.hidden = call.state !== 'running';
  if (call.state !== 'running' && p.shown !== call.state) {
    p.shown = call.state;
    p.outcome.replaceChildren(call.state === 'done' ? renderResult(call.result) : renderError(call.error));
  }
}

function renderAsks(call, p) {
  const open = new Set(call.state === 'running' ? call.asks.filter((a) => a.method === 'elicitation/create').map((a) => JSON.stringify(a.id)) : []);
  for (const [id, form] of p.askForms) {
    if (!open.has(id)) {
      form.remove();
      p.askForms.delete(id);
    }
  }
  for (const ask of call.asks) {
    const id = JSON.stringify(ask.id);
    if (!open.has(id) || p.askForms.has(id)) continue;
    const form = elicitationForm(call, ask);
    p.askForms.set(id, form);
    p.asks.append(form);
  }
}

function elicitationForm(call, ask) {
  const params = ask.params || {};
  const form = el('form', { class: 'elicitation', testid: 'elicitation', novalidate: true, 'aria-label': 'The server asks' });
  const fields = el('div', { class: 'fields' });
  const error = el('p', { class: 'form-error', role: 'alert', hidden: true });
  const builder = buildForm(fields, params.requestedSchema || {}, { testPrefix: 'elicit-' });
  const submit = el('button', { type: 'submit', testid: 'elicitation-submit', text: 'Send answer' });
  const decline = el('button', { type: 'button', text: 'Decline' });
  const cancel = el('button', { type: 'button', text: 'Cancel' });
  form.append(el('p', { class: 'ask-message' }, el('strong', { text: 'The server asks: ' }), String(params.message ?? '')), fields, error, el('div', { class: 'buttons' }, submit, decline, cancel));
  const send = (result) => {
    for (const b of form.querySelectorAll('button')) b.disabled = true;
    answerAsk(call, ask, result).finally(() => { for (const b of form.querySelectorAll('button')) b.disabled = false; });
  };
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    const out = builder.collect();
    if (out.errors) {
      error.textContent = out.errors.join('; ');
      error.hidden = false;
      return;
    }
    error.hidden = true;
    send({ action: 'accept', content: out.value });
  });
  decline.addEventListener('click', () => send({ action: 'decline' }));
  cancel.addEventListener('click', () => send({ action: 'cancel' }));
  return form;
}

function renderResult(result) {
  const box = el('div', { class: result?.isError ? 'result is-error' : 'result', testid: 'result' });
  if (result?.isError) box.append(el('p', { class: 'label', text: 'The tool reported an error:' }));
  const content = Array.isArray(result?.content) ? result.content : [];
  for (const item of content) box.append(renderContent(item));
  if (result && result.structuredContent !== undefined) {
    box.append(el('details', { open: content.length === 0 }, el('summary', { text: 'Structured content' }), el('pre', { text: JSON.stringify(result.structuredContent, null, 2) })));
  }
  if (content.length === 0 && result?.structuredContent === undefined) box.append(el('pre', { text: JSON.stringify(result ?? null, null, 2) }));
  return box;
}

function renderContent(item) {
  if (!item || typeof item !== 'object') return el('pre', { text: JSON.stringify(item) });
  switch (item.type) {
    case 'text':
      return el('pre', { class: 'text', text: String(item.text ?? '') });
    case 'image': {
      const mime = typeof item.mimeType === 'string' && /^image\/[a-z0-9.+-]+$/i.test(item.mimeType) ? item.mimeType : 'application/octet-stream';
      const data = typeof item.data === 'string' && /^[A-Za-z0-9+/=\s]*$/.test(item.data) ? item.data.replace(/\s/g, '') : '';
      return el('img', { class: 'image', src: `data:${mime};base64,${data}`, alt: `image result (${mime})` });
    }
    case 'resource': {
      const r = item.resource || {};
      return el('div', { class: 'resource' }, el('code', { text: String(r.uri ?? '') }), el('pre', { text: typeof r.text === 'string' ? r.text : `(${r.mimeType || 'binary'} content)` }));
    }
    case 'resource_link':
      return el('p', { class: 'resource' }, 'resource: ', el('code', { text: String(item.uri ?? '') }), item.name ? ` (${item.name})` : '');
    default:
      return el('pre', { text: JSON.stringify(item, null, 2) });
  }
}

function renderError(error) {
  const e = error || { message: 'unknown error' };
  return el('div', { class: 'error', testid: 'error', role: 'alert' },
    el('strong', { text: e.code !== undefined ? `Error ${e.code}: ` : 'Error: ' }), String(e.message ?? ''),
    e.data !== undefined ? el('pre', { text: JSON.stringify(e.data, null, 2) }) : '');
}

async function cancelCall(call) {
  if (call.state !== 'running') return;
  try {
    await state.client.notify('notifications/cancelled', { requestId: call.requestId, reason: 'cancelled in the console' });
    call.logs.push({ level: 'info', logger: 'console', data: 'cancel sent' });
  } catch (e) {
    call.logs.push({ level: 'error', logger: 'console', data: `could not cancel: ${e.message}` });
  }
  saveCalls();
  renderCall(call);
}

// ------------------------------------------------------------------ lists

async function listAll(method, key, params = {}) {
  const items = [];
  let cursor;
  for (let page = 0; page < 50; page++) {
    const result = await state.client.request(method, cursor ? { ...params, cursor } : params);
    if (Array.isArray(result?.[key])) items.push(...result[key]);
    cursor = result?.nextCursor;
    if (!cursor) break;
  }
  return items;
}

function renderTools(tools) {
  const list = $('tools');
  list.replaceChildren();
  if (tools.length === 0) list.append(el('li', { class: 'empty', text: 'No tools.' }));
  for (const tool of tools) {
    if (!tool || typeof tool.name !== 'string') continue;
    const member = memberOf(tool);
    const label = member ? [tool.title || tool.name, el('span', { class: 'member', testid: `tool-member-${tool.name}`, text: member })] : [tool.title || tool.name];
    const button = el('button', { type: 'button', class: 'tool', testid: `tool-${tool.name}`, 'aria-pressed': 'false', title: tool.description || '' }, ...label);
    button.addEventListener('click', () => selectTool(tool));
    list.append(el('li', {}, button));
  }
}

/** The member of a virtual server a tool or prompt comes from (tether names it in `_meta`). */
function memberOf(item) {
  const member = item && item._meta && item._meta['dev.tether/member'];
  return typeof member === 'string' ? member : '';
}

function selectTool(tool) {
  state.selected = tool;
  for (const b of $('tools').querySelectorAll('button.tool')) b.setAttribute('aria-pressed', String(b.dataset.testid === `tool-${tool.name}`));
  $('tool-h').textContent = tool.title || tool.name;
  const member = memberOf(tool);
  $('tool-desc').textContent = (member ? `From member ${member}. ` : '') + (tool.description || '');
  $('tool-form').hidden = false;
  $('tool-form-error').hidden = true;
  state.form = buildForm($('tool-fields'), tool.inputSchema || {}, { testPrefix: 'arg-' });
}

function renderSimpleList(id, items, describe) {
  const list = $(id);
  list.replaceChildren();
  if (items.length === 0) list.append(el('li', { class: 'empty', text: 'None listed.' }));
  for (const item of items) list.append(describe(item));
}

async function refreshLists(generation) {
  const caps = state.client.session.capabilities || {};
  const tools = await listAll('tools/list', 'tools');
  if (generation !== state.generation) return;
  state.tools = tools;
  renderTools(tools);
  const names = new Set(tools.map((t) => t?.name));
  $('notebook').hidden = !(names.has('thought') && names.has('session'));
  if (!$('notebook').hidden) refreshNotebook();
  const resources = caps.resources ? await listAll('resources/list', 'resources').catch(() => []) : [];
  if (generation !== state.generation) return;
  renderSimpleList('resources', resources, (r) => {
    const button = el('button', { type: 'button', class: 'linkish', text: r.name || r.uri, title: r.uri });
    button.addEventListener('click', () => readResource(r));
    return el('li', {}, button, r.description ? el('span', { class: 'hint', text: r.description }) : '');
  });
  const prompts = caps.prompts ? await listAll('prompts/list', 'prompts').catch(() => []) : [];
  if (generation !== state.generation) return;
  renderSimpleList('prompts', prompts, (p) => el('li', {}, el('strong', { text: p.name }), p.description ? el('span', { class: 'hint', text: ` ${p.description}` }) : ''));
}

async function readResource(r) {
  const key = newRequestId();
  const call = { key, requestId: key, tool: `read ${r.uri}`, args: { uri: r.uri }, state: 'running', seen: [], logs: [], asks: [], progress: null, lastEventId: null, rounds: 0 };
  renderCall(call);
  try {
    const result = await state.client.request('resources/read', { uri: r.uri });
    call.state = 'done';
    call.result = { content: (result?.contents || []).map((c) => ({ type: 'resource', resource: c })) };
  } catch (e) {
    call.state = 'error';
    call.error = e instanceof RpcError ? { code: e.code, message: e.message } : { message: e.message };
  }
  renderCall(call);
}

// ------------------------------------------------------------------ notebook

let notebookBusy = false;
async function refreshNotebook() {
  if (notebookBusy || !state.client || $('notebook').hidden) return;
  notebookBusy = true;
  const generation = state.generation;
  const meta = $('notebook-meta');
  try {
    const result = await state.client.request('tools/call', { name: 'session', arguments: { operation: 'get' } });
    if (generation !== state.generation) return;
    const data = notebookData(result);
    const thoughts = Array.isArray(data?.thoughts) ? data.thoughts : [];
    const s = data?.session || data || {};
    meta.textContent = result?.isError
      ? textOf(result)
      : `${s.title ? `“${s.title}” · ` : ''}${thoughts.length} thought(s)${s.mcpRootUri ? ` · root ${s.mcpRootUri}` : ''}`;
    const list = $('thoughts');
    list.replaceChildren();
    for (const t of thoughts) {
      const label = [t.isRevision ? `revises ${t.revisesThought}` : '', t.branchId ? `branch ${t.branchId}` : ''].filter(Boolean).join(', ');
      list.append(el('li', { value: Number.isInteger(t.thoughtNumber) ? t.thoughtNumber : null }, String(t.thought ?? ''), label ? el('span', { class: 'hint', text: ` (${label})` }) : ''));
    }
  } catch (e) {
    meta.textContent = `could not read the notebook: ${e.message}`;
  } finally {
    notebookBusy = false;
  }
}

function textOf(result) {
  return (Array.isArray(result?.content) ? result.content : []).filter((c) => c?.type === 'text').map((c) => c.text).join('\n');
}

function notebookData(result) {
  if (result?.structuredContent && typeof result.structuredContent === 'object') return result.structuredContent;
  try {
    return JSON.parse(textOf(result));
  } catch {
    return null;
  }
}

// ------------------------------------------------------------------ connecting

function askForToken(message) {
  $('token-wrap').hidden = false;
  notice(`${message}. This server needs a bearer token: type it in the Token field and connect again (it stays in this tab only).`);
  setStatus('token needed', 'error');
  $('token').focus();
}

/** The bearer token for `endpoint`: the one signed in with, else the one typed. */
function tokenFor(endpoint) {
  return store.oauthToken.get(endpoint)?.accessToken || store.token.get();
}

/**
 * 401 (or a 403 asking for more scopes). A server without OAuth gets the
 * Token field, as before; an OAuth resource server (its challenge names its
 * resource metadata) gets the sign-in: at once when the person pressed
 * Connect, else through the Sign in button.
 */
function authNeeded(error, interactive = false) {
  const challenge = error.challenge;
  if (!challenge?.resourceMetadata) return askForToken(error.message);
  const endpoint = state.endpoint;
  const had = store.oauthToken.peek(endpoint);
  const stepUp = challenge.error === 'insufficient_scope';
  if (had && !stepUp) store.oauthToken.clear(endpoint); // refused or expired
  state.signIn = { endpoint, challenge, granted: had?.scope || '' };
  showSignedIn(endpoint);
  $('sign-in').hidden = false;
  const why = stepUp
    ? `This needs more scopes (${challenge.scope || 'unnamed'})${challenge.errorDescription ? `: ${challenge.errorDescription}` : ''}`
    : had?.expired
      ? `The sign-in of ${endpoint} expired`
      : had
        ? `The server refused the sign-in's token${challenge.errorDescription ? ` (${challenge.errorDescription})` : ''}`
        : `${error.message}: ${endpoint} needs you to sign in`;
  notice(`${why}. Sign in takes this tab to the server's sign-in page and back; the token stays in this tab only.`);
  setStatus('sign-in needed', 'error');
  if (interactive) signIn();
  else $('sign-in').focus();
}

async function signIn() {
  const wanted = state.signIn;
  if (!wanted) return;
  $('sign-in').disabled = true;
  setStatus('signing in', 'busy');
  try {
    await oauth.startSignIn(wanted); // leaves the page
  } catch (e) {
    notice(`Cannot sign in: ${e.message}`);
    setStatus('not signed in', 'error');
  } finally {
    $('sign-in').disabled = false;
  }
}

function showSignedIn(endpoint) {
  const t = store.oauthToken.get(endpoint);
  $('signed-in').hidden = !t;
  if (t) {
    $('signed-in-as').textContent = t.subject ? `Signed in as ${t.subject}` : 'Signed in';
    $('signed-in-as').title = `at ${t.issuer}, for ${t.resource}${t.scope ? `, scope ${t.scope}` : ''}${t.expiresAt ? `, until ${new Date(t.expiresAt).toLocaleTimeString()}` : ''}`;
    $('sign-in').hidden = true;
  }
}

function signOut() {
  store.oauthToken.clear(state.endpoint);
  state.generation++;
  state.client?.close();
  state.client = null;
  showSignedIn(state.endpoint);
  showSession(null);
  setStatus('signed out (the session is kept for the next sign-in)', '');
}

/** 404 on the session: forget it, say so, start a fresh one. */
function sessionGone(error) {
  if (state.recovering) return;
  state.recovering = true;
  const old = state.client?.session?.id || '';
  store.session.clear(state.endpoint);
  for (const call of state.calls) {
    if (call.state === 'running') {
      call.state = 'error';
      call.error = { message: 'the session ended before this call finished (the server no longer knows it)' };
      renderCall(call);
    }
  }
  saveCalls();
  notice(`The server no longer knows session ${old.slice(0, 12)}… (${error.message}): it expired, was ended, or its store was reset. A new session was started; calls of the old one cannot be re-attached.`);
  connect(state.endpoint).finally(() => { state.recovering = false; });
}

async function connect(endpoint, interactive = false) {
  const generation = ++state.generation;
  state.client?.close();
  if (state.endpoint !== endpoint) {
    state.cards.clear();
    $('calls').replaceChildren();
  }
  state.endpoint = endpoint;
  store.tabEndpoint.set(endpoint);
  store.endpoints.add(endpoint);
  renderEndpoints();
  const url = new URL(location.href);
  url.searchParams.set('endpoint', endpoint);
  history.replaceState(null, '', url);
  $('endpoint').value = endpoint;
  state.calls = store.calls.all(endpoint);
  for (const call of state.calls) renderCall(call);

  showSignedIn(endpoint);
  const stored = store.session.get(endpoint);
  const client = new Client({ endpoint, token: tokenFor(endpoint), session: stored && typeof stored.id === 'string' ? stored : null, onStatus: setStatus });
  state.client = client;
  try {
    if (!client.session) {
      setStatus('starting a session', 'busy');
      const session = await client.initialize(CAPABILITIES);
      if (generation !== state.generation) return;
      store.session.set(endpoint, session);
      answerStandalone(client, generation);
    } else {
      setStatus('re-attaching to the stored session', 'busy');
    }
    showSession(client.session);
    $('sign-in').hidden = true;
    state.signIn = null;
    for (const call of state.calls) {
      if (call.state !== 'running') continue;
      if (call.sessionId !== client.session.id) {
        call.state = 'error';
        call.error = { message: 'this call belonged to an earlier session' };
      } else if (call.lastEventId || call.resumeToken !== null) {
        runCall(call, generation);
        for (const ask of call.asks) serveAsk(call, ask);
      } else {
        call.state = 'error';
        call.error = { message: 'the page was reloaded before the server sent anything for this call, so it cannot be re-attached; it may or may not have run' };
      }
      renderCall(call);
    }
    saveCalls();
    await refreshLists(generation);
    if (generation === state.generation && !client.reconnecting) setStatus('connected', 'ok');
  } catch (e) {
    if (generation !== state.generation) return;
    if (e instanceof SessionGone) return sessionGone(e);
    if (e instanceof AuthNeeded) return authNeeded(e, interactive);
    setStatus(`not connected: ${e.message}`, 'error');
    if (client.session && stored) showSession(client.session);
  }
}

/** Right after initialize: answer what the server asks outside any call (a roots/list). */
function answerStandalone(client, generation) {
  client
    .briefly(2500, (msg) => {
      if (generation !== state.generation || typeof msg?.method !== 'string' || !('id' in msg)) return;
      const ask = { id: msg.id, method: msg.method, params: msg.params || {} };
      if (ask.method === 'roots/list') answerAsk(null, ask, { roots: parseRoots() });
      else if (ask.method === 'ping') answerAsk(null, ask, {});
      else answerAsk(null, ask, null, { code: -32601, message: `the tether console answers ${ask.method} only within a call` });
    })
    .catch(() => {});
}

async function endSession() {
  const client = state.client;
  if (!client?.session) return;
  try {
    await fetch(state.endpoint, { method: 'DELETE', headers: client.headers('application/json') });
  } catch {
    // the server may be down; forget the session anyway
  }
  store.session.clear(state.endpoint);
  state.generation++;
  client.close();
  state.client = null;
  showSession(null);
  setStatus('session ended', '');
}

function renderEndpoints() {
  const list = $('endpoints');
  list.replaceChildren(...store.endpoints.get().map((e) => el('option', { value: e })));
}

// ------------------------------------------------------------------ wiring

function init() {
  renderEndpoints();
  $('roots').value = store.roots.get();
  const token = store.token.get();
  if (token) {
    $('token-wrap').hidden = false;
    $('token').value = token;
  }
  const fromUrl = new URL(location.href).searchParams.get('endpoint');
  const endpoint = fromUrl && ENDPOINT_RE.test(fromUrl) ? fromUrl : store.tabEndpoint.get() || '/mcp';
  $('endpoint').value = endpoint;
  if (fromUrl && !ENDPOINT_RE.test(fromUrl)) notice(`?endpoint=${fromUrl} is not /mcp or /mcp/NAME; using ${endpoint}.`);

  $('connect-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const value = $('endpoint').value.trim();
    if (!ENDPOINT_RE.test(value)) {
      notice(`${value || '(empty)'} is not an endpoint of this server: use /mcp or /mcp/NAME.`);
      $('endpoint').focus();
      return;
    }
    store.token.set($('token').value.trim());
    connect(value, true);
  });
  $('disconnect').addEventListener('click', endSession);
  $('sign-in').addEventListener('click', signIn);
  $('sign-out').addEventListener('click', signOut);
  $('tool-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    if (!state.selected || !state.client?.session) return;
    const out = state.form.collect();
    const error = $('tool-form-error');
    if (out.errors) {
      error.textContent = out.errors.join('; ');
      error.hidden = false;
      return;
    }
    error.hidden = true;
    startCall(state.selected.name, out.value);
  });
  $('roots-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    store.roots.set($('roots').value);
    setStatus('roots saved', 'ok');
    const client = state.client;
    if (client?.session) {
      client.notify('notifications/roots/list_changed').then(() => answerStandalone(client, state.generation)).catch(() => {});
    }
  });
  $('notebook-refresh').addEventListener('click', refreshNotebook);

  // A sign-in left half-way (the tab came back here without finishing it):
  // forget it, and the client it used, which the authorization server may no
  // longer know (the next sign-in registers again).
  const unfinished = store.signIn.get();
  if (unfinished) {
    if (unfinished.phase === 'authorize' && unfinished.issuer) store.oauthClient.clear(unfinished.metadata?.issuer || unfinished.issuer);
    store.signIn.clear();
  }
  showSignedIn(endpoint);
  const signedIn = store.signedIn.take();

  // Back from a sign-in, a reload or a link with ?endpoint=: pick up a stored session or this tab's calls at once.
  if (signedIn?.endpoint === endpoint || store.session.get(endpoint) || store.calls.all(endpoint).some((c) => c.state === 'running')) connect(endpoint);
  else for (const call of (state.calls = store.calls.all(endpoint))) renderCall(call);
  state.endpoint = endpoint;
}

init();
