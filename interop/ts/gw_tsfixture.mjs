// Gateway interop check with a URL upstream: the official TypeScript SDK client
// against the TypeScript SDK's Streamable HTTP fixture (interop/servers/ts_server.mjs),
// which tether serves at /mcp/tsfixture (`--upstream tsfixture=http://127.0.0.1:P/mcp`).
//
// initialize gives the fixture's serverInfo; tools/list lists its four tools;
// tools/call echo, add (structuredContent), fail (isError) and roots (the
// fixture asks roots/list: tether relays it to this client and the answer
// back); DELETE ends the tether session and tether ends the upstream session
// (the fixture's /stats counts one more initialize and one more DELETE).
//
// usage: node gw_tsfixture.mjs http://127.0.0.1:PORT/mcp/tsfixture http://127.0.0.1:FIXTURE_PORT
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { ListRootsRequestSchema } from '@modelcontextprotocol/sdk/types.js';
import { check, checkDeepEqual, fail, recordingFetch, renderLog, stepper } from './lib.mjs';

const [url, fixture] = process.argv.slice(2);
if (!url || !fixture) {
    console.error('usage: node gw_tsfixture.mjs http://127.0.0.1:PORT/mcp/tsfixture http://127.0.0.1:FIXTURE_PORT');
    process.exit(2);
}
const T = { timeout: 30000 };
const ROOT = { uri: 'file:///tmp/tether-interop-fixture-root', name: 'fixture-root' };
const { log, fetch: recFetch } = recordingFetch();
const errors = [];

const step = stepper(log);

async function stats() {
    const res = await fetch(`${fixture}/stats`);
    check(res.ok, `GET ${fixture}/stats answered ${res.status}`);
    return res.json();
}

const before = await step('fixture /stats before', stats);

const client = new Client({ name: 'tether-interop-gw-url', version: '0.0.0' }, { capabilities: { roots: {} } });
client.onerror = err => errors.push(err);
let rootsAsked = 0;
client.setRequestHandler(ListRootsRequestSchema, async () => {
    rootsAsked += 1;
    return { roots: [ROOT] };
});
const transport = new StreamableHTTPClientTransport(new URL(url), { fetch: recFetch });
await step('connect (initialize through the gateway)', () => client.connect(transport));
const info = client.getServerVersion();
check(info?.name === 'ts-fixture', `serverInfo is not the upstream's: ${JSON.stringify(info)}`);
console.log(`initialize: session ${transport.sessionId}, server ${info.name} ${info.version}`);

const tools = await step('tools/list', () => client.listTools(undefined, T));
checkDeepEqual(tools.tools.map(t => t.name).sort(), ['add', 'echo', 'fail', 'roots'], 'tools/list of the fixture');

const echo = await step('tools/call echo', () => client.callTool({ name: 'echo', arguments: { text: 'via a URL upstream' } }, undefined, T));
checkDeepEqual(echo.content, [{ type: 'text', text: 'via a URL upstream' }], 'echo result');

const add = await step('tools/call add', () => client.callTool({ name: 'add', arguments: { a: 2, b: 40 } }, undefined, T));
checkDeepEqual(add.structuredContent, { sum: 42 }, 'add structuredContent');

const failed = await step('tools/call fail', () => client.callTool({ name: 'fail', arguments: { message: 'as asked' } }, undefined, T));
check(failed.isError === true && failed.content?.[0]?.text === 'as asked', 'fail did not come back as a tool error', failed);

const roots = await step('tools/call roots (the fixture asks roots/list)', () => client.callTool({ name: 'roots', arguments: {} }, undefined, T));
checkDeepEqual(roots.content, [{ type: 'text', text: JSON.stringify([ROOT.uri]) }], 'roots result');
check(rootsAsked === 1, `roots/list reached this client ${rootsAsked} times, want 1`);

const mid = await step('fixture /stats after the calls', stats);
check(mid.initialize === before.initialize + 1, `the fixture saw ${mid.initialize - before.initialize} initialize, want 1`, { before, mid });

await step('terminateSession (DELETE)', () => transport.terminateSession());
const del = log.find(e => e.method === 'DELETE');
check(del && del.status >= 200 && del.status < 300, `DELETE answered ${del?.status}`, renderLog(log));
let after = mid;
for (let i = 0; i < 50 && after.deletes === before.deletes; i++) {
    await new Promise(r => setTimeout(r, 100));
    after = await stats();
}
check(after.deletes === before.deletes + 1, 'tether did not end the upstream session (no DELETE reached the fixture)', { before, after });
console.log(`fixture /stats: initialize +${after.initialize - before.initialize}, posts +${after.posts - before.posts}, deletes +${after.deletes - before.deletes}`);

if (errors.length) fail(`transport/protocol errors were reported:\n${errors.map(e => `  ${e?.stack ?? e}`).join('\n')}`, renderLog(log));
await client.close();
console.log('OK gw_tsfixture.mjs');
process.exit(0);
