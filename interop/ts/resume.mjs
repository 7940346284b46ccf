// Process 2 of the TypeScript-SDK interop check (run after first.mjs).
//
// Reconnects with the stored session ID (the SDK then skips initialize and, not
// knowing the negotiated version, sends NO MCP-Protocol-Version header — the
// server must assume 2025-03-26), resumes the earlier tools/call with the first
// resumption token (the SDK sends GET + Last-Event-ID instead of a POST), checks
// the replayed result deep-equals the original, terminates the session with
// DELETE, and checks a later request on that session gets 404.
//
// usage: node resume.mjs http://127.0.0.1:PORT/mcp STATE_FILE
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport, StreamableHTTPError } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import {
    check,
    checkDeepEqual,
    checkThoughtResult,
    fail,
    parseArgs,
    readJson,
    recordingFetch,
    renderLog
} from './lib.mjs';

const { url, statePath } = parseArgs('resume.mjs');
const state = readJson(statePath);
check(state.sessionId && Array.isArray(state.tokens) && state.tokens.length >= 1, `state file ${statePath} is incomplete`, state);

const { log, fetch: recFetch } = recordingFetch();
const errors = [];
let closing = false;

async function step(name, fn) {
    try {
        return await fn();
    } catch (err) {
        fail(`${name} threw: ${err?.stack ?? err}`, `HTTP log:\n${renderLog(log)}`);
    }
}

// 1. Reconnect with the stored session ID: Client.connect skips initialize.
const client = new Client({ name: 'tether-interop-ts', version: '0.0.0' });
client.onerror = err => {
    if (!closing) errors.push(err);
};
const transport = new StreamableHTTPClientTransport(url, { sessionId: state.sessionId, fetch: recFetch });
await step('connect (reconnect with sessionId)', () => client.connect(transport));
check(transport.sessionId === state.sessionId, 'transport lost the stored session ID');
check(transport.protocolVersion === undefined, `expected no protocol version after reconnect, SDK has ${transport.protocolVersion}`);
check(!log.some(e => e.body?.method === 'initialize'), 'reconnecting client sent initialize', renderLog(log));

// 2. Line the request-id counter up with the original call. Protocol assigns
//    ids 0,1,2,... per Client; the replayed response carries the ORIGINAL
//    JSON-RPC id (state.callRequestId). SDK 1.32 rewrites a replayed result's id
//    to the resuming request's id, older 1.x releases do not: making the same
//    number of earlier requests as process 1 keeps the ids equal either way.
//    These tools/list requests are also the "follow-up request without
//    MCP-Protocol-Version" case.
check(Number.isInteger(state.callRequestId) && state.callRequestId >= 0 && state.callRequestId < 20, `odd callRequestId ${state.callRequestId}`);
for (let i = 0; i < state.callRequestId; i++) {
    const tools = await step(`tools/list #${i} (no MCP-Protocol-Version header)`, () => client.listTools(undefined, { timeout: 30000 }));
    check(tools.tools.some(t => t.name === 'thought'), `tools/list after reconnect lacks "thought"`, tools);
}
const listPosts = log.filter(e => e.method === 'POST' && e.body?.method === 'tools/list');
check(listPosts.length === state.callRequestId, `expected ${state.callRequestId} tools/list POSTs`, renderLog(log));
for (const e of listPosts) {
    check(!('mcp-protocol-version' in e.headers), 'SDK unexpectedly sent MCP-Protocol-Version after reconnect', renderLog(log));
    check(e.status === 200, `tools/list without MCP-Protocol-Version got HTTP ${e.status}`, renderLog(log));
}
if (listPosts.length) {
    console.log(`follow-up without MCP-Protocol-Version: ${listPosts.length} x tools/list -> 200`);
}

// 3. Resume the call with the first token: GET + Last-Event-ID, no new POST.
const resumed = await step('tools/call resume (GET Last-Event-ID)', () =>
    client.callTool({ name: 'thought', arguments: state.arguments }, undefined, {
        resumptionToken: state.tokens[0],
        timeout: 30000
    })
);
const resumeGet = log.find(e => e.method === 'GET' && e.headers['last-event-id'] === state.tokens[0]);
check(resumeGet, `no GET with Last-Event-ID ${state.tokens[0]} was sent`, renderLog(log));
check(resumeGet.status === 200 && resumeGet.contentType?.startsWith('text/event-stream'), `resumption GET answered ${resumeGet.status} ${resumeGet.contentType}`, renderLog(log));
check(!('mcp-protocol-version' in resumeGet.headers), 'resumption GET unexpectedly carried MCP-Protocol-Version');
check(!log.some(e => e.method === 'POST' && e.body?.method === 'tools/call'), 'the resumed call was re-POSTed instead of replayed', renderLog(log));
checkThoughtResult(resumed, state.arguments, 'resumed tools/call');
checkDeepEqual(JSON.parse(JSON.stringify(resumed)), state.result, 'resumed result differs from the original result');
console.log(`resumed with token ${state.tokens[0]}: result deep-equals the original`);

// 4. Terminate the session (DELETE).
await step('terminateSession (DELETE)', () => transport.terminateSession());
const del = log.find(e => e.method === 'DELETE');
check(del, 'terminateSession sent no DELETE', renderLog(log));
check(del.status >= 200 && del.status < 300, `DELETE answered HTTP ${del.status} (405 would mean tether does not support termination)`, renderLog(log));
check(transport.sessionId === undefined, 'SDK still holds a session ID after terminateSession');
console.log(`DELETE session -> ${del.status}`);

if (errors.length) {
    fail(`transport/protocol errors were reported:\n${errors.map(e => `  ${e?.message ?? e}`).join('\n')}`, `HTTP log:\n${renderLog(log)}`);
}
closing = true;
await client.close();

// 5. A later request on the terminated session must fail with 404.
{
    const probeLog = recordingFetch();
    const probe = new Client({ name: 'tether-interop-ts-probe', version: '0.0.0' });
    const t = new StreamableHTTPClientTransport(url, { sessionId: state.sessionId, fetch: probeLog.fetch });
    await probe.connect(t);
    let err;
    try {
        await probe.listTools(undefined, { timeout: 30000 });
    } catch (e) {
        err = e;
    }
    check(err, 'tools/list on the terminated session succeeded', renderLog(probeLog.log));
    check(
        err instanceof StreamableHTTPError && err.code === 404,
        `tools/list on the terminated session failed, but not with HTTP 404: ${err?.stack ?? err}`,
        renderLog(probeLog.log)
    );
    console.log('request on terminated session -> 404');
    await probe.close();
}

console.log(`HTTP log:\n${renderLog(log)}`);
console.log('OK resume.mjs');
process.exit(0);
