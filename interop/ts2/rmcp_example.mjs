// The rmcp example (crates/tether/examples/rmcp_server.rs: an rmcp handler with
// the tools echo and slow, served by tether's engine) with the official MCP
// TypeScript SDK v2 client (@modelcontextprotocol/client 2.x) over the
// sessionless revision 2026-07-28.
//
// usage: node rmcp_example.mjs http://127.0.0.1:PORT/mcp
//
// A Client with versionNegotiation { mode: 'auto' } probes server/discover and
// selects the modern era; tools/list is exactly echo and slow; tools/call echo
// returns its text; tools/call slow {steps: 3} with onprogress gets progress 1,
// 2, 3 of 3 in order, then "done after 3 steps". From the HTTP log (a fetch
// wrapper): the first request was server/discover, no initialize, no
// Mcp-Session-Id sent or answered, no GET or DELETE, every POST carried
// MCP-Protocol-Version 2026-07-28 and Mcp-Method.
import { inspect } from 'node:util';

import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import { check, fail, recordingFetch } from '../ts/lib.mjs';

const MODERN = '2026-07-28';
const ECHO_TEXT = 'hello from the TypeScript SDK v2';
const STEPS = 3;

function renderLog(log) {
    return log
        .map(e => {
            const rpc = e.body && typeof e.body === 'object' ? ` ${e.body.method ?? 'response'}#${e.body.id ?? '-'}` : '';
            const h = e.headers;
            return `  ${e.method}${rpc} mcp-protocol-version=${h['mcp-protocol-version'] ?? '(none)'} mcp-method=${h['mcp-method'] ?? '(none)'} mcp-session-id=${h['mcp-session-id'] ?? '(none)'} -> ${e.status} ${e.contentType ?? ''}`;
        })
        .join('\n');
}

const [urlArg] = process.argv.slice(2);
if (!urlArg) {
    console.error('usage: node rmcp_example.mjs http://127.0.0.1:PORT/mcp');
    process.exit(2);
}
const { log, fetch: recFetch } = recordingFetch();
try {
    const client = new Client({ name: 'tether-interop-ts2-rmcp', version: '1.0.0' }, { versionNegotiation: { mode: 'auto' } });
    await client.connect(new StreamableHTTPClientTransport(new URL(urlArg), { fetch: recFetch }));
    check(client.getProtocolEra() === 'modern', `auto: era ${client.getProtocolEra()}, want modern`, renderLog(log));
    check(client.getNegotiatedProtocolVersion() === MODERN, `auto: version ${client.getNegotiatedProtocolVersion()}, want ${MODERN}`, renderLog(log));

    const { tools } = await client.listTools();
    const names = tools.map(t => t.name).sort();
    check(JSON.stringify(names) === JSON.stringify(['echo', 'slow']), `tools/list is not exactly echo and slow: ${names}`, tools);

    const echo = await client.callTool({ name: 'echo', arguments: { text: ECHO_TEXT } });
    check(echo.isError !== true, 'tools/call echo returned isError', echo);
    check(JSON.stringify(echo.content) === JSON.stringify([{ type: 'text', text: ECHO_TEXT }]), 'tools/call echo: wrong content', echo);

    const progress = [];
    const slow = await client.callTool({ name: 'slow', arguments: { steps: STEPS } }, { onprogress: p => progress.push(p), timeout: 60000 });
    check(slow.isError !== true, 'tools/call slow returned isError', slow);
    check(slow.content?.[0]?.text === `done after ${STEPS} steps`, 'tools/call slow: wrong result', slow);
    const values = progress.map(p => [p.progress, p.total]);
    check(
        JSON.stringify(values) === JSON.stringify([1, 2, 3].map(i => [i, STEPS])),
        `progress ${JSON.stringify(values)}, want 1, 2, 3 of ${STEPS} in order`,
        renderLog(log)
    );
    await client.close();

    check(log.length > 0, 'no HTTP request was recorded');
    for (const e of log) {
        const rpc = e.body && typeof e.body === 'object' ? e.body.method : undefined;
        check(e.method === 'POST', `a ${e.method} was sent (2026-07-28 has no GET stream and no DELETE)`, renderLog(log));
        check(rpc !== 'initialize', 'initialize was sent', renderLog(log));
        check(e.headers['mcp-session-id'] === undefined, 'an Mcp-Session-Id was sent', renderLog(log));
        check(!e.responseSessionId, 'the server answered with an Mcp-Session-Id', renderLog(log));
        check(e.headers['mcp-protocol-version'] === MODERN, `a POST without MCP-Protocol-Version ${MODERN}`, renderLog(log));
        if (rpc) check(e.headers['mcp-method'] === rpc, `Mcp-Method ${e.headers['mcp-method']} for ${rpc}`, renderLog(log));
        check(e.status === 200, `${rpc} answered HTTP ${e.status}`, renderLog(log));
    }
    check(log[0].body?.method === 'server/discover', `the first request was ${log[0].body?.method}, want server/discover`, renderLog(log));
    console.log(`HTTP log:\n${renderLog(log)}`);
    console.log(
        `auto: server/discover -> ${MODERN}; tools ${names.join(', ')}; echo ok; slow: progress ${progress.map(p => p.progress).join(', ')} of ${STEPS}, ` +
            `then "${slow.content[0].text}"; ${log.length} POSTs, no initialize, no Mcp-Session-Id`
    );
} catch (e) {
    fail('unexpected error', `${e?.stack ?? inspect(e)}\nHTTP log:\n${renderLog(log)}`);
}
console.log('PASS ts2-rmcp');
process.exit(0);
