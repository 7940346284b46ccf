// Conformance fixture: an MCP server on the official TypeScript SDK v2
// (@modelcontextprotocol/server, installed in interop/conformance/node_modules)
// offering every tool, prompt and resource the server scenarios of the official
// conformance suite (@modelcontextprotocol/conformance) call, for both protocol
// revisions on one endpoint.
//
// usage: node server.mjs PORT        (or PORT=... node server.mjs)
//
// Streamable HTTP at http://127.0.0.1:PORT/mcp:
//   - 2026-07-28 traffic (requests carrying the per-request _meta envelope,
//     server/discover, subscriptions/listen) goes to the SDK's
//     createMcpHandler (sessionless, input_required rounds for client input);
//   - 2025-era traffic (initialize, then Mcp-Session-Id) is served statefully:
//     one McpServer and one WebStandardStreamableHTTPServerTransport per
//     session, with an in-memory event store (priming events, Last-Event-ID
//     replay) so server-to-client requests (sampling, elicitation), logging,
//     progress and SSE polling work as the 2025-11-25 scenarios expect.
// Both legs are built by the same makeServer() factory. Requests whose Host or
// Origin is not local are refused (DNS rebinding protection).
// Prints READY once listening; GET /healthz answers 200.

import { createServer } from 'node:http';
import { randomBytes, randomUUID } from 'node:crypto';
import {
    CLIENT_CAPABILITIES_META_KEY,
    McpServer,
    ProtocolError,
    ProtocolErrorCode,
    ResourceTemplate,
    WebStandardStreamableHTTPServerTransport,
    acceptedContent,
    completable,
    createMcpHandler,
    createRequestStateCodec,
    fromJsonSchema,
    hostHeaderValidationResponse,
    inputRequired,
    isInitializeRequest,
    isLegacyRequest,
    localhostAllowedHostnames,
    localhostAllowedOrigins,
    originValidationResponse,
} from '@modelcontextprotocol/server';
import * as z from 'zod';

const port = Number(process.argv[2] ?? process.env.PORT);
if (!Number.isInteger(port) || port <= 0) {
    console.error('usage: node server.mjs PORT');
    process.exit(2);
}

const MAX_BODY = 4 * 1024 * 1024;
// A 1x1 PNG and a tiny WAV, base64.
const PNG = 'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==';
const WAV = 'UklGRiYAAABXQVZFZm10IBAAAAABAAEAQB8AAAB9AAACABAAZGF0YQIAAAA=';

// requestState round-trips through the client: sealed (HMAC, per-process key)
// when minted, checked by the SDK before a retried request reaches a handler.
const stateCodec = createRequestStateCodec({ key: randomBytes(32) });

const text = (t) => ({ content: [{ type: 'text', text: t }] });
const askName = (message = 'What is your name?') => inputRequired.elicit({
    message,
    requestedSchema: { type: 'object', properties: { name: { type: 'string' } }, required: ['name'] },
});
const askConfirm = () => inputRequired.elicit({
    message: 'Please confirm',
    requestedSchema: { type: 'object', properties: { ok: { type: 'boolean' } }, required: ['ok'] },
});
const askLlm = (prompt, maxTokens) => inputRequired.createMessage({
    messages: [{ role: 'user', content: { type: 'text', text: prompt } }],
    maxTokens,
});

// ---------------------------------------------------------------- the server

function makeServer() {
    const server = new McpServer(
        { name: 'tether-conformance-fixture', version: '1.0.0' },
        {
            capabilities: {
                tools: { listChanged: true },
                resources: { subscribe: true, listChanged: true },
                prompts: { listChanged: true },
                logging: {},
                completions: {},
            },
            requestState: { verify: stateCodec.verify },
        },
    );
    const none = { inputSchema: z.object({}) };

    // --- content tools (tools-call-*)
    const fixed = {
        test_simple_text: ['Returns one text block.', [{ type: 'text', text: 'This is a simple text response for testing.' }]],
        test_image_content: ['Returns one PNG image block.', [{ type: 'image', data: PNG, mimeType: 'image/png' }]],
        test_audio_content: ['Returns one WAV audio block.', [{ type: 'audio', data: WAV, mimeType: 'audio/wav' }]],
        test_embedded_resource: ['Returns an embedded text resource.', [{
            type: 'resource',
            resource: { uri: 'test://embedded-resource', mimeType: 'text/plain', text: 'This is an embedded resource content.' },
        }]],
        test_multiple_content_types: ['Returns text, image and resource blocks.', [
            { type: 'text', text: 'Multiple content types test:' },
            { type: 'image', data: PNG, mimeType: 'image/png' },
            {
                type: 'resource',
                resource: { uri: 'test://mixed-content-resource', mimeType: 'application/json', text: JSON.stringify({ test: 'data', value: 123 }) },
            },
        ]],
    };
    for (const [name, [description, content]] of Object.entries(fixed)) {
        server.registerTool(name, { description }, async () => ({ content }));
    }

    server.registerTool('test_error_handling', { description: 'Always fails (isError).' }, async () => {
        throw new Error('This tool intentionally returns an error for testing');
    });

    server.registerTool('test_tool_with_logging', { description: 'Logs three messages while it runs.', ...none }, async (_a, ctx) => {
        for (const step of ['Tool execution started', 'Tool processing data', 'Tool execution completed']) {
            await ctx.mcpReq.notify({ method: 'notifications/message', params: { level: 'info', logger: 'fixture', data: step } });
            await sleep(20);
        }
        return text('Tool with logging executed successfully');
    });

    server.registerTool('test_tool_with_progress', { description: 'Reports progress 0, 50, 100 when given a progressToken.', ...none }, async (_a, ctx) => {
        const token = ctx.mcpReq._meta?.progressToken;
        if (token !== undefined) {
            for (const progress of [0, 50, 100]) {
                await ctx.mcpReq.notify({
                    method: 'notifications/progress',
                    params: { progressToken: token, progress, total: 100, message: `step ${progress}/100` },
                });
                if (progress < 100) await sleep(20);
            }
        }
        return text(`progress reported for token ${token ?? '(none)'}`);
    });

    // SSE polling (SEP-1699, 2025-11-25): close this request's SSE stream
    // mid-call; the result then reaches the client when it reconnects with
    // Last-Event-ID (replayed from the event store).
    server.registerTool('test_reconnection', { description: 'Closes its SSE stream mid-call, then answers.', ...none }, async (_a, ctx) => {
        ctx.http?.closeSSE?.();
        await sleep(100);
        return text('Reconnection test completed successfully: the result arrived after the stream was closed.');
    });

    // --- server-to-client requests on a 2025 session
    server.registerTool('test_sampling', {
        description: 'Asks the client for an LLM completion (sampling/createMessage).',
        inputSchema: z.object({ prompt: z.string() }),
    }, async ({ prompt }, ctx) => {
        const r = await ctx.mcpReq.requestSampling({ messages: [{ role: 'user', content: { type: 'text', text: prompt } }], maxTokens: 100 });
        const content = Array.isArray(r.content) ? r.content[0] : r.content;
        return text(`LLM response: ${content?.text ?? JSON.stringify(r.content)}`);
    });

    const elicitTool = (name, description, params) => server.registerTool(name, { description, ...params.input }, async (args, ctx) => {
        const r = await ctx.mcpReq.elicitInput(params.request(args));
        return text(`${params.prefix}: action=${r.action}, content=${JSON.stringify(r.content ?? {})}`);
    });
    elicitTool('test_elicitation', 'Asks the user for input (elicitation/create).', {
        input: { inputSchema: z.object({ message: z.string() }) },
        prefix: 'User response',
        request: ({ message }) => ({
            message,
            requestedSchema: { type: 'object', properties: { response: { type: 'string', description: 'Your answer' } }, required: ['response'] },
        }),
    });
    elicitTool('test_elicitation_sep1034_defaults', 'Elicitation with defaults for every primitive type (SEP-1034).', {
        input: none,
        prefix: 'Elicitation completed',
        request: () => ({
            message: 'Check the prefilled fields',
            requestedSchema: {
                type: 'object',
                properties: {
                    name: { type: 'string', description: 'Name', default: 'John Doe' },
                    age: { type: 'integer', description: 'Age', default: 30 },
                    score: { type: 'number', description: 'Score', default: 95.5 },
                    status: { type: 'string', description: 'Status', enum: ['active', 'inactive', 'pending'], default: 'active' },
                    verified: { type: 'boolean', description: 'Verified', default: true },
                },
                required: [],
            },
        }),
    });
    const titled = (prefix, names) => names.map((title, i) => ({ const: `${prefix}${i + 1}`, title }));
    elicitTool('test_elicitation_sep1330_enums', 'Elicitation with the five enum schema shapes (SEP-1330).', {
        input: none,
        prefix: 'Elicitation completed',
        request: () => ({
            message: 'Pick from each list',
            requestedSchema: {
                type: 'object',
                properties: {
                    untitledSingle: { type: 'string', description: 'One of three', enum: ['option1', 'option2', 'option3'] },
                    titledSingle: { type: 'string', description: 'One of three, titled', oneOf: titled('value', ['First Option', 'Second Option', 'Third Option']) },
                    legacyEnum: {
                        type: 'string', description: 'One of three, enumNames', enum: ['opt1', 'opt2', 'opt3'],
                        enumNames: ['Option One', 'Option Two', 'Option Three'],
                    },
                    untitledMulti: {
                        type: 'array', description: 'Several of three', minItems: 1, maxItems: 3,
                        items: { type: 'string', enum: ['option1', 'option2', 'option3'] },
                    },
                    titledMulti: {
                        type: 'array', description: 'Several of three, titled', minItems: 1, maxItems: 3,
                        items: { anyOf: titled('value', ['First Choice', 'Second Choice', 'Third Choice']) },
                    },
                },
                required: [],
            },
        }),
    });

    // --- schemas passed through verbatim (SEP-1613, SEP-2106)
    server.registerTool('json_schema_2020_12_tool', {
        description: 'Input schema using JSON Schema 2020-12 keywords.',
        inputSchema: fromJsonSchema({
            $schema: 'https://json-schema.org/draft/2020-12/schema',
            type: 'object',
            $defs: {
                address: { $anchor: 'addressDef', type: 'object', properties: { street: { type: 'string' }, city: { type: 'string' } } },
            },
            properties: {
                name: { type: 'string' },
                address: { $ref: '#/$defs/address' },
                contactMethod: { type: 'string', enum: ['phone', 'email'] },
                phone: { type: 'string' },
                email: { type: 'string' },
            },
            allOf: [{ anyOf: [{ required: ['phone'] }, { required: ['email'] }] }],
            if: { properties: { contactMethod: { const: 'phone' } }, required: ['contactMethod'] },
            then: { required: ['phone'] },
            else: { required: ['email'] },
            additionalProperties: false,
        }),
    }, async (args) => text(`json_schema_2020_12_tool got ${JSON.stringify(args)}`));

    // SEP-2243: a parameter mirrored into the Mcp-Param-Region header.
    server.registerTool('test_x_mcp_header', {
        description: 'Has an argument mirrored into an Mcp-Param header (SEP-2243).',
        inputSchema: fromJsonSchema({
            type: 'object',
            properties: {
                region: { type: 'string', description: 'also sent as Mcp-Param-Region', 'x-mcp-header': 'Region' },
                level: { type: 'integer', description: 'not mirrored' },
            },
        }),
    }, async (args) => text(`region=${args.region ?? '(none)'}`));

    // --- SEP-2575 (server-stateless) diagnostics
    server.registerTool('test_missing_capability', { description: 'Needs the sampling client capability.', ...none }, async (_a, ctx) => {
        if (ctx.mcpReq.inputResponses?.answer === undefined) {
            return inputRequired({ inputRequests: { answer: askLlm('Say pong', 16) } });
        }
        return text('sampled');
    });
    server.registerTool('test_streaming_elicitation', { description: 'A plain call (its response stream carries no requests).', ...none },
        async () => text('no requests on this stream'));
    server.registerTool('test_logging_tool', { description: 'Logs through the request (only when _meta.logLevel asks).', ...none }, async (_a, ctx) => {
        await ctx.mcpReq.log('info', 'test_logging_tool ran');
        return text('logged');
    });
    server.registerTool('test_trigger_tool_change', { description: 'Announces a tools/list_changed.', ...none }, async () => {
        modern.notify.toolsChanged();
        server.sendToolListChanged();
        return text('tools list_changed sent');
    });
    server.registerTool('test_trigger_prompt_change', { description: 'Announces a prompts/list_changed.', ...none }, async () => {
        modern.notify.promptsChanged();
        server.sendPromptListChanged();
        return text('prompts list_changed sent');
    });

    // --- SEP-2322 multi round-trip (input_required results, 2026-07-28)
    server.registerTool('test_input_required_result_elicitation', { description: 'Asks for a name (elicitation round).', ...none }, async (_a, ctx) => {
        const name = acceptedContent(ctx.mcpReq.inputResponses, 'user_name')?.name;
        if (typeof name !== 'string') return inputRequired({ inputRequests: { user_name: askName() } });
        return text(`Hello, ${name}!`);
    });
    server.registerTool('test_input_required_result_sampling', { description: 'Asks for an LLM completion (sampling round).', ...none }, async (_a, ctx) => {
        const r = ctx.mcpReq.inputResponses?.capital_question;
        if (r === undefined) return inputRequired({ inputRequests: { capital_question: askLlm('What is the capital of France?', 100) } });
        return text(`Sampling response: ${r?.content?.text ?? JSON.stringify(r)}`);
    });
    server.registerTool('test_input_required_result_list_roots', { description: 'Asks for the client roots (roots round).', ...none }, async (_a, ctx) => {
        const roots = ctx.mcpReq.inputResponses?.client_roots?.roots;
        if (!Array.isArray(roots)) return inputRequired({ inputRequests: { client_roots: inputRequired.listRoots() } });
        return text(`Client exposed ${roots.length} root(s): ${roots.map((r) => r.uri).join(', ')}`);
    });
    server.registerTool('test_input_required_result_request_state', { description: 'Round-trips a sealed requestState.', ...none }, async (_a, ctx) => {
        if (acceptedContent(ctx.mcpReq.inputResponses, 'confirm') === undefined) {
            return inputRequired({ inputRequests: { confirm: askConfirm() }, requestState: await stateCodec.mint({ tool: 'request_state', n: randomUUID() }) });
        }
        if (ctx.mcpReq.requestState()?.tool !== 'request_state') {
            throw new ProtocolError(ProtocolErrorCode.InvalidParams, 'requestState missing or not minted for this tool');
        }
        return text('state-ok: requestState verified, confirmation received');
    });
    server.registerTool('test_input_required_result_multiple_inputs', { description: 'Asks for elicitation, sampling and roots at once.', ...none }, async (_a, ctx) => {
        const got = ctx.mcpReq.inputResponses;
        const name = acceptedContent(got, 'user_name')?.name;
        const greeting = got?.greeting?.content?.text;
        const roots = got?.client_roots?.roots;
        if (typeof name !== 'string' || typeof greeting !== 'string' || !Array.isArray(roots)) {
            return inputRequired({
                inputRequests: { user_name: askName(), greeting: askLlm('Generate a greeting', 50), client_roots: inputRequired.listRoots() },
                requestState: await stateCodec.mint({ tool: 'multiple_inputs', n: randomUUID() }),
            });
        }
        return text(`${greeting} ${name} (${roots.length} root(s))`);
    });
    server.registerTool('test_input_required_result_multi_round', { description: 'Two elicitation rounds, state carried in requestState.', ...none }, async (_a, ctx) => {
        const state = ctx.mcpReq.requestState();
        const round = state?.tool === 'multi_round' ? state.round : 0;
        if (round === 0) {
            return inputRequired({
                inputRequests: { step1: askName('Step 1: What is your name?') },
                requestState: await stateCodec.mint({ tool: 'multi_round', round: 1 }),
            });
        }
        if (round === 1) {
            const name = acceptedContent(ctx.mcpReq.inputResponses, 'step1')?.name ?? 'unknown';
            return inputRequired({
                inputRequests: {
                    step2: inputRequired.elicit({
                        message: 'Step 2: What is your favorite color?',
                        requestedSchema: { type: 'object', properties: { color: { type: 'string' } }, required: ['color'] },
                    }),
                },
                requestState: await stateCodec.mint({ tool: 'multi_round', round: 2, name }),
            });
        }
        const color = acceptedContent(ctx.mcpReq.inputResponses, 'step2')?.color ?? 'unknown';
        return text(`Multi-round complete: ${state.name} likes ${color}`);
    });
    server.registerTool('test_input_required_result_tampered_state', { description: 'Rejects a requestState that fails verification.', ...none }, async (_a, ctx) => {
        if (ctx.mcpReq.requestState() !== undefined && acceptedContent(ctx.mcpReq.inputResponses, 'confirm') !== undefined) {
            return text('integrity-ok: requestState verified');
        }
        return inputRequired({ inputRequests: { confirm: askConfirm() }, requestState: await stateCodec.mint({ tool: 'tampered_state', n: randomUUID() }) });
    });
    server.registerTool('test_input_required_result_capabilities', { description: 'Asks only for input kinds the client declared.', ...none }, async (_a, ctx) => {
        if (ctx.mcpReq.inputResponses !== undefined) return text('declared-capability input received');
        // 2026-07-28: the request's envelope; a 2025 session: what initialize declared.
        const caps = ctx.mcpReq.envelope?.[CLIENT_CAPABILITIES_META_KEY] ?? server.server.getClientCapabilities() ?? {};
        const inputRequests = {};
        if (caps.elicitation !== undefined) inputRequests.user_name = askName();
        if (caps.sampling !== undefined) inputRequests.greeting = askLlm('Generate a short greeting', 50);
        if (caps.roots !== undefined) inputRequests.client_roots = inputRequired.listRoots();
        if (Object.keys(inputRequests).length === 0) return text('the client declared no capability to ask through');
        return inputRequired({ inputRequests });
    });

    // ------------------------------------------------------------ resources
    const resource = (name, uri, mimeType, body) => server.registerResource(name, uri, { title: name, mimeType },
        async () => ({ contents: [{ uri, mimeType, ...body }] }));
    resource('static-text', 'test://static-text', 'text/plain', { text: 'This is the content of the static text resource.' });
    resource('static-binary', 'test://static-binary', 'image/png', { blob: PNG });
    resource('watched-resource', 'test://watched-resource', 'text/plain', { text: 'Watched resource content' });
    server.registerResource('template', new ResourceTemplate('test://template/{id}/data', {
        list: undefined,
        complete: { id: (value) => ['123', '456', '789'].filter((id) => id.startsWith(value)) },
    }), { title: 'template', mimeType: 'application/json' }, async (uri, { id }) => ({
        contents: [{ uri: uri.href, mimeType: 'application/json', text: JSON.stringify({ id, templateTest: true, data: `Data for ID: ${id}` }) }],
    }));
    const subscribed = new Set();
    server.server.setRequestHandler('resources/subscribe', async (req) => {
        subscribed.add(req.params.uri);
        return {};
    });
    server.server.setRequestHandler('resources/unsubscribe', async (req) => {
        subscribed.delete(req.params.uri);
        return {};
    });

    // -------------------------------------------------------------- prompts
    server.registerPrompt('test_simple_prompt', { description: 'No arguments.' }, async () => ({
        messages: [{ role: 'user', content: { type: 'text', text: 'This is a simple prompt for testing.' } }],
    }));
    const words = ['test', 'testing', 'tested', 'tether', 'hello', 'world'];
    server.registerPrompt('test_prompt_with_arguments', {
        description: 'Two string arguments.',
        argsSchema: z.object({
            arg1: completable(z.string().describe('First argument'), (v) => words.filter((w) => w.startsWith(v))),
            arg2: z.string().describe('Second argument'),
        }),
    }, async ({ arg1, arg2 }) => ({
        messages: [{ role: 'user', content: { type: 'text', text: `Prompt with arguments: arg1='${arg1}', arg2='${arg2}'` } }],
    }));
    server.registerPrompt('test_prompt_with_embedded_resource', {
        description: 'Embeds the resource named by resourceUri.',
        argsSchema: z.object({ resourceUri: z.string().describe('URI to embed') }),
    }, async ({ resourceUri }) => ({
        messages: [
            { role: 'user', content: { type: 'resource', resource: { uri: resourceUri, mimeType: 'text/plain', text: 'Embedded resource content for testing.' } } },
            { role: 'user', content: { type: 'text', text: 'Please process the embedded resource above.' } },
        ],
    }));
    server.registerPrompt('test_prompt_with_image', { description: 'An image, then text.' }, async () => ({
        messages: [
            { role: 'user', content: { type: 'image', data: PNG, mimeType: 'image/png' } },
            { role: 'user', content: { type: 'text', text: 'Please analyze the image above.' } },
        ],
    }));
    server.registerPrompt('test_input_required_result_prompt', { description: 'Asks for context (elicitation round) before rendering.' }, async (ctx) => {
        const context = acceptedContent(ctx.mcpReq.inputResponses, 'user_context')?.context;
        if (typeof context !== 'string') {
            return inputRequired({
                inputRequests: {
                    user_context: inputRequired.elicit({
                        message: 'What context should the prompt use?',
                        requestedSchema: { type: 'object', properties: { context: { type: 'string' } }, required: ['context'] },
                    }),
                },
            });
        }
        return { messages: [{ role: 'user', content: { type: 'text', text: `Use the following context: ${context}` } }] };
    });

    server.server.setRequestHandler('logging/setLevel', async () => ({}));
    return server;
}

function sleep(ms) {
    return new Promise((resolve) => setTimeout(resolve, ms));
}

// ---------------------------------------------------------------- serving

// 2026-07-28: one fresh server per request, no session.
const modern = createMcpHandler(() => makeServer(), {
    legacy: 'reject',
    onerror: (e) => console.error('modern:', e.message),
});

// 2025-era sessions: Mcp-Session-Id -> transport. The event store keeps each
// stream's events (id = "<stream>.<seq>") for Last-Event-ID replay.
const sessions = new Map();
function eventStore() {
    const streams = new Map();
    let seq = 0;
    return {
        async storeEvent(streamId, message) {
            const id = `${streamId}.${String(++seq).padStart(12, '0')}`;
            if (!streams.has(streamId)) streams.set(streamId, []);
            streams.get(streamId).push({ id, message });
            return id;
        },
        async replayEventsAfter(lastEventId, { send }) {
            const streamId = lastEventId.slice(0, lastEventId.lastIndexOf('.'));
            for (const e of streams.get(streamId) ?? []) {
                if (e.id > lastEventId && e.message && Object.keys(e.message).length > 0) await send(e.id, e.message);
            }
            return streamId;
        },
    };
}

const jsonError = (status, code, message) => Response.json({ jsonrpc: '2.0', error: { code, message }, id: null }, { status });

async function legacy(request) {
    const sid = request.headers.get('mcp-session-id');
    if (sid) {
        const s = sessions.get(sid);
        return s ? s.transport.handleRequest(request) : jsonError(404, -32001, 'Session not found');
    }
    if (request.method !== 'POST') return jsonError(400, -32000, 'Bad Request: Mcp-Session-Id required');
    const body = await request.clone().json().catch(() => undefined);
    if (!isInitializeRequest(body)) return jsonError(400, -32000, 'Bad Request: Mcp-Session-Id required');
    const server = makeServer();
    const transport = new WebStandardStreamableHTTPServerTransport({
        sessionIdGenerator: () => randomUUID(),
        eventStore: eventStore(),
        retryInterval: 1000,
        onsessioninitialized: (id) => sessions.set(id, { transport, server }),
        onsessionclosed: (id) => sessions.delete(id),
    });
    transport.onclose = () => {
        if (transport.sessionId) sessions.delete(transport.sessionId);
    };
    await server.connect(transport);
    return transport.handleRequest(request, { parsedBody: body });
}

async function route(request) {
    const refused = hostHeaderValidationResponse(request, localhostAllowedHostnames())
        ?? originValidationResponse(request, localhostAllowedOrigins());
    if (refused) return refused;
    if (request.method === 'POST' && !(await isLegacyRequest(request))) return modern.fetch(request);
    return legacy(request);
}

// node:http <-> fetch Request/Response.
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
        req.on('end', () => resolve(Buffer.concat(chunks)));
        req.on('error', reject);
    });
}

const http = createServer(async (req, res) => {
    const path = req.url.split('?')[0];
    if (path === '/healthz') {
        res.writeHead(200, { 'content-type': 'text/plain' }).end('ok\n');
        return;
    }
    if (path !== '/mcp') {
        res.writeHead(404).end();
        return;
    }
    const aborter = new AbortController();
    res.on('close', () => aborter.abort());
    try {
        const body = req.method === 'GET' || req.method === 'HEAD' ? undefined : await readBody(req);
        const headers = new Headers();
        for (const [k, v] of Object.entries(req.headers)) headers.set(k, Array.isArray(v) ? v.join(', ') : v);
        const request = new Request(`http://${req.headers.host ?? `127.0.0.1:${port}`}${req.url}`, {
            method: req.method, headers, body, signal: aborter.signal,
        });
        const response = await route(request);
        res.writeHead(response.status, Object.fromEntries(response.headers));
        res.flushHeaders();
        if (!response.body) {
            res.end();
            return;
        }
        const reader = response.body.getReader();
        res.on('close', () => reader.cancel().catch(() => {}));
        for (;;) {
            const { done, value } = await reader.read();
            if (done) break;
            res.write(value);
        }
        res.end();
    } catch (e) {
        if (!res.headersSent) {
            res.writeHead(500, { 'content-type': 'application/json' });
            res.end(JSON.stringify({ jsonrpc: '2.0', error: { code: -32603, message: String(e?.message ?? e) }, id: null }));
        } else {
            res.destroy();
        }
    }
});
http.listen(port, '127.0.0.1', () => console.log(`READY http://127.0.0.1:${port}/mcp`));
// Nothing to flush: stop at once, open streams and all.
for (const sig of ['SIGINT', 'SIGTERM']) process.on(sig, () => process.exit(0));
