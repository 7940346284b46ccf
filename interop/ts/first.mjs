// Process 1 of the TypeScript-SDK interop check.
//
// initialize -> tools/list -> tools/call `thought` (collecting the resumption
// tokens the SDK reports), then writes the session ID, the tokens, the call's
// JSON-RPC id and its result to STATE_FILE for resume.mjs, a separate process.
// The session is deliberately NOT terminated here.
//
// usage: node first.mjs http://127.0.0.1:PORT/mcp STATE_FILE
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { LATEST_PROTOCOL_VERSION } from '@modelcontextprotocol/sdk/types.js';
import {
    THOUGHT_ARGS,
    SUPPORTED_VERSIONS,
    check,
    checkThoughtResult,
    fail,
    parseArgs,
    recordingFetch,
    renderLog,
    writeJson
} from './lib.mjs';

const { url, statePath } = parseArgs('first.mjs');
const { log, fetch: recFetch } = recordingFetch();
const errors = [];
let closing = false;

const client = new Client({ name: 'tether-interop-ts', version: '0.0.0' });
client.onerror = err => {
    if (!closing) errors.push(err);
};
const transport = new StreamableHTTPClientTransport(url, { fetch: recFetch });

async function step(name, fn) {
    try {
        return await fn();
    } catch (err) {
        fail(`${name} threw: ${err?.stack ?? err}`, `HTTP log:\n${renderLog(log)}`);
    }
}

// 1. initialize (Client.connect sends initialize + notifications/initialized).
await step('connect/initialize', () => client.connect(transport));
check(transport.sessionId, 'server did not assign an Mcp-Session-Id on initialize', renderLog(log));
const negotiated = transport.protocolVersion;
check(
    SUPPORTED_VERSIONS.includes(negotiated),
    `negotiated protocol version ${negotiated} is not one tether offers (${SUPPORTED_VERSIONS.join(', ')})`
);
if (negotiated !== LATEST_PROTOCOL_VERSION) {
    console.log(`note: client offered ${LATEST_PROTOCOL_VERSION}, server chose ${negotiated}`);
}
console.log(`initialized: session=${transport.sessionId} protocol=${negotiated} server=${JSON.stringify(client.getServerVersion())}`);

// 2. tools/list
const tools = await step('tools/list', () => client.listTools());
const names = tools.tools.map(t => t.name);
check(names.includes('thought'), `tool list does not contain "thought": ${JSON.stringify(names)}`);
const thoughtTool = tools.tools.find(t => t.name === 'thought');
const required = thoughtTool.inputSchema?.required ?? [];
for (const field of ['thought', 'thoughtNumber', 'totalThoughts', 'nextThoughtNeeded']) {
    check(required.includes(field), `thought.inputSchema.required lacks "${field}"`, thoughtTool.inputSchema);
}
console.log(`tools/list: ${JSON.stringify(names)}`);

// 3. tools/call thought, collecting every resumption token the SDK reports.
const tokens = [];
const result = await step('tools/call thought', () =>
    client.callTool({ name: 'thought', arguments: THOUGHT_ARGS }, undefined, {
        timeout: 30000,
        onresumptiontoken: token => tokens.push(token)
    })
);
checkThoughtResult(result, THOUGHT_ARGS, 'tools/call');
check(tokens.length >= 1, 'the SDK reported no resumption token for the tools/call SSE stream (no priming event with an id?)', renderLog(log));
console.log(`tools/call: structuredContent=${JSON.stringify(result.structuredContent)} tokens=${JSON.stringify(tokens)}`);

// The JSON-RPC id the SDK gave the tools/call POST (resume.mjs lines its own
// request-id counter up with it).
const callPost = log.find(e => e.method === 'POST' && e.body?.method === 'tools/call');
check(callPost, 'no tools/call POST in the HTTP log', renderLog(log));
check(callPost.contentType?.startsWith('text/event-stream'), `tools/call was not answered with SSE (content-type ${callPost.contentType})`);
for (const e of log.filter(e => e.method === 'POST' && e.body?.method && e.body.method !== 'initialize')) {
    check(
        e.headers['mcp-protocol-version'] === negotiated,
        `${e.body.method} POST carried mcp-protocol-version=${e.headers['mcp-protocol-version']}, expected ${negotiated}`
    );
}

if (errors.length) {
    fail(`transport/protocol errors were reported:\n${errors.map(e => `  ${e?.message ?? e}`).join('\n')}`, `HTTP log:\n${renderLog(log)}`);
}

writeJson(statePath, {
    url: url.href,
    sessionId: transport.sessionId,
    protocolVersion: negotiated,
    callRequestId: callPost.body.id,
    arguments: THOUGHT_ARGS,
    tokens,
    result: JSON.parse(JSON.stringify(result))
});

// Close the local transport only (aborts the open streams); no DELETE, the
// session must survive for the next process.
closing = true;
await client.close();
console.log(`HTTP log:\n${renderLog(log)}`);
check(!log.some(e => e.method === 'DELETE'), 'first.mjs must not terminate the session');
console.log(`OK first.mjs: state written to ${statePath}`);
process.exit(0);
