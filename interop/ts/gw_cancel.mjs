// Gateway interop check: a cancel reaches the upstream. The official TypeScript
// SDK client (v1) cancels a long call through tether with an AbortSignal (the
// SDK then sends notifications/cancelled), and the upstream, the Python SDK
// stdio server interop/servers/py_stdio_server.py served at /mcp/pystdio, must
// have received it: asserted from the upstream's side, with its `cancellations`
// tool, in the same session (so the same child process):
// - its `slow` handler was interrupted for this very call (the call's label), and
// - a notifications/cancelled named the request ID the upstream ran that call
//   under. tether maps request IDs, so the upstream's own ID is compared with the
//   upstream's own record, never with the client's.
// Then a new `slow` call in the same session still finishes, and DELETE ends it.
//
// usage: node gw_cancel.mjs http://127.0.0.1:PORT/mcp/pystdio
import { randomUUID } from 'node:crypto';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { check, checkDeepEqual, fail, recordingFetch, renderLog, stepper } from './lib.mjs';

const url = process.argv[2];
if (!url) {
    console.error('usage: node gw_cancel.mjs http://127.0.0.1:PORT/mcp/pystdio');
    process.exit(2);
}

const T = { timeout: 30000 };
const { log, fetch: recFetch } = recordingFetch();
const errors = [];
let closing = false;

const step = stepper(log);

function text(result, label) {
    const t = (result?.content ?? []).filter(c => c.type === 'text').map(c => c.text).join('\n');
    check(t.length > 0, `${label}: no text content`, result);
    return t;
}

const client = new Client({ name: 'tether-interop-gw-cancel', version: '0.0.0' }, { capabilities: {} });
client.onerror = err => {
    if (!closing) errors.push(err);
};
const transport = new StreamableHTTPClientTransport(new URL(url), { fetch: recFetch });
await step('connect (initialize through the gateway)', () => client.connect(transport));
const info = client.getServerVersion();
check(info?.name === 'py-stdio-fixture', `serverInfo is not the upstream's: ${JSON.stringify(info)}`);
const tools = await step('tools/list', () => client.listTools(undefined, T));
const names = tools.tools.map(t => t.name);
for (const n of ['slow', 'cancellations']) check(names.includes(n), `tools/list lacks "${n}"`, names);

// ---------------------------------------------------------------- cancel
const label = `ts-cancel-${randomUUID().slice(0, 8)}`;
const controller = new AbortController();
const progress = [];
const started = Date.now();
let rejected;
let finished;
try {
    // 100 steps of 0.1 s: 10 s if nothing cancels it.
    finished = await client.callTool({ name: 'slow', arguments: { label, steps: 100 } }, undefined, {
        ...T,
        signal: controller.signal,
        onprogress: p => {
            progress.push(p);
            if (progress.length === 3) controller.abort('interop cancels the slow call');
        }
    });
} catch (e) {
    rejected = e;
}
const took = Date.now() - started;
check(rejected && finished === undefined, 'the aborted call resolved instead of rejecting', finished);
check(progress.length === 3, `expected the abort after the third progress, saw ${progress.length}`, progress);
check(took < 5000, `the aborted call took ${took} ms to reject (the whole call takes 10 s)`);
let cancelPost;
for (let i = 0; i < 100 && cancelPost?.status === undefined; i++) {
    await new Promise(r => setTimeout(r, 50));
    cancelPost = log.find(e => e.method === 'POST' && e.body?.method === 'notifications/cancelled');
}
check(cancelPost && cancelPost.status === 202, 'no notifications/cancelled POST answered 202', renderLog(log));
console.log(`cancel: slow ${label} rejected after ${took} ms with "${rejected?.message ?? rejected}"; notifications/cancelled -> 202`);

// notifications/cancelled is one-way: poll the upstream's own record of it.
let report;
let mine = [];
const deadline = Date.now() + 10000;
while (Date.now() < deadline) {
    const r = await step('tools/call cancellations', () => client.callTool({ name: 'cancellations', arguments: {} }, undefined, T));
    check(r.isError !== true, 'cancellations returned isError', r);
    report = JSON.parse(text(r, 'cancellations'));
    mine = report.cancelled.filter(c => c.label === label);
    if (mine.length && report.notifications.includes(mine[0].request_id)) break;
    await new Promise(res => setTimeout(res, 100));
}
check(mine.length === 1, `the upstream's slow handler was not cancelled for ${label}`, report);
const rec = mine[0];
check(report.notifications.includes(rec.request_id), `the upstream received no notifications/cancelled for its request ${rec.request_id}`, report);
check(rec.steps_done >= 3 && rec.steps_done < 100, 'odd steps_done in the upstream record', rec);
console.log(`cancel: the upstream got notifications/cancelled for its request ${rec.request_id} (slow ${label} interrupted after ${rec.steps_done} of 100 steps)`);

const again = await step('tools/call slow after the cancel', () =>
    client.callTool({ name: 'slow', arguments: { label: 'after-cancel', steps: 3 } }, undefined, T)
);
checkDeepEqual(text(again, 'slow after cancel'), 'slow after-cancel finished', 'slow after the cancel');

// ---------------------------------------------------------------- end
// Known, not failures (see gw_everything.mjs): tether ends the cancelled
// request's stream with a stored -32800 response the SDK no longer expects,
// and a progress sent just before the upstream saw the cancel may come late.
const cancelledId = cancelPost.body?.params?.requestId;
const unexpected = errors.filter(e => {
    const m = e?.message ?? '';
    if (/progress notification for an unknown token/.test(m)) return false;
    const late = m.match(/response for an unknown message ID: (.*)$/s);
    if (late) {
        try {
            const r = JSON.parse(late[1]);
            return !(r.id === cancelledId && r.error?.code === -32800);
        } catch {
            return true;
        }
    }
    return true;
});
if (unexpected.length) {
    fail(`transport/protocol errors were reported:\n${unexpected.map(e => `  ${e?.stack ?? e}`).join('\n')}`, `HTTP log:\n${renderLog(log)}`);
}
await step('terminateSession (DELETE)', () => transport.terminateSession());
closing = true;
await client.close();
console.log('OK gw_cancel.mjs');
process.exit(0);
