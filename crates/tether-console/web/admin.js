// The operators' page at /console/admin, on the admin API (/admin/*).
// Panels: health (charts from /metrics), the calls in flight (pushed by
// the server on /admin/calls/stream), upstreams and virtual servers
// (/admin/endpoints, the keeper's /admin/keeper), sessions (paged and
// filtered, a detail view, ending one after a confirmation) and the audit
// log's latest decisions (/admin/audit).
//
// Everything shown that a client or an upstream chose is text (dom.js);
// the token is sent in a header only (api.js); a 401 anywhere shows the
// sign-in again and nothing else.

import { api, auth, setToken, query, followCalls } from '/console/admin/api.js';
import { el, fill, duration, shortId, endpointPath, str } from '/console/admin/dom.js';
import { Health } from '/console/admin/health.js';

const $ = (id) => document.getElementById(id);

/** Rows of calls drawn at most (the rest are counted). */
const MAX_CALL_ROWS = 200;
/** Calls the page keeps at most (the server's snapshot is at most 1,000). */
const MAX_CALLS = 1000;
const REFRESH_MS = 15_000;

let running = null; // {abort: AbortController, timers: []} while signed in
let health = null;

// ------------------------------------------------------------------ sign-in

function showSignIn(message) {
  $('dashboard').hidden = true;
  $('nav').hidden = true;
  $('who').hidden = true;
  $('sign-in').hidden = false;
  const error = $('sign-in-error');
  error.textContent = message || '';
  error.hidden = !message;
  $('token').value = '';
  $('token').focus();
}

function signOut(message) {
  if (running) {
    running.abort.abort();
    for (const t of running.timers) clearInterval(t);
    running = null;
  }
  health?.stop();
  setToken('');
  // Nothing of what the token showed stays on the page.
  for (const id of ['calls-rows', 'upstream-rows', 'virtual-rows', 'session-rows', 'audit-rows', 'keeper-facts']) fill($(id));
  fill($('session-detail'));
  $('session-detail').hidden = true;
  calls.clear();
  showSignIn(message);
}

auth.onRefused = () => {
  signOut('The server refused the admin token (401): sign in again with the token of --admin-token-env.');
};

async function signIn(token) {
  setToken(token);
  try {
    await api('/admin/endpoints');
  } catch (e) {
    if (e.status === 401) return; // onRefused showed the sign-in with its message
    setToken('');
    showSignIn(`Sign-in failed: ${e.message}`);
    return;
  }
  startDashboard();
}

$('sign-in-form').addEventListener('submit', (ev) => {
  ev.preventDefault();
  const token = $('token').value.trim();
  if (!token) {
    showSignIn('Type the admin token first.');
    return;
  }
  signIn(token);
});

$('sign-out').addEventListener('click', () => signOut(''));

// ------------------------------------------------------------------ dashboard

function startDashboard() {
  $('sign-in').hidden = true;
  $('sign-in-error').hidden = true;
  $('dashboard').hidden = false;
  $('nav').hidden = false;
  $('who').hidden = false;
  running = { abort: new AbortController(), timers: [] };
  if (!health) health = new Health($('charts'), $('health-note'));
  health.start();
  startCalls(running.abort.signal);
  loadUpstreams();
  loadSessions(null);
  loadAudit();
  running.timers.push(setInterval(loadUpstreams, REFRESH_MS));
  running.timers.push(setInterval(() => loadSessions(page.cursor, true), REFRESH_MS));
  running.timers.push(setInterval(loadAudit, REFRESH_MS));
  running.timers.push(setInterval(tickCalls, 1000));
}

// ------------------------------------------------------------------ calls

/** id -> {call, started: local ms} */
const calls = new Map();
let skew = 0; // server clock minus this page's
let drawQueued = false;

function setCallsState(state, detail) {
  const badge = $('calls-state');
  badge.textContent = state;
  badge.dataset.state = state;
  badge.title = detail || '';
}

function startCalls(signal) {
  followCalls((event, data) => {
    if (event === 'snapshot') {
      skew = (Number(data.now_ms) || Date.now()) - Date.now();
      calls.clear();
      for (const c of data.calls || []) calls.set(c.id, c);
      calls.total = data.total;
    } else if (event === 'start') {
      if (calls.size < MAX_CALLS) calls.set(data.id, data);
      calls.total = undefined;
    } else if (event === 'end') {
      calls.delete(data.id);
      calls.total = undefined;
    }
    queueDrawCalls();
  }, setCallsState, signal);
}

function queueDrawCalls() {
  if (drawQueued) return;
  drawQueued = true;
  requestAnimationFrame(() => {
    drawQueued = false;
    drawCalls();
  });
}

function drawCalls() {
  const list = [...calls.values()].sort((a, b) => a.started_ms - b.started_ms || a.id - b.id);
  const total = Math.max(calls.total ?? 0, list.length);
  $('calls-count').textContent = String(total);
  const rows = list.slice(0, MAX_CALL_ROWS).map((c) => el('tr', { testid: 'call-row', dataset: { call: String(c.id) } },
    el('td', {}, el('span', { class: 'name', text: c.name ?? c.method }), c.name ? el('span', { class: 'method', text: ` ${c.method}` }) : null),
    el('td', { title: str(c.session) }, c.session ? el('code', { text: shortId(c.session) }) : el('span', { class: 'desc', text: 'sessionless' })),
    el('td', { text: str(c.principal) }),
    el('td', { text: endpointPath(c.upstream) }),
    el('td', { class: 'num running', dataset: { started: String(c.started_ms) }, text: duration(Date.now() + skew - c.started_ms) })));
  fill($('calls-rows'), rows.length ? rows : el('tr', {}, el('td', { colspan: 5, class: 'desc', text: 'No call is running.' })));
  const more = $('calls-more');
  more.hidden = total <= rows.length;
  more.textContent = `${total - rows.length} more running, not shown.`;
}

/** Each second, the running times move on (no request: the page counts). */
function tickCalls() {
  for (const td of $('calls-rows').querySelectorAll('td.running')) {
    td.textContent = duration(Date.now() + skew - Number(td.dataset.started));
  }
}

// ------------------------------------------------------------------ upstreams

let endpointNames = [];

async function loadUpstreams() {
  let endpoints;
  try {
    endpoints = (await api('/admin/endpoints')).endpoints || [];
  } catch (e) {
    if (e.status !== 401) fill($('upstream-rows'), el('tr', {}, el('td', { colspan: 5, class: 'error', text: e.message })));
    return;
  }
  let keeper = null;
  try {
    keeper = await api('/admin/keeper');
  } catch {
    keeper = null; // no keeper (--no-keeper, or not Linux): pids are not known here
  }
  if (!running) return; // signed out meanwhile: show nothing
  const children = keeper?.children || [];
  const upstreams = endpoints.filter((e) => e.app && e.app.kind === 'upstream');
  const virtuals = endpoints.filter((e) => e.app && e.app.kind === 'virtual_server');
  const stateOf = new Map(upstreams.map((u) => [u.endpoint, u.app.state]));
  fill($('upstream-rows'), upstreams.length ? upstreams.map((u) => upstreamRow(u, children)) : el('tr', {}, el('td', { colspan: 5, class: 'desc', text: 'No upstream is configured (--upstream, [upstreams.NAME]).' })));
  fill($('virtual-rows'), virtuals.length ? virtuals.map((v) => virtualRow(v, stateOf)) : el('tr', {}, el('td', { colspan: 3, class: 'desc', text: 'No virtual server ([servers.NAME]).' })));
  drawKeeper(keeper);
  const names = endpoints.map((e) => e.endpoint);
  if (names.join('\n') !== endpointNames.join('\n')) {
    endpointNames = names;
    const select = $('f-endpoint');
    const chosen = select.value;
    fill(select, el('option', { value: '*', text: 'any' }), names.map((n) => el('option', { value: n, text: endpointPath(n) })));
    select.value = names.includes(chosen) ? chosen : '*';
  }
}

function badge(state) {
  return el('span', { class: `badge state-${state}`, testid: 'state', text: state });
}

function upstreamRow(u, children) {
  const a = u.app;
  const pids = children.filter((c) => typeof c.label === 'string' && c.label.startsWith(`${u.endpoint}/`));
  const stateCell = el('td', {}, badge(a.state));
  if (a.last_error) stateCell.append(el('div', { class: 'error', testid: 'upstream-error', text: a.last_error }));
  if (a.retry_in_ms) stateCell.append(el('div', { class: 'desc', text: `refused at once for ${duration(a.retry_in_ms)} more` }));
  else if (a.failures_30s) stateCell.append(el('div', { class: 'desc', text: `${a.failures_30s} failed start(s) in 30 s` }));
  const conns = el('td', {}, el('span', { class: 'num', text: String(a.connections_total ?? 0) }));
  const busy = (a.connections || []).filter((c) => c.busy).length;
  if (a.connections_total) conns.append(el('div', { class: 'desc', text: `${busy} busy` }));
  if (pids.length) {
    conns.append(el('div', { class: 'pids' }, 'pids ', pids.slice(0, 20).map((c) => el('code', { title: str(c.label), text: `${c.pid} ` })), pids.length > 20 ? `(+${pids.length - 20})` : ''));
  }
  const cap = a.transport === 'stdio'
    ? el('td', {}, el('span', { class: 'num', text: `${a.processes_live ?? 0} / ${a.max_processes}` }),
      el('div', { class: 'desc', text: `${a.max_processes_per_principal} per principal` }),
      a.max_stdio_processes ? el('div', { class: 'desc', text: `server: ${a.max_stdio_processes.live} / ${a.max_stdio_processes.max}` }) : null)
    : el('td', { class: 'desc', text: 'URL: no processes' });
  const shares = el('td', {}, (a.shares || []).slice(0, 8).map((s) => el('div', {}, el('span', { text: s.principal || '(anonymous)' }), `: ${s.connections}`)),
    (a.principals || 0) > 8 ? el('div', { class: 'desc', text: `${a.principals - 8} more principals` }) : null);
  return el('tr', { testid: 'upstream-row', dataset: { upstream: u.endpoint, state: a.state } },
    el('td', {}, el('strong', { text: u.endpoint }), el('div', { class: 'desc', text: `${a.transport}: ${str(a.target)}` }), el('div', { class: 'desc', text: u.path })),
    stateCell, conns, cap, shares);
}

function virtualRow(v, stateOf) {
  const a = v.app;
  const down = new Set(a.down || []);
  const members = el('td', {}, (a.members || []).map((m) => el('div', {},
    el('span', { text: m }), ' ', badge(down.has(m) ? 'down' : stateOf.get(m) || 'unknown'))));
  const contested = el('td', {}, (a.contested || []).length
    ? (a.contested || []).map((c) => el('div', {}, el('code', { text: str(c.name) }), el('span', { class: 'desc', text: ` ${c.kind}: kept by ${str(c.kept_by)}, also offered by ${str(c.also_offered_by)}` })))
    : el('span', { class: 'desc', text: a.listed ? 'none' : 'not listed yet (no session used it)' }));
  return el('tr', { testid: 'virtual-row', dataset: { server: v.endpoint } },
    el('td', {}, el('strong', { text: v.endpoint }), el('div', { class: 'desc', text: `${v.path}, names: ${str(a.names)}` })), members, contested);
}

function drawKeeper(keeper) {
  $('keeper').hidden = !keeper;
  if (!keeper) return;
  const facts = [
    ['Engine restarts', String(keeper.restarts ?? 0)],
    ['Last restart', keeper.last_restart_ms ? new Date(keeper.last_restart_ms).toLocaleString() : 'never'],
    ['Children kept', String((keeper.children || []).length)],
    ['Taken over at this engine\'s start', String(keeper.children_taken_over ?? 0)],
    ['Bytes held for the engine', String(keeper.held_bytes ?? 0)],
  ];
  fill($('keeper-facts'), facts.map(([k, v]) => [el('dt', { text: k }), el('dd', { text: v })]));
}

// ------------------------------------------------------------------ sessions

const page = { cursor: null, next: null, number: 1, history: [] };

function sessionFilters() {
  const endpoint = $('f-endpoint').value;
  return {
    principal: $('f-principal').value.trim(),
    upstream: endpoint === '*' ? undefined : endpoint,
    idle: $('f-idle').value.trim(),
    limit: $('f-limit').value,
  };
}

async function loadSessions(cursor, quiet = false) {
  let answer;
  try {
    answer = await api(`/admin/sessions${query({ ...sessionFilters(), cursor })}`);
  } catch (e) {
    if (e.status !== 401) {
      $('sessions-error').textContent = e.message;
      $('sessions-error').hidden = false;
    }
    return;
  }
  if (!running) return;
  $('sessions-error').hidden = true;
  page.cursor = cursor;
  page.next = answer.next || null;
  const sessions = answer.sessions || [];
  fill($('session-rows'), sessions.length ? sessions.map(sessionRow) : el('tr', {}, el('td', { colspan: 9, class: 'desc', text: 'No live session matches.' })));
  $('sessions-next').disabled = !page.next;
  $('sessions-page').textContent = `page ${page.number}, ${sessions.length} session${sessions.length === 1 ? '' : 's'}${page.next ? ', more on the next' : ''}`;
  if (!quiet && detailOf && !sessions.some((s) => s.id === detailOf)) closeDetail();
}

function clientName(client) {
  if (!client || typeof client !== 'object') return '';
  return [str(client.name), client.version ? str(client.version) : ''].filter(Boolean).join(' ');
}

function sessionRow(s) {
  const now = Date.now();
  return el('tr', { testid: 'session-row', dataset: { session: s.id } },
    el('td', { title: s.id }, el('code', { text: shortId(s.id) })),
    el('td', { text: str(s.principal) }),
    el('td', { text: endpointPath(s.upstream) }),
    el('td', { class: 'client', text: clientName(s.client) }),
    el('td', { class: 'num', text: duration(now - s.created_at_ms) }),
    el('td', { class: 'num', text: duration(s.idle_ms), title: s.in_memory ? 'held in memory here' : 'only in the store (idle time from its expiry)' }),
    el('td', { class: 'num', text: String(s.connections ?? 0) }),
    el('td', { class: 'num', text: String(s.in_flight ?? 0) }),
    el('td', { class: 'actions' },
      el('button', { type: 'button', class: 'linkish', onclick: () => openDetail(s.id) }, 'Details'),
      el('button', { type: 'button', class: 'danger', testid: 'session-end', onclick: () => confirmEnd(s) }, 'End')));
}

$('sessions-filter').addEventListener('submit', (ev) => {
  ev.preventDefault();
  page.number = 1;
  page.history = [];
  loadSessions(null);
});
$('sessions-first').addEventListener('click', () => {
  page.number = 1;
  page.history = [];
  loadSessions(null);
});
$('sessions-next').addEventListener('click', () => {
  if (!page.next) return;
  page.history.push(page.cursor);
  page.number += 1;
  loadSessions(page.next);
});

// Ending one, after a confirmation.
let ending = null;

function confirmEnd(s) {
  ending = s;
  $('confirm-text').textContent = `Session ${s.id} of ${str(s.principal) || '(anonymous)'} on ${endpointPath(s.upstream)}${clientName(s.client) ? `, client ${clientName(s.client)}` : ''}.`;
  $('confirm').showModal();
}

$('confirm-cancel').addEventListener('click', () => {
  ending = null;
  $('confirm').close();
});

$('confirm-end').addEventListener('click', async () => {
  const s = ending;
  ending = null;
  $('confirm').close();
  if (!s) return;
  try {
    await api(`/admin/sessions/${encodeURIComponent(s.id)}`, { method: 'DELETE' });
  } catch (e) {
    if (e.status !== 401) {
      $('sessions-error').textContent = `Session ${s.id} was not ended: ${e.message}`;
      $('sessions-error').hidden = false;
    }
    return;
  }
  if (detailOf === s.id) closeDetail();
  loadSessions(page.cursor);
});

// The detail view.
let detailOf = null;

function closeDetail() {
  detailOf = null;
  fill($('session-detail'));
  $('session-detail').hidden = true;
}

function table(head, rows) {
  return el('table', { class: 'grid' }, el('thead', {}, el('tr', {}, head.map((h) => el('th', { text: h })))),
    el('tbody', {}, rows.length ? rows : el('tr', {}, el('td', { colspan: head.length, class: 'desc', text: 'none' }))));
}

async function openDetail(id) {
  detailOf = id;
  const box = $('session-detail');
  box.hidden = false;
  fill(box, el('p', { class: 'desc', text: `Loading ${id}…` }));
  let s;
  try {
    s = await api(`/admin/sessions/${encodeURIComponent(id)}`);
  } catch (e) {
    if (e.status !== 401) fill(box, el('p', { class: 'error', text: e.message }));
    return;
  }
  if (detailOf !== id || !running) return;
  const time = (ms) => (ms ? new Date(ms).toLocaleString() : '–');
  const facts = [
    ['Session', s.id], ['Principal', str(s.principal)], ['Endpoint', endpointPath(s.upstream)], ['Client', clientName(s.client)],
    ['Protocol', str(s.protocol_version)], ['Created', time(s.created_at_ms)], ['Last active', time(s.last_active_ms)],
    ['Expires', time(s.expires_at_ms)], ['Held in memory here', s.in_memory ? 'yes' : 'no'], ['Revision', str(s.revision)],
  ];
  const streams = (s.streams || []).map((st) => el('tr', {}, el('td', {}, el('code', { text: st.stream })), el('td', { text: st.kind }),
    el('td', { class: 'num', text: String(st.first_seq) }), el('td', { class: 'num', text: String(st.head) }), el('td', { text: st.finished ? 'finished' : 'open' })));
  const ops = (s.operations || []).map((o) => el('tr', {}, el('td', {}, el('code', { text: str(o.id) })), el('td', { text: str(o.tool) }),
    el('td', { text: str(o.state) }), el('td', { text: o.running_here ? 'here' : '' }), el('td', { text: time(o.updated_at_ms) })));
  const inFlight = (s.requests_in_flight || []).map((r) => el('li', {}, el('code', { text: str(r) })));
  fill(box,
    el('h3', {}, 'Session ', el('code', { text: s.id }), el('button', { type: 'button', class: 'linkish', onclick: closeDetail }, 'Close')),
    el('dl', { class: 'facts' }, facts.map(([k, v]) => [el('dt', { text: k }), el('dd', { text: v })])),
    el('h4', { text: 'Streams and their heads' }), table(['Stream', 'Kind', 'First', 'Head', ''], streams),
    el('h4', { text: 'Requests running here (JSON-RPC ids)' }), inFlight.length ? el('ul', { class: 'ids' }, inFlight) : el('p', { class: 'desc', text: 'none' }),
    el('h4', { text: 'Operations' }), table(['Operation', 'Tool', 'State', 'Runs', 'Updated'], ops),
    s.upstreams ? [el('h4', { text: 'Upstream sessions' }), el('pre', { text: JSON.stringify(s.upstreams, null, 2) })] : null);
}

// ------------------------------------------------------------------ audit

async function loadAudit() {
  const q = query({ principal: $('a-principal').value.trim(), decision: $('a-decision').value, limit: 100 });
  let answer;
  try {
    answer = await api(`/admin/audit${q}`);
  } catch (e) {
    if (e.status !== 401) $('audit-note').textContent = e.message;
    return;
  }
  if (!running) return;
  if (!answer.enabled) {
    $('audit-note').textContent = 'The audit log is off: start tether with --audit-log FILE (and [[policies]] in its --config) to see decisions here.';
    fill($('audit-rows'));
    return;
  }
  const rows = answer.decisions || [];
  $('audit-note').textContent = `The latest ${rows.length} (of at most ${answer.kept_at_most} kept in memory; the file has them all).${answer.failing ? ' The audit file is failing: see /healthz.' : ''}`;
  fill($('audit-rows'), rows.length ? rows.map((d) => el('tr', { testid: 'audit-row', dataset: { decision: str(d.decision) } },
    el('td', { text: str(d.time) }), el('td', { text: str(d.principal) }), el('td', { text: str(d.endpoint) }),
    el('td', { text: str(d.method) }),
    el('td', {}, el('span', { text: `${str(d.kind)} ` }), el('code', { text: str(d.name) }), d.member ? el('div', { class: 'desc', text: `member ${str(d.member)}: ${str(d.member_name)}` }) : null),
    el('td', {}, badge(str(d.decision))), el('td', {}, el('code', { text: str(d.rule) })))) : el('tr', {}, el('td', { colspan: 7, class: 'desc', text: 'No decision matches.' })));
}

$('audit-filter').addEventListener('submit', (ev) => {
  ev.preventDefault();
  loadAudit();
});
$('upstreams-refresh').addEventListener('click', loadUpstreams);

// ------------------------------------------------------------------ start

if (auth.token) signIn(auth.token);
else showSignIn('');
