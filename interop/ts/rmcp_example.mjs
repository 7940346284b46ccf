// The rmcp example (crates/tether/examples/rmcp_server.rs: an rmcp handler with
// the tools echo and slow, served by tether's engine on SQLite) with the
// official TypeScript SDK client, in two processes with a kill -9 of the
// example between them (interop/run.sh does the kill and the restart on the
// same store file and port).
//
//   call    initialize; tools/list is exactly echo and slow; tools/call echo
//           returns its text; then tools/call slow {steps: 40} with onprogress
//           and onresumptiontoken. Once 2 progress notifications came and a
//           resumption token is known, the session ID, the first resumption
//           token (the POST stream's priming event), the progress seen and the
//           call's JSON-RPC id go to STATE_FILE and the process exits 0 while
//           the call is still in flight (no DELETE).
//   resume  a new client with the stored session ID (the SDK sends no
//           initialize). SDK 1.32 gives a resumed request a fresh JSON-RPC id
//           and sends no POST for it; the replayed progress and error carry the
//           ORIGINAL id (it rewrites the id of a replayed result only, never of
//           an error or of a progress token), so the script first makes as many
//           requests as the call process made before slow (tools/list and echo
//           calls, no MCP-Protocol-Version header after a reconnect), which
//           lines the ids up. Then the cut call is resumed with the stored
//           token (GET + Last-Event-ID): the progress replayed starts with what
//           was seen before the kill, in order, and the call ends exactly once
//           with the JSON-RPC error -32603 "...interrupted...". A plain GET
//           from the same token reads the stored stream to its end (one error,
//           last); then tools/call echo and tools/list on the same session, and
//           DELETE (terminateSession).
//
// usage: node rmcp_example.mjs http://127.0.0.1:PORT/mcp STATE_FILE call|resume
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { McpError } from '@modelcontextprotocol/sdk/types.js';
import { check, checkDeepEqual, fail, readJson, recordingFetch, renderLog, stepper, writeJson } from './lib.mjs';

const [urlArg, statePath, phase] = process.argv.slice(2);
if (!urlArg || !statePath || !['call', 'resume'].includes(phase)) {
    console.error('usage: node rmcp_example.mjs http://127.0.0.1:PORT/mcp STATE_FILE call|resume');
    process.exit(2);
}
const url = new URL(urlArg);
const T = { timeout: 60000 };
const STEPS = 40;
const { log, fetch: recFetch } = recordingFetch();
const errors = [];
let closing = false;

const step = stepper(log);

/** resolves once cond() holds (checked on every event that may change it), or fails after ms. */
function waitFor(what, ms, cond, wake) {
    return new Promise(resolve => {
        const timer = setTimeout(() => fail(`${what}: not within ${ms / 1000} s`, `HTTP log:\n${renderLog(log)}`), ms);
        const poke = () => {
            if (cond()) {
                clearTimeout(timer);
                resolve();
            }
        };
        wake.push(poke);
        poke();
    });
}

async function listExactly(client, label) {
    const tools = await step(`tools/list (${label})`, () => client.listTools(undefined, T));
    const names = tools.tools.map(t => t.name).sort();
    checkDeepEqual(names, ['echo', 'slow'], `${label}: tools/list is not exactly echo and slow`);
    const slow = tools.tools.find(t => t.name === 'slow');
    check(slow.inputSchema?.properties?.steps?.type === 'integer', `${label}: slow.inputSchema.steps is not an integer`, slow.inputSchema);
}

async function echo(client, text, label) {
    const r = await step(`tools/call echo (${label})`, () => client.callTool({ name: 'echo', arguments: { text } }, undefined, T));
    check(r.isError !== true, `${label}: echo returned isError`, r);
    checkDeepEqual(r.content, [{ type: 'text', text }], `${label}: echo content`);
}

const client = new Client({ name: 'tether-interop-rmcp', version: '1.0.0' });
client.onerror = err => {
    if (!closing) errors.push(err);
};

if (phase === 'call') {
    const transport = new StreamableHTTPClientTransport(url, { fetch: recFetch });
    await step('connect (initialize)', () => client.connect(transport));
    check(transport.sessionId, 'no Mcp-Session-Id after initialize', renderLog(log));
    console.log(`initialized: session=${transport.sessionId} protocol=${transport.protocolVersion} server=${JSON.stringify(client.getServerVersion())}`);
    await listExactly(client, 'before the crash');
    await echo(client, 'hello from the TypeScript SDK', 'before the crash');

    const progress = [];
    const tokens = [];
    const wake = [];
    const poke = () => wake.forEach(f => f());
    const inFlight = client.callTool({ name: 'slow', arguments: { steps: STEPS } }, undefined, {
        ...T,
        resetTimeoutOnProgress: true,
        onprogress: p => {
            progress.push(p);
            poke();
        },
        onresumptiontoken: t => {
            tokens.push(t);
            poke();
        }
    });
    inFlight.then(
        r => fail(`slow {steps: ${STEPS}} ended before the state was written (it takes ${STEPS / 4} s)`, r),
        e => fail(`slow {steps: ${STEPS}} failed before the state was written: ${e?.stack ?? e}`, `HTTP log:\n${renderLog(log)}`)
    );
    await waitFor('2 progress notifications and a resumption token for slow', 30000, () => progress.length >= 2 && tokens.length >= 1, wake);

    const post = log.find(e => e.method === 'POST' && e.body?.method === 'tools/call' && e.body.params?.name === 'slow');
    check(post, 'no tools/call slow POST in the HTTP log', renderLog(log));
    check(post.contentType?.startsWith('text/event-stream'), `tools/call slow was not answered with SSE (${post.contentType})`, renderLog(log));
    const progressToken = post.body.params?._meta?.progressToken;
    check(progressToken !== undefined, 'the SDK sent no progressToken with slow', post.body);
    const seen = progress.map(p => p.progress);
    checkDeepEqual(seen, seen.map((_, i) => i + 1), 'progress before the crash is not 1, 2, ...');
    check(progress.every(p => p.total === STEPS), `progress total is not ${STEPS}`, progress);
    if (errors.length) fail(`transport/protocol errors were reported:\n${errors.map(e => `  ${e?.stack ?? e}`).join('\n')}`, renderLog(log));
    writeJson(statePath, {
        sessionId: transport.sessionId,
        protocolVersion: transport.protocolVersion,
        callRequestId: post.body.id,
        progressToken,
        resumptionToken: tokens[0],
        tokens: [...tokens],
        progressSeen: seen
    });
    check(!log.some(e => e.method === 'DELETE'), 'the call process must not terminate the session');
    console.log(`HTTP log:\n${renderLog(log)}`);
    console.log(
        `session ${transport.sessionId}: slow #${post.body.id} in flight, progress ${JSON.stringify(seen)}, ` +
            `tokens ${JSON.stringify(tokens)}; state written, exiting for the kill -9`
    );
    console.log('OK rmcp_example.mjs call');
    process.exit(0); // the call is still running on the server
}

// ---------------------------------------------------------------- resume
const state = readJson(statePath);
check(state.sessionId && state.resumptionToken && Array.isArray(state.progressSeen) && state.progressSeen.length >= 2, `state file ${statePath} is incomplete`, state);
check(Number.isInteger(state.callRequestId) && state.callRequestId >= 0 && state.callRequestId < 20, `odd callRequestId ${state.callRequestId}`, state);

const transport = new StreamableHTTPClientTransport(url, { sessionId: state.sessionId, fetch: recFetch });
await step('connect (stored session ID, no initialize)', () => client.connect(transport));
check(transport.sessionId === state.sessionId, 'the transport lost the stored session ID');
// Every JSON-RPC message the SDK receives (the replay included).
const incoming = [];
const onmessage = transport.onmessage;
transport.onmessage = (message, extra) => {
    incoming.push(message);
    onmessage?.(message, extra);
};

// Line the request ids up with the call process (see the header).
for (let i = 0; i < state.callRequestId; i++) {
    if (i % 2 === 0) await listExactly(client, `after the restart, request #${i}`);
    else await echo(client, `after the restart, request #${i}`, `after the restart, request #${i}`);
}

const replayed = [];
let resumeError;
try {
    const r = await client.callTool({ name: 'slow', arguments: { steps: STEPS } }, undefined, {
        ...T,
        resumptionToken: state.resumptionToken,
        onprogress: p => replayed.push(p)
    });
    fail('the resumed call ended with a result, not the "interrupted" error', r);
} catch (e) {
    resumeError = e;
}
console.log(`resumed call ended with: ${resumeError?.message}`);
check(
    resumeError instanceof McpError && resumeError.code === -32603 && /interrupted/.test(resumeError.message),
    `the resumed call did not end with the JSON-RPC error -32603 "...interrupted...": ${resumeError?.stack ?? resumeError}`,
    `HTTP log:\n${renderLog(log)}`
);
const get = log.find(e => e.method === 'GET' && e.headers['last-event-id'] === state.resumptionToken);
check(get, `no GET with Last-Event-ID ${state.resumptionToken} was sent`, renderLog(log));
check(get.status === 200 && get.contentType?.startsWith('text/event-stream'), `the resumption GET answered ${get.status} ${get.contentType}`, renderLog(log));
check(get.headers['mcp-session-id'] === state.sessionId, 'the resumption GET lacks the stored Mcp-Session-Id', get.headers);
check(!log.some(e => e.method === 'POST' && e.body?.method === 'tools/call' && e.body.params?.name === 'slow'), 'the cut call was POSTed again instead of resumed', renderLog(log));
const values = replayed.map(p => p.progress);
checkDeepEqual(values.slice(0, state.progressSeen.length), state.progressSeen, 'the replayed progress does not start with the progress seen before the kill');
checkDeepEqual(values, values.map((_, i) => i + 1), 'the replayed progress is not 1, 2, ... in order');
check(values.length < STEPS, `the replay has all ${STEPS} steps: the call was not cut by the kill`, values);
check(replayed.every(p => p.total === STEPS), `replayed progress total is not ${STEPS}`, replayed);
console.log(`replayed progress ${JSON.stringify(values)} (seen before the kill: ${JSON.stringify(state.progressSeen)})`);

// The stored stream, read to its end by hand: the progress, then one error, last.
{
    const res = await fetch(url, {
        headers: { accept: 'text/event-stream', 'mcp-session-id': state.sessionId, 'last-event-id': state.resumptionToken },
        signal: AbortSignal.timeout(30000)
    });
    check(res.status === 200, `plain GET from ${state.resumptionToken}: HTTP ${res.status}`);
    const text = await res.text(); // the server ends the stream after the final message
    const msgs = text
        .split('\n')
        .filter(l => l.startsWith('data:') && l.slice(5).trim())
        .map(l => JSON.parse(l.slice(5)));
    const finals = msgs.filter(m => m.id === state.callRequestId && ('result' in m || 'error' in m));
    check(finals.length === 1 && msgs.at(-1) === finals[0], `the stored stream does not end with exactly one response for #${state.callRequestId}`, text);
    check(finals[0].error?.code === -32603 && /interrupted/.test(finals[0].error.message), 'the stored stream ends otherwise than with -32603 interrupted', finals[0]);
    const progressed = msgs.filter(m => m.method === 'notifications/progress');
    check(progressed.every(m => m.params.progressToken === state.progressToken), 'a replayed progress names another progressToken', text);
    checkDeepEqual(progressed.map(m => m.params.progress), values, 'a plain GET replays other progress than the SDK got');
    console.log(`plain GET from the same token: ${progressed.length} progress, then ${JSON.stringify(finals[0])}, then the stream ends`);
}

await echo(client, 'after the interrupted call', 'after the resume');
await listExactly(client, 'after the resume');

check(!log.some(e => e.body?.method === 'initialize'), 'the resuming client sent initialize', renderLog(log));
check(
    log.every(e => e.method !== 'POST' || e.headers['mcp-session-id'] === state.sessionId),
    'a POST went out without the stored session ID',
    renderLog(log)
);
const answers = incoming.filter(m => m.id === state.callRequestId && ('result' in m || 'error' in m));
check(answers.length === 1, `the SDK received ${answers.length} responses for the resumed call #${state.callRequestId}, want exactly 1`, answers);
if (errors.length) fail(`transport/protocol errors were reported:\n${errors.map(e => `  ${e?.stack ?? e}`).join('\n')}`, `HTTP log:\n${renderLog(log)}`);

closing = true; // the SDK keeps re-opening the ended GET (an error is no "response" to it); its errors after DELETE are expected
await step('terminateSession (DELETE)', () => transport.terminateSession());
const del = log.find(e => e.method === 'DELETE');
check(del && del.status >= 200 && del.status < 300, `DELETE answered ${del?.status}`, renderLog(log));
await client.close();
console.log(`HTTP log:\n${renderLog(log)}`);
console.log(`session ${state.sessionId}: resumed after kill -9 with no initialize, the cut call ended once as interrupted, echo and tools/list work, DELETE -> ${del.status}`);
console.log('OK rmcp_example.mjs resume');
process.exit(0);
