// Gateway durability check (two processes, with a kill -9 of tether between
// them; interop/run.sh does the kill and the restart on the same SQLite file
// with the same flags).
//
//   call    initialize at /mcp/everything (a stdio upstream) as client
//           "tether-interop-durable" declaring only the sampling capability,
//           call echo, check tools/list, store the session ID; no DELETE.
//   resume  a new client with the stored session ID (the SDK sends no
//           initialize): tools/call echo works on the same Mcp-Session-Id; the
//           new child tether started was initialized with the ORIGINAL
//           client's capabilities (its tools/list has the sampling tool that
//           server-everything registers only for a client that declared
//           sampling, and not the roots tool); a sampling request of the new
//           child reaches this client and its answer goes back; then DELETE.
//
// usage: node gw_durable.mjs http://127.0.0.1:PORT/mcp/everything STATE_FILE call|resume
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { CreateMessageRequestSchema } from '@modelcontextprotocol/sdk/types.js';
import { check, checkDeepEqual, fail, readJson, recordingFetch, renderLog, stepper, writeJson } from './lib.mjs';

const [url, statePath, phase] = process.argv.slice(2);
if (!url || !statePath || !['call', 'resume'].includes(phase)) {
    console.error('usage: node gw_durable.mjs http://127.0.0.1:PORT/mcp/everything STATE_FILE call|resume');
    process.exit(2);
}
const T = { timeout: 30000 };
const { log, fetch: recFetch } = recordingFetch();
const errors = [];

const step = stepper(log);

function checkTools(tools, label) {
    const names = tools.tools.map(t => t.name);
    check(names.includes('echo'), `${label}: tools/list lacks echo`, names);
    check(names.includes('trigger-sampling-request'), `${label}: no trigger-sampling-request: the child did not see the sampling capability`, names);
    check(!names.includes('get-roots-list'), `${label}: get-roots-list is listed, but the client declared no roots`, names);
}

const client = new Client({ name: 'tether-interop-durable', version: '1.2.3' }, { capabilities: { sampling: {} } });
client.onerror = err => errors.push(err);
let sampled = 0;
client.setRequestHandler(CreateMessageRequestSchema, async () => {
    sampled += 1;
    return { model: 'after-the-crash', role: 'assistant', content: { type: 'text', text: 'sampled after the restart' } };
});

if (phase === 'call') {
    const transport = new StreamableHTTPClientTransport(new URL(url), { fetch: recFetch });
    await step('connect (initialize)', () => client.connect(transport));
    check(transport.sessionId, 'no session ID after initialize');
    const echo = await step('tools/call echo', () => client.callTool({ name: 'echo', arguments: { message: 'before the crash' } }, undefined, T));
    checkDeepEqual(echo.content, [{ type: 'text', text: 'Echo: before the crash' }], 'echo before the crash');
    checkTools(await step('tools/list', () => client.listTools(undefined, T)), 'before the crash');
    writeJson(statePath, { sessionId: transport.sessionId });
    console.log(`session ${transport.sessionId}: echo answered; stored for the resume after kill -9`);
} else {
    const { sessionId } = readJson(statePath);
    check(sessionId, `no sessionId in ${statePath}`);
    const transport = new StreamableHTTPClientTransport(new URL(url), { sessionId, fetch: recFetch });
    await step('connect (stored session ID, no initialize)', () => client.connect(transport));
    const echo = await step('tools/call echo after the restart', () =>
        client.callTool({ name: 'echo', arguments: { message: 'after the crash' } }, undefined, T)
    );
    checkDeepEqual(echo.content, [{ type: 'text', text: 'Echo: after the crash' }], 'echo after the crash');
    check(!log.some(e => e.body?.method === 'initialize'), 'the resuming client sent initialize', renderLog(log));
    check(
        log.every(e => e.method !== 'POST' || e.headers['mcp-session-id'] === sessionId),
        'a POST went out without the stored session ID',
        renderLog(log)
    );
    checkTools(await step('tools/list after the restart', () => client.listTools(undefined, T)), 'after the restart');
    const s = await step('tools/call trigger-sampling-request after the restart', () =>
        client.callTool({ name: 'trigger-sampling-request', arguments: { prompt: 'still durable?' } }, undefined, T)
    );
    const text = s.content.map(c => c.text ?? '').join('');
    check(sampled === 1 && text.includes('sampled after the restart'), 'the new child could not sample through the resumed session', s);
    console.log(`session ${sessionId}: echo, tools/list and a sampling round trip work after kill -9 and restart`);
    await step('terminateSession (DELETE)', () => transport.terminateSession());
    const del = log.find(e => e.method === 'DELETE');
    check(del && del.status >= 200 && del.status < 300, `DELETE answered ${del?.status}`, renderLog(log));
}

if (errors.length) fail(`transport/protocol errors were reported:\n${errors.map(e => `  ${e?.stack ?? e}`).join('\n')}`, renderLog(log));
console.log(`HTTP log:\n${renderLog(log)}`);
console.log(`OK gw_durable.mjs ${phase}`);
process.exit(0);
