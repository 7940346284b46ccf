// Fixture MCP server on the official TypeScript SDK (@modelcontextprotocol/sdk,
// installed in interop/ts/node_modules) for tether's client tests.
//
// usage: node ts_server.mjs PORT
//
// Stateful Streamable HTTP at http://127.0.0.1:PORT/mcp: one McpServer and
// one StreamableHTTPServerTransport per session (the SDK's documented
// pattern); a request without a known session that is not `initialize` gets
// 400 "Bad Request: No valid session ID provided"; an unknown session ID 404.
// Tools: echo(text), add(a, b) (structured {sum}), fail(message) (isError),
// roots() (asks the client roots/list).
// GET /stats answers {"initialize", "posts", "deletes"} counts. Prints READY.

import { createServer } from 'node:http';
import { randomUUID } from 'node:crypto';
import { McpServer } from '../ts/node_modules/@modelcontextprotocol/sdk/dist/esm/server/mcp.js';
import { StreamableHTTPServerTransport } from '../ts/node_modules/@modelcontextprotocol/sdk/dist/esm/server/streamableHttp.js';
import { isInitializeRequest } from '../ts/node_modules/@modelcontextprotocol/sdk/dist/esm/types.js';
import { z } from '../ts/node_modules/zod/index.js';

const port = Number(process.argv[2]);
if (!Number.isInteger(port) || port <= 0) {
    console.error('usage: node ts_server.mjs PORT');
    process.exit(2);
}

const stats = { initialize: 0, posts: 0, deletes: 0 };
const transports = new Map();
const MAX_BODY = 4 * 1024 * 1024;

function newServer() {
    const server = new McpServer({ name: 'ts-fixture', version: '1.0.0' });
    server.registerTool('echo', { description: 'Echo the text back.', inputSchema: { text: z.string() } },
        async ({ text }) => ({ content: [{ type: 'text', text }] }));
    server.registerTool('add', {
        description: 'Add two numbers.',
        inputSchema: { a: z.number(), b: z.number() },
        outputSchema: { sum: z.number() },
    }, async ({ a, b }) => ({ content: [{ type: 'text', text: String(a + b) }], structuredContent: { sum: a + b } }));
    server.registerTool('fail', { description: 'Always fails.', inputSchema: { message: z.string().optional() } },
        async ({ message }) => ({ content: [{ type: 'text', text: message ?? 'failed as asked' }], isError: true }));
    server.registerTool('roots', { description: "The client's roots (asks roots/list)." }, async () => {
        const { roots } = await server.server.listRoots();
        return { content: [{ type: 'text', text: JSON.stringify(roots.map((r) => r.uri)) }] };
    });
    return server;
}

function readBody(req) {
    return new Promise((resolve, reject) => {
        const chunks = [];
        let size = 0;
        req.on('data', (c) => {
            size += c.length;
            if (size > MAX_BODY) {
                reject(new Error('body too large'));
                req.destroy();
            } else {
                chunks.push(c);
            }
        });
        req.on('end', () => resolve(Buffer.concat(chunks).toString('utf8')));
        req.on('error', reject);
    });
}

function jsonError(res, status, message) {
    res.writeHead(status, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ jsonrpc: '2.0', error: { code: -32000, message }, id: null }));
}

const http = createServer(async (req, res) => {
    try {
        const url = new URL(req.url, `http://${req.headers.host}`);
        if (url.pathname === '/stats') {
            res.writeHead(200, { 'content-type': 'application/json' });
            res.end(JSON.stringify(stats));
            return;
        }
        if (url.pathname !== '/mcp') {
            res.writeHead(404).end();
            return;
        }
        const sid = req.headers['mcp-session-id'];
        if (req.method === 'POST') {
            stats.posts += 1;
            const text = await readBody(req);
            let body;
            try {
                body = JSON.parse(text);
            } catch {
                jsonError(res, 400, 'Parse error');
                return;
            }
            if (sid && transports.has(sid)) {
                await transports.get(sid).handleRequest(req, res, body);
                return;
            }
            if (sid) {
                jsonError(res, 404, 'Session not found');
                return;
            }
            if (!isInitializeRequest(body)) {
                jsonError(res, 400, 'Bad Request: No valid session ID provided');
                return;
            }
            stats.initialize += 1;
            const transport = new StreamableHTTPServerTransport({
                sessionIdGenerator: () => randomUUID(),
                onsessioninitialized: (id) => transports.set(id, transport),
            });
            transport.onclose = () => {
                if (transport.sessionId) transports.delete(transport.sessionId);
            };
            await newServer().connect(transport);
            await transport.handleRequest(req, res, body);
            return;
        }
        if (req.method === 'DELETE') stats.deletes += 1;
        if (!sid || !transports.has(sid)) {
            jsonError(res, sid ? 404 : 400, sid ? 'Session not found' : 'Bad Request: No valid session ID provided');
            return;
        }
        await transports.get(sid).handleRequest(req, res);
    } catch (e) {
        if (!res.headersSent) jsonError(res, 500, String(e));
    }
});

http.listen(port, '127.0.0.1', () => console.log('READY'));
for (const sig of ['SIGTERM', 'SIGINT']) process.on(sig, () => process.exit(0));
