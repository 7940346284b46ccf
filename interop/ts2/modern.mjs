// Interop check: the official MCP TypeScript SDK v2 client (@modelcontextprotocol/client 2.x)
// against tether over the sessionless revision 2026-07-28.
//
// usage: node modern.mjs URL [TETHER_BIN]
//
//  1. Against URL: a Client with versionNegotiation { mode: 'auto' } probes
//     server/discover, selects the modern era, lists the tools and calls the
//     notebook's `thought`; structuredContent and its text twin are checked, and
//     the result names its notebook session in _meta. Then two clients that
//     declare roots: tether asks roots/list through an input_required round
//     (MRTR), the SDK answers it with its roots/list handler and repeats the
//     call; both go on in the one root's notebook session.
//  2. With TETHER_BIN: a second tether of that binary on a free port and a fresh
//     SQLite file with --resume-wait 0s (every call of a resumable tool is a task),
//     a Client pinned to 2026-07-28 that declares the Tasks extension
//     (io.modelcontextprotocol/tasks) calls `session` {operation:"list"}. The SDK
//     (2.4.0) has no client-side Tasks support: its result decoder refuses
//     resultType "task" (SdkError UNSUPPORTED_RESULT_TYPE) after the response came.
//     The script takes the CreateTaskResult from the HTTP log (the wrapped fetch
//     reads the response the SDK received) and follows the task to completion with
//     the SDK's own request API (client.request({method:'tasks/get'}, schema): the
//     SDK lets the Tasks extension reuse that name on the modern era and sets
//     Mcp-Name from params.taskId), honouring pollIntervalMs. If a later SDK
//     answers the task itself, callTool's result is checked instead.
//
// From the HTTP log (a fetch wrapper) of each client: no initialize was sent, no
// Mcp-Session-Id went out, no GET or DELETE, every POST carried
// MCP-Protocol-Version 2026-07-28 and Mcp-Method, and the first was server/discover.
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { inspect } from 'node:util';

import { Client, SdkError, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';

const MODERN = '2026-07-28';
const TASKS_EXTENSION = 'io.modelcontextprotocol/tasks';
const NOTEBOOK_SESSION_META = 'dev.tether/notebookSession';
const SERVER_INFO_META = 'io.modelcontextprotocol/serverInfo';
const THOUGHT_ARGS = { thought: 'x', thoughtNumber: 1, totalThoughts: 2, nextThoughtNeeded: true };
const TERMINAL = new Set(['completed', 'failed', 'cancelled']);

let tether; // the second tether (part 2), stopped on every exit
let tetherDir;
function stopTether() {
    if (tether && tether.exitCode === null) tether.kill('SIGKILL');
    if (tetherDir) rmSync(tetherDir, { recursive: true, force: true });
}

function fail(msg, extra) {
    console.error(`FAIL: ${msg}`);
    if (extra !== undefined) console.error(typeof extra === 'string' ? extra : inspect(extra, { depth: 10 }));
    stopTether();
    process.exit(1);
}

function check(cond, msg, extra) {
    if (!cond) fail(msg, extra);
}

/** A fetch that records each request (method, headers, JSON-RPC body) and its response (status, body text). */
function recordingFetch() {
    const log = [];
    const recFetch = async (url, init = {}) => {
        const headers = {};
        new Headers(init.headers ?? {}).forEach((v, k) => {
            headers[k] = v;
        });
        let body;
        if (typeof init.body === 'string') {
            try {
                body = JSON.parse(init.body);
            } catch {
                body = init.body;
            }
        }
        const entry = { method: init.method ?? 'GET', headers, body, status: undefined, contentType: undefined, text: undefined };
        log.push(entry);
        const res = await fetch(url, init);
        entry.status = res.status;
        entry.contentType = res.headers.get('content-type');
        entry.responseSessionId = res.headers.get('mcp-session-id');
        // Each modern POST answers on a stream of its own that ends with the response.
        if (entry.method === 'POST') entry.text = res.clone().text();
        return res;
    };
    return { log, fetch: recFetch };
}

function renderLog(log) {
    return log
        .map(e => {
            const rpc = e.body && typeof e.body === 'object' ? ` ${e.body.method ?? 'response'}#${e.body.id ?? '-'}` : '';
            const h = e.headers;
            return `  ${e.method}${rpc} mcp-protocol-version=${h['mcp-protocol-version'] ?? '(none)'} mcp-method=${h['mcp-method'] ?? '(none)'} mcp-name=${h['mcp-name'] ?? '(none)'} -> ${e.status} ${e.contentType ?? ''}`;
        })
        .join('\n');
}

/** The JSON-RPC messages of a response body (one JSON document or an SSE stream). */
function messages(text) {
    try {
        return [JSON.parse(text)];
    } catch {
        return text
            .split('\n')
            .filter(l => l.startsWith('data:'))
            .map(l => JSON.parse(l.slice(5)));
    }
}

/** The sessionless wire: what every request of a modern client must (not) carry. */
function checkSessionless(log, label) {
    check(log.length > 0, `${label}: no HTTP request was recorded`);
    for (const e of log) {
        const rpc = e.body && typeof e.body === 'object' ? e.body.method : undefined;
        check(e.method === 'POST', `${label}: a ${e.method} was sent (2026-07-28 has no GET stream and no DELETE)`, renderLog(log));
        check(rpc !== 'initialize', `${label}: initialize was sent`, renderLog(log));
        check(e.headers['mcp-session-id'] === undefined, `${label}: an Mcp-Session-Id was sent`, renderLog(log));
        check(!e.responseSessionId, `${label}: tether answered with an Mcp-Session-Id`, renderLog(log));
        check(e.headers['mcp-protocol-version'] === MODERN, `${label}: a POST without MCP-Protocol-Version ${MODERN}`, renderLog(log));
        if (rpc) check(e.headers['mcp-method'] === rpc, `${label}: Mcp-Method ${e.headers['mcp-method']} for ${rpc}`, renderLog(log));
    }
    const first = log[0].body?.method;
    check(first === 'server/discover', `${label}: the first request was ${first}, want server/discover`, renderLog(log));
}

function checkThought(result) {
    check(result && result.isError !== true, 'tools/call thought failed', result);
    const sc = result.structuredContent;
    check(sc && typeof sc === 'object', 'thought: no structuredContent', result);
    for (const k of ['thoughtNumber', 'totalThoughts', 'nextThoughtNeeded']) {
        check(sc[k] === THOUGHT_ARGS[k], `thought: structuredContent.${k} is ${sc[k]}, want ${THOUGHT_ARGS[k]}`, sc);
    }
    check(Array.isArray(sc.branches), 'thought: structuredContent.branches is not an array', sc);
    check(Number.isInteger(sc.thoughtHistoryLength) && sc.thoughtHistoryLength >= 1, 'thought: thoughtHistoryLength is not an integer >= 1', sc);
    const text = (result.content ?? []).find(c => c.type === 'text');
    check(text, 'thought: no text content', result);
    check(JSON.stringify(JSON.parse(text.text)) === JSON.stringify(sc), 'thought: the text content differs from structuredContent', result);
    const session = result._meta?.[NOTEBOOK_SESSION_META];
    check(typeof session === 'string' && session.length > 0, `thought: _meta has no ${NOTEBOOK_SESSION_META}`, result);
    return session;
}

/** A StandardSchema that accepts any object: the SDK validates a custom request's result with it. */
const anyObject = {
    '~standard': {
        version: 1,
        vendor: 'tether-interop',
        validate: value =>
            value && typeof value === 'object' && !Array.isArray(value) ? { value } : { issues: [{ message: 'not an object' }] }
    }
};

// ---------------------------------------------------------------- part 1
async function discoverListCall(url) {
    const { log, fetch } = recordingFetch();
    const client = new Client({ name: 'tether-interop-ts2', version: '1.0.0' }, { versionNegotiation: { mode: 'auto' } });
    await client.connect(new StreamableHTTPClientTransport(url, { fetch }));
    check(client.getProtocolEra() === 'modern', `auto: era ${client.getProtocolEra()}, want modern`, renderLog(log));
    check(client.getNegotiatedProtocolVersion() === MODERN, `auto: version ${client.getNegotiatedProtocolVersion()}`);
    const discovered = client.getDiscoverResult();
    check(discovered?.supportedVersions?.includes(MODERN), 'server/discover does not list 2026-07-28', discovered);
    check(discovered.capabilities?.extensions?.[TASKS_EXTENSION] !== undefined, 'server/discover does not advertise the Tasks extension', discovered);
    const { tools } = await client.listTools();
    check(tools.some(t => t.name === 'thought') && tools.some(t => t.name === 'session'), 'tools/list lacks thought or session', tools);
    const session = checkThought(await client.callTool({ name: 'thought', arguments: THOUGHT_ARGS }));
    await client.close();
    checkSessionless(log, 'auto');
    const serverInfo = discovered._meta?.[SERVER_INFO_META];
    console.log(
        `auto: server/discover -> ${MODERN} (server ${serverInfo?.name ?? '?'}), ${tools.length} tools, thought ok (notebook session ${session}); ` +
            `${log.length} POSTs, no initialize, no Mcp-Session-Id`
    );
}

/** A client that declared roots: tether asks them through an input_required round, the SDK answers with its handler. */
async function rootsThroughMrtr(url, n) {
    const { log, fetch } = recordingFetch();
    const client = new Client({ name: 'tether-interop-ts2', version: '1.0.0' }, { capabilities: { roots: {} }, versionNegotiation: { mode: 'auto' } });
    let asked = 0;
    client.setRequestHandler('roots/list', async () => {
        asked++;
        return { roots: [{ uri: 'file:///work/ts2-project', name: 'project' }] };
    });
    await client.connect(new StreamableHTTPClientTransport(url, { fetch }));
    const result = await client.callTool({ name: 'thought', arguments: { ...THOUGHT_ARGS, thoughtNumber: n } });
    await client.close();
    checkSessionless(log, 'roots');
    check(asked === 1, `roots/list handler called ${asked} times, want 1`, renderLog(log));
    const calls = log.filter(e => e.body?.method === 'tools/call');
    check(calls.length === 2, 'want an input_required round and the repeated call', renderLog(log));
    const repeated = calls[1].body.params;
    check(repeated.inputResponses && typeof repeated.requestState === 'string', 'the repeated call lacks inputResponses or requestState', repeated);
    check(result.structuredContent?.thoughtHistoryLength === n, `thought ${n} in the root's session: thoughtHistoryLength ${result.structuredContent?.thoughtHistoryLength}`, result);
    return result._meta?.[NOTEBOOK_SESSION_META];
}

// ---------------------------------------------------------------- part 2
function startTether(bin) {
    tetherDir = mkdtempSync(join(tmpdir(), 'tether-ts2-'));
    tether = spawn(bin, ['serve', '--listen', '127.0.0.1:0', '--store', `sqlite:${join(tetherDir, 't.db')}`, '--resume-wait', '0s'], {
        stdio: ['ignore', 'ignore', 'pipe'],
        env: Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('TETHER_')))
    });
    const lines = [];
    return new Promise((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error(`tether printed no address within 30 s:\n${lines.join('\n')}`)), 30_000);
        tether.on('exit', code => reject(new Error(`tether exited (${code}):\n${lines.join('\n')}`)));
        createInterface({ input: tether.stderr }).on('line', line => {
            lines.push(line);
            const m = line.match(/http:\/\/\S+/);
            if (m) {
                clearTimeout(timer);
                resolve(new URL(m[0])); // tether prints its /mcp URL
            }
        });
    });
}

async function taskToCompletion(bin) {
    const url = await startTether(bin);
    const { log, fetch } = recordingFetch();
    const client = new Client(
        { name: 'tether-interop-ts2', version: '1.0.0' },
        { capabilities: { extensions: { [TASKS_EXTENSION]: {} } }, versionNegotiation: { mode: { pin: MODERN } } }
    );
    await client.connect(new StreamableHTTPClientTransport(url, { fetch }));
    check(client.getProtocolEra() === 'modern', `pinned: era ${client.getProtocolEra()}`, renderLog(log));

    let sdkResult;
    let sdkError;
    try {
        sdkResult = await client.callTool({ name: 'session', arguments: { operation: 'list' } });
    } catch (e) {
        sdkError = e;
    }
    const call = log.find(e => e.body?.method === 'tools/call');
    check(call, 'no tools/call was sent', renderLog(log));
    check(call.headers['mcp-name'] === 'session', `tools/call Mcp-Name ${call.headers['mcp-name']}`, renderLog(log));
    const caps = call.body.params?._meta?.['io.modelcontextprotocol/clientCapabilities'];
    check(caps?.extensions?.[TASKS_EXTENSION] !== undefined, 'the SDK did not declare the Tasks extension in _meta', call.body);
    const answer = messages(await call.text).find(m => m.id === call.body.id);
    const created = answer?.result;
    check(created?.resultType === 'task', 'tools/call session (with --resume-wait 0s) was not answered with a task', answer);
    for (const k of ['taskId', 'status', 'createdAt', 'lastUpdatedAt']) check(created[k] !== undefined, `CreateTaskResult lacks ${k}`, created);
    check('ttlMs' in created, 'CreateTaskResult lacks ttlMs', created);
    let how;
    let task;
    if (sdkError === undefined) {
        // A later SDK that follows tasks itself: its result is the task's.
        how = 'the SDK followed the task itself';
        task = { taskId: created.taskId, status: 'completed', result: sdkResult };
    } else {
        check(
            sdkError instanceof SdkError && sdkError.code === 'UNSUPPORTED_RESULT_TYPE' && sdkError.data?.resultType === 'task',
            'callTool(session) failed other than by refusing resultType task',
            sdkError
        );
        how = `the SDK's callTool refused it (SdkError ${sdkError.code}: ${sdkError.message})`;
    }
    console.log(`task: tools/call session -> resultType task ${created.taskId} (${created.status}, pollIntervalMs ${created.pollIntervalMs}); ${how}`);

    let polls = 0;
    const deadline = Date.now() + 30_000;
    while (!task || !TERMINAL.has(task.status)) {
        if (task) await new Promise(r => setTimeout(r, Math.min(task.pollIntervalMs ?? created.pollIntervalMs ?? 200, 1000)));
        check(Date.now() < deadline, 'the task did not end within 30 s', task);
        task = await client.request({ method: 'tasks/get', params: { taskId: created.taskId } }, anyObject);
        polls++;
        check(task.taskId === created.taskId, 'tasks/get answered another task', task);
    }
    check(task.status === 'completed', `the task ended ${task.status}`, task);
    const result = task.result;
    check(result && result.isError !== true && Array.isArray(result.content), 'the completed task has no successful CallToolResult', task);
    check(result.structuredContent && typeof result.structuredContent === 'object', 'the task result has no structuredContent', task);
    const gets = log.filter(e => e.body?.method === 'tasks/get');
    check(gets.length === polls, 'a tasks/get did not go over HTTP', renderLog(log));
    for (const g of gets) check(g.headers['mcp-name'] === created.taskId, `tasks/get Mcp-Name ${g.headers['mcp-name']}`, renderLog(log));
    await client.close();
    checkSessionless(log, 'tasks');
    console.log(
        `task: ${polls} tasks/get (SDK client.request, Mcp-Name = taskId) -> completed, structuredContent keys ${Object.keys(result.structuredContent).join(',')}; ` +
            `${log.length} POSTs, no initialize, no Mcp-Session-Id`
    );
}

// ---------------------------------------------------------------- main
const [urlArg, bin] = process.argv.slice(2);
if (!urlArg) {
    console.error('usage: node modern.mjs http://127.0.0.1:PORT/mcp [path/to/tether]');
    process.exit(2);
}
try {
    await discoverListCall(new URL(urlArg));
    const first = await rootsThroughMrtr(new URL(urlArg), 1);
    const second = await rootsThroughMrtr(new URL(urlArg), 2);
    check(first && first === second, `two clients with one root: notebook sessions ${first} and ${second}`);
    console.log(`roots: roots/list asked through input_required, answered by the SDK's handler; two clients, one root, one notebook session (${first})`);
    if (bin) await taskToCompletion(bin);
    else console.log('task: skipped (no tether binary given)');
} catch (e) {
    fail('unexpected error', e);
}
stopTether();
console.log('PASS ts2-modern');
process.exit(0);
