// The TypeScript SDK reference system of tether-bench.
//
// An MCP server built as the SDK's own example (examples/server/
// simpleStreamableHttp.js) builds one: one StreamableHTTPServerTransport per
// session, created on `initialize`, with an in-memory event store for
// resumability (priming events, `Last-Event-ID` replay), kept in a map by
// session ID. It is served by plain `node:http` (no express: less work per
// request) with TCP_NODELAY on every socket.
//
// The event store is a small one written here rather than the SDK example's
// InMemoryEventStore: the example sorts every stored event on each replay and
// its IDs (`stream_millis_random`) do not order events written within the same
// millisecond, so a replay of 10,000 events would come out shuffled. This one
// keeps each stream's events in an array and finds an event by its ID in a
// map: appends and replays are as cheap as an in-memory store can make them.
// One store per session, as in the SDK example.
//
// One tool, `thought`, with the input and the structuredContent of tether's
// notebook tool; thoughts are kept in memory per session (as the original
// sequential-thinking server does). Like tether's notebook, the server asks a
// client that declares `roots` for `roots/list` on the standalone stream
// after `notifications/initialized` and on each
// `notifications/roots/list_changed`.
//
// Usage: node server.mjs [--listen 127.0.0.1:0]. Prints
// `listening on http://ADDR/mcp` on stderr, answers GET /healthz, exits on SIGTERM.

import http from 'node:http';
import { randomUUID } from 'node:crypto';
import { Server } from '@modelcontextprotocol/sdk/server/index.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import {
    CallToolRequestSchema,
    ListToolsRequestSchema,
    RootsListChangedNotificationSchema,
    isInitializeRequest
} from '@modelcontextprotocol/sdk/types.js';

/** Per-session in-memory event store: arrays per stream, a map from event ID to its place. */
class MemoryEventStore {
    constructor() {
        this.streams = new Map();
        this.places = new Map();
        this.next = 0;
    }

    async storeEvent(streamId, message) {
        this.next += 1;
        const eventId = String(this.next);
        let events = this.streams.get(streamId);
        if (events === undefined) {
            events = [];
            this.streams.set(streamId, events);
        }
        this.places.set(eventId, { streamId, position: events.length });
        events.push({ eventId, message });
        return eventId;
    }

    async replayEventsAfter(lastEventId, { send }) {
        const place = this.places.get(lastEventId);
        if (place === undefined) {
            return '';
        }
        const events = this.streams.get(place.streamId) ?? [];
        for (let i = place.position + 1; i < events.length; i++) {
            await send(events[i].eventId, events[i].message);
        }
        return place.streamId;
    }
}

const THOUGHT_TOOL = {
    name: 'thought',
    description: 'Record one step of sequential thinking (kept in memory for this session).',
    inputSchema: {
        type: 'object',
        properties: {
            thought: { type: 'string' },
            thoughtNumber: { type: 'integer', minimum: 1 },
            totalThoughts: { type: 'integer', minimum: 1 },
            nextThoughtNeeded: { type: 'boolean' }
        },
        required: ['thought', 'thoughtNumber', 'totalThoughts', 'nextThoughtNeeded']
    },
    outputSchema: {
        type: 'object',
        properties: {
            thoughtNumber: { type: 'integer' },
            totalThoughts: { type: 'integer' },
            nextThoughtNeeded: { type: 'boolean' },
            branches: { type: 'array', items: { type: 'string' } },
            thoughtHistoryLength: { type: 'integer' }
        },
        required: ['thoughtNumber', 'totalThoughts', 'nextThoughtNeeded', 'branches', 'thoughtHistoryLength']
    }
};

function toolError(message) {
    return { content: [{ type: 'text', text: message }], isError: true };
}

function positive(args, key) {
    const v = args[key];
    return Number.isInteger(v) && v >= 1 ? v : undefined;
}

/** One MCP session's server. */
function makeServer() {
    const server = new Server({ name: 'tether-bench-ts-sdk-ref', version: '0.0.0' }, { capabilities: { tools: {} } });
    const history = [];

    server.setRequestHandler(ListToolsRequestSchema, async () => ({ tools: [THOUGHT_TOOL] }));
    server.setRequestHandler(CallToolRequestSchema, async request => {
        if (request.params.name !== 'thought') {
            return toolError(`unknown tool \`${request.params.name}\``);
        }
        const args = request.params.arguments ?? {};
        if (typeof args.thought !== 'string' || args.thought.trim() === '') {
            return toolError('`thought` must be a non-empty string');
        }
        const number = positive(args, 'thoughtNumber');
        const total = positive(args, 'totalThoughts');
        if (number === undefined || total === undefined) {
            return toolError('`thoughtNumber` and `totalThoughts` must be integers of 1 or more');
        }
        if (typeof args.nextThoughtNeeded !== 'boolean') {
            return toolError('`nextThoughtNeeded` must be true or false');
        }
        history.push(args.thought);
        const structured = {
            thoughtNumber: number,
            totalThoughts: Math.max(total, number),
            nextThoughtNeeded: args.nextThoughtNeeded,
            branches: [],
            thoughtHistoryLength: history.length
        };
        return { content: [{ type: 'text', text: JSON.stringify(structured) }], structuredContent: structured };
    });

    const askRoots = () => {
        if (server.getClientCapabilities()?.roots) {
            server.listRoots().catch(() => {});
        }
    };
    server.oninitialized = askRoots;
    server.setNotificationHandler(RootsListChangedNotificationSchema, async () => askRoots());
    return server;
}

const transports = new Map();

function sendJson(res, status, body) {
    res.writeHead(status, { 'content-type': 'application/json' });
    res.end(JSON.stringify(body));
}

function rpcError(res, status, code, message) {
    sendJson(res, status, { jsonrpc: '2.0', error: { code, message }, id: null });
}

function readBody(req) {
    return new Promise((resolve, reject) => {
        const chunks = [];
        req.on('data', chunk => chunks.push(chunk));
        req.on('end', () => resolve(Buffer.concat(chunks).toString('utf8')));
        req.on('error', reject);
    });
}

async function handle(req, res) {
    const path = (req.url ?? '').split('?')[0];
    if (path === '/healthz') {
        sendJson(res, 200, { status: 'ok' });
        return;
    }
    if (path !== '/mcp') {
        rpcError(res, 404, -32000, 'Not found');
        return;
    }
    const sessionId = req.headers['mcp-session-id'];
    if (req.method === 'POST') {
        let body;
        try {
            body = JSON.parse(await readBody(req));
        } catch {
            rpcError(res, 400, -32700, 'Parse error');
            return;
        }
        if (sessionId) {
            const transport = transports.get(sessionId);
            if (transport === undefined) {
                rpcError(res, 404, -32001, 'Session not found');
                return;
            }
            await transport.handleRequest(req, res, body);
            return;
        }
        if (!isInitializeRequest(body)) {
            rpcError(res, 400, -32000, 'Bad Request: No valid session ID provided');
            return;
        }
        const transport = new StreamableHTTPServerTransport({
            sessionIdGenerator: () => randomUUID(),
            eventStore: new MemoryEventStore(),
            onsessioninitialized: id => transports.set(id, transport)
        });
        transport.onclose = () => {
            if (transport.sessionId) {
                transports.delete(transport.sessionId);
            }
        };
        await makeServer().connect(transport);
        await transport.handleRequest(req, res, body);
        return;
    }
    if (req.method === 'GET' || req.method === 'DELETE') {
        const transport = sessionId ? transports.get(sessionId) : undefined;
        if (transport === undefined) {
            rpcError(res, sessionId ? 404 : 400, -32001, 'Session not found');
            return;
        }
        await transport.handleRequest(req, res);
        return;
    }
    rpcError(res, 405, -32000, 'Method not allowed');
}

function listenArg() {
    const i = process.argv.indexOf('--listen');
    const value = i >= 0 ? process.argv[i + 1] : '127.0.0.1:0';
    const colon = value?.lastIndexOf(':') ?? -1;
    if (colon < 0) {
        console.error(`--listen needs HOST:PORT, got ${value}`);
        process.exit(2);
    }
    return { host: value.slice(0, colon), port: Number(value.slice(colon + 1)) };
}

const { host, port } = listenArg();
const httpServer = http.createServer({ noDelay: true, keepAliveTimeout: 60_000 }, (req, res) => {
    handle(req, res).catch(error => {
        console.error('error handling a request:', error);
        if (!res.headersSent) {
            rpcError(res, 500, -32603, 'Internal server error');
        } else {
            res.end();
        }
    });
});
httpServer.on('connection', socket => socket.setNoDelay(true));
httpServer.listen(port, host, () => {
    const address = httpServer.address();
    console.error(`ts-sdk reference listening on http://${address.address}:${address.port}/mcp (node ${process.version})`);
});
process.on('SIGTERM', () => process.exit(0));
process.on('SIGINT', () => process.exit(0));
