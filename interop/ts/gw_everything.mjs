// Gateway interop check: the official TypeScript SDK client (v1) against
// @modelcontextprotocol/server-everything, a stdio server that tether serves at
// /mcp/everything (`--upstream 'everything=stdio:.../mcp-server-everything stdio'`).
// interop/run.sh runs it unchanged a second time against the same package in its
// Streamable HTTP mode, a URL upstream at /mcp/everything-http
// (`--upstream everything-http=http://127.0.0.1:PORT/mcp`).
//
// Every feature goes through tether both ways: initialize (the upstream's
// serverInfo and instructions come back), tools/list and tools/call echo,
// resources (list, templates, read), prompts (list, get), completion (a prompt
// argument, with and without context, and a resource template variable),
// logging/setLevel + notifications/message, progress notifications of a long
// call (onprogress), the upstream's own requests answered by this client
// (sampling/createMessage, elicitation/create, roots/list), cancelling a long
// call with an AbortSignal (the call rejects, the server is still usable), and
// DELETE at the end.
//
// Tool names are those of server-everything 2026.8.31 (see its dist/tools/).
//
// usage: node gw_everything.mjs http://127.0.0.1:PORT/mcp/everything   (or .../mcp/everything-http)
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import {
    CreateMessageRequestSchema,
    ElicitRequestSchema,
    ListRootsRequestSchema,
    LoggingMessageNotificationSchema
} from '@modelcontextprotocol/sdk/types.js';
import { check, checkDeepEqual, fail, recordingFetch, renderLog, stepper } from './lib.mjs';

const url = process.argv[2];
if (!url) {
    console.error('usage: node gw_everything.mjs http://127.0.0.1:PORT/mcp/everything');
    process.exit(2);
}

const T = { timeout: 30000 };
const ROOT = { uri: 'file:///tmp/tether-interop-root', name: 'interop-root' };
const SAMPLED_TEXT = 'a sampled answer from the interop client';
const { log, fetch: recFetch } = recordingFetch();
const errors = [];
let closing = false;

const step = stepper(log);

function text(result, label) {
    const t = (result?.content ?? []).filter(c => c.type === 'text').map(c => c.text).join('\n');
    check(t.length > 0, `${label}: no text content`, result);
    return t;
}

const client = new Client(
    { name: 'tether-interop-gw', version: '0.0.0' },
    { capabilities: { sampling: {}, elicitation: { form: {} }, roots: { listChanged: true } } }
);
client.onerror = err => {
    if (!closing) errors.push(err);
};

const samplingRequests = [];
client.setRequestHandler(CreateMessageRequestSchema, async req => {
    samplingRequests.push(req.params);
    return { model: 'interop-model', role: 'assistant', stopReason: 'endTurn', content: { type: 'text', text: SAMPLED_TEXT } };
});
const elicitRequests = [];
client.setRequestHandler(ElicitRequestSchema, async req => {
    elicitRequests.push(req.params);
    return { action: 'accept', content: { name: 'Ada Lovelace', check: true, integer: 7 } };
});
let rootsRequests = 0;
client.setRequestHandler(ListRootsRequestSchema, async () => {
    rootsRequests += 1;
    return { roots: [ROOT] };
});
const logMessages = [];
let onLog = () => {};
client.setNotificationHandler(LoggingMessageNotificationSchema, n => {
    logMessages.push(n.params);
    onLog();
});

// ---------------------------------------------------------------- initialize
const transport = new StreamableHTTPClientTransport(new URL(url), { fetch: recFetch });
await step('connect (initialize through the gateway)', () => client.connect(transport));
check(transport.sessionId, 'no Mcp-Session-Id after initialize', renderLog(log));
const info = client.getServerVersion();
check(info?.name === 'mcp-servers/everything', `serverInfo is not the upstream's: ${JSON.stringify(info)}`);
const caps = client.getServerCapabilities();
for (const c of ['tools', 'resources', 'prompts', 'logging', 'completions']) {
    check(caps?.[c], `upstream capability "${c}" missing from the initialize result`, caps);
}
check((client.getInstructions() ?? '').length > 0, 'the upstream instructions were not passed on');
console.log(`initialize: session ${transport.sessionId}, server ${info.name} ${info.version}, protocol ${transport.protocolVersion}`);

// ---------------------------------------------------------------- tools
const tools = await step('tools/list', () => client.listTools(undefined, T));
const names = tools.tools.map(t => t.name);
for (const n of [
    'echo',
    'get-sum',
    'trigger-long-running-operation',
    'toggle-simulated-logging',
    // registered by the upstream only for a client that declared sampling,
    // elicitation and roots: proves our capabilities reached the child
    'trigger-sampling-request',
    'trigger-elicitation-request',
    'get-roots-list'
]) {
    check(names.includes(n), `tools/list lacks "${n}"`, names);
}
console.log(`tools/list: ${names.length} tools`);

const echo = await step('tools/call echo', () =>
    client.callTool({ name: 'echo', arguments: { message: 'hello through the gateway' } }, undefined, T)
);
check(echo.isError !== true, 'echo returned isError', echo);
checkDeepEqual(text(echo, 'echo'), 'Echo: hello through the gateway', 'echo answered something else');

const sum = await step('tools/call get-sum', () => client.callTool({ name: 'get-sum', arguments: { a: 19, b: 23 } }, undefined, T));
check(text(sum, 'get-sum').includes('42'), 'get-sum 19 + 23 does not say 42', sum);

// ---------------------------------------------------------------- resources
const resources = await step('resources/list', () => client.listResources(undefined, T));
check(
    resources.resources.some(r => r.uri.startsWith('demo://resource/static/document/')),
    'resources/list lacks the static documents',
    resources
);
const templates = await step('resources/templates/list', () => client.listResourceTemplates(undefined, T));
const TEXT_TEMPLATE = 'demo://resource/dynamic/text/{resourceId}';
check(templates.resourceTemplates.some(t => t.uriTemplate === TEXT_TEMPLATE), `no template ${TEXT_TEMPLATE}`, templates);
const read = await step('resources/read', () => client.readResource({ uri: 'demo://resource/dynamic/text/7' }, T));
check(read.contents.length === 1, 'resources/read: expected one content', read);
check(read.contents[0].uri === 'demo://resource/dynamic/text/7', 'resources/read: wrong uri', read);
check(read.contents[0].text?.startsWith('Resource 7: This is a plaintext resource'), 'resources/read: unexpected text', read);
const doc = resources.resources.find(r => r.uri.startsWith('demo://resource/static/document/'));
const docRead = await step(`resources/read ${doc.uri}`, () => client.readResource({ uri: doc.uri }, T));
check(docRead.contents[0]?.text?.length > 0, 'static document read empty', docRead);

// ---------------------------------------------------------------- prompts
const prompts = await step('prompts/list', () => client.listPrompts(undefined, T));
const promptNames = prompts.prompts.map(p => p.name);
for (const n of ['simple-prompt', 'args-prompt', 'completable-prompt']) {
    check(promptNames.includes(n), `prompts/list lacks "${n}"`, promptNames);
}
const prompt = await step('prompts/get args-prompt', () =>
    client.getPrompt({ name: 'args-prompt', arguments: { city: 'Paris', state: 'Texas' } }, T)
);
checkDeepEqual(prompt.messages, [{ role: 'user', content: { type: 'text', text: "What's weather in Paris, Texas?" } }], 'prompts/get args-prompt');

// ---------------------------------------------------------------- completion
const dept = await step('completion/complete prompt argument', () =>
    client.complete({ ref: { type: 'ref/prompt', name: 'completable-prompt' }, argument: { name: 'department', value: 'Eng' } }, T)
);
checkDeepEqual(dept.completion.values, ['Engineering'], 'completion of department "Eng"');
const member = await step('completion/complete with context', () =>
    client.complete(
        {
            ref: { type: 'ref/prompt', name: 'completable-prompt' },
            argument: { name: 'name', value: '' },
            context: { arguments: { department: 'Sales' } }
        },
        T
    )
);
checkDeepEqual(member.completion.values, ['David', 'Eve', 'Frank'], 'completion of name for department Sales');
const rid = await step('completion/complete resource template', () =>
    client.complete({ ref: { type: 'ref/resource', uri: TEXT_TEMPLATE }, argument: { name: 'resourceId', value: '42' } }, T)
);
checkDeepEqual(rid.completion.values, ['42'], 'completion of resourceId "42"');

// ---------------------------------------------------------------- logging
await step('logging/setLevel debug', () => client.setLoggingLevel('debug', T));
// The simulated messages ("Debug-level message - SessionId …", "Alert
// level-message …"), not the server's own "Roots updated: …" (logger
// everything-server), which it sends once roots/list is answered, about 350 ms
// after initialize: before or after the toggle, depending on how fast the calls
// above went.
const isSimulated = m => typeof m?.data === 'string' && m.logger === undefined && /level[- ]message/i.test(m.data);
const gotLog = new Promise(resolve => {
    onLog = () => {
        if (logMessages.some(isSimulated)) resolve();
    };
    onLog();
});
const toggle = await step('tools/call toggle-simulated-logging (on)', () =>
    client.callTool({ name: 'toggle-simulated-logging', arguments: {} }, undefined, T)
);
check(text(toggle, 'toggle').startsWith('Started simulated'), 'toggle-simulated-logging did not start', toggle);
await step('notifications/message arrives', () =>
    Promise.race([gotLog, new Promise((_, rej) => setTimeout(() => rej(new Error(`no simulated log message within 10 s; got ${JSON.stringify(logMessages)}`)), 10000))])
);
const LEVELS = ['debug', 'info', 'notice', 'warning', 'error', 'critical', 'alert', 'emergency'];
const lm = logMessages.find(isSimulated);
check(LEVELS.includes(lm.level) && typeof lm.data === 'string' && /message/i.test(lm.data), 'odd log message', lm);
console.log(`log message: [${lm.level}] ${lm.data}`);
const toggleOff = await step('tools/call toggle-simulated-logging (off)', () =>
    client.callTool({ name: 'toggle-simulated-logging', arguments: {} }, undefined, T)
);
check(text(toggleOff, 'toggle').startsWith('Stopped simulated'), 'toggle-simulated-logging did not stop', toggleOff);

// ---------------------------------------------------------------- progress
const progress = [];
const long = await step('tools/call trigger-long-running-operation with onprogress', () =>
    client.callTool({ name: 'trigger-long-running-operation', arguments: { duration: 2, steps: 4 } }, undefined, {
        ...T,
        onprogress: p => progress.push(p)
    })
);
checkDeepEqual(text(long, 'long-running'), 'Long running operation completed. Duration: 2 seconds, Steps: 4.', 'long-running result');
// Every progress notification must come, in order, before the result: the
// last one is sent by the upstream right before its result, and the gateway
// delivers what an upstream sent before its answer first (on the call's own
// stream, where the SDK still knows the token).
const seen = progress.map(p => [p.progress, p.total]);
const want = [
    [1, 4],
    [2, 4],
    [3, 4],
    [4, 4]
];
checkDeepEqual(seen, want, 'progress notifications of the long-running call');
console.log(`progress: ${progress.map(p => `${p.progress}/${p.total}`).join(' ')}`);

// ---------------------------------------------------------------- sampling
const sampled = await step('tools/call trigger-sampling-request (client answers sampling/createMessage)', () =>
    client.callTool({ name: 'trigger-sampling-request', arguments: { prompt: 'interop', maxTokens: 20 } }, undefined, T)
);
check(samplingRequests.length === 1, `expected 1 sampling request, got ${samplingRequests.length}`, samplingRequests);
const sr = samplingRequests[0];
check(sr.maxTokens === 20 && sr.messages?.[0]?.content?.text === 'Resource trigger-sampling-request context: interop', 'odd sampling request', sr);
check(text(sampled, 'sampling').includes(SAMPLED_TEXT), "the tool result does not carry the client's sampling answer", sampled);
check(text(sampled, 'sampling').includes('interop-model'), 'the tool result does not name the model the client gave', sampled);

// ---------------------------------------------------------------- elicitation
const elicited = await step('tools/call trigger-elicitation-request (client answers elicitation/create)', () =>
    client.callTool({ name: 'trigger-elicitation-request', arguments: {} }, undefined, T)
);
check(elicitRequests.length === 1, `expected 1 elicitation request, got ${elicitRequests.length}`, elicitRequests);
check(elicitRequests[0].requestedSchema?.properties?.name, 'elicitation request has no requestedSchema.name', elicitRequests[0]);
const et = text(elicited, 'elicitation');
check(et.includes('User provided the requested information') && et.includes('- Name: Ada Lovelace'), "the tool result does not carry the client's elicitation answer", elicited);

// ---------------------------------------------------------------- roots
const roots = await step('tools/call get-roots-list (upstream asked roots/list)', () =>
    client.callTool({ name: 'get-roots-list', arguments: {} }, undefined, T)
);
check(text(roots, 'roots').includes(ROOT.uri), "get-roots-list does not list the client's root", roots);
check(rootsRequests >= 1, 'the client was never asked roots/list');

// ---------------------------------------------------------------- cancel
const controller = new AbortController();
const cancelProgress = [];
const started = Date.now();
let rejected;
try {
    await client.callTool({ name: 'trigger-long-running-operation', arguments: { duration: 6, steps: 6 } }, undefined, {
        ...T,
        signal: controller.signal,
        onprogress: p => {
            cancelProgress.push(p);
            if (cancelProgress.length === 1) controller.abort('interop cancels the long call');
        }
    });
} catch (e) {
    rejected = e;
}
const took = Date.now() - started;
check(rejected, 'the aborted call resolved instead of rejecting');
check(cancelProgress.length === 1, `expected the abort after the first progress, saw ${cancelProgress.length}`, cancelProgress);
check(took < 4000, `the aborted call took ${took} ms to reject (the whole call takes 6 s)`);
// The SDK sends notifications/cancelled without waiting for its answer.
let cancelPost;
for (let i = 0; i < 100 && cancelPost?.status === undefined; i++) {
    await new Promise(r => setTimeout(r, 50));
    cancelPost = log.find(e => e.method === 'POST' && e.body?.method === 'notifications/cancelled');
}
check(cancelPost && cancelPost.status === 202, 'no notifications/cancelled POST answered 202', renderLog(log));
console.log(`cancel: rejected after ${took} ms with "${rejected?.message ?? rejected}"; notifications/cancelled -> ${cancelPost.status}`);
const after = await step('tools/call echo after the cancel', () =>
    client.callTool({ name: 'echo', arguments: { message: 'still here' } }, undefined, T)
);
checkDeepEqual(text(after, 'echo after cancel'), 'Echo: still here', 'echo after the cancel');

// ---------------------------------------------------------------- end
// Two known reports are not failures:
// - the cancelled tool keeps running upstream (server-everything ignores the
//   abort signal) and its later progress has no request to go to: the SDK
//   reports it as a progress notification "for an unknown token" (so does a
//   late last progress, see above);
// - tether ends a cancelled request's stream with a stored -32800 response
//   (ARCHITECTURE.md: "live clients that cancelled ignore it"); the SDK,
//   having forgotten the id, reports "a response for an unknown message ID".
// Anything else is a failure.
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
const del = log.find(e => e.method === 'DELETE');
check(del && del.status >= 200 && del.status < 300, `DELETE answered ${del?.status}`, renderLog(log));
closing = true;
await client.close();
console.log('OK gw_everything.mjs');
process.exit(0);
