// Shared helpers for the TypeScript-SDK interop scripts (plain ESM, no build step).
import { readFileSync, writeFileSync } from 'node:fs';
import { isDeepStrictEqual, inspect } from 'node:util';

/** Print a clear failure message and exit non-zero. */
export function fail(msg, extra) {
    console.error(`FAIL: ${msg}`);
    if (extra !== undefined) {
        console.error(typeof extra === 'string' ? extra : inspect(extra, { depth: 10 }));
    }
    process.exit(1);
}

export function check(cond, msg, extra) {
    if (!cond) fail(msg, extra);
}

export function checkDeepEqual(actual, expected, msg) {
    if (!isDeepStrictEqual(actual, expected)) {
        fail(`${msg}\n  expected: ${JSON.stringify(expected)}\n  actual:   ${JSON.stringify(actual)}`);
    }
}

export function readJson(path) {
    return JSON.parse(readFileSync(path, 'utf8'));
}

export function writeJson(path, value) {
    writeFileSync(path, JSON.stringify(value, null, 2) + '\n');
}

/** Parse `node script.mjs URL STATE_FILE`. */
export function parseArgs(scriptName) {
    const [url, statePath] = process.argv.slice(2);
    if (!url || !statePath) {
        console.error(`usage: node ${scriptName} http://127.0.0.1:PORT/mcp STATE_FILE`);
        process.exit(2);
    }
    return { url: new URL(url), statePath };
}

/**
 * `step(name, fn)`: runs `fn`, prints `ok: NAME`, and on a throw fails with
 * the error and the HTTP log `log` (of `recordingFetch`).
 */
export function stepper(log) {
    return async function step(name, fn) {
        try {
            const v = await fn();
            console.log(`ok: ${name}`);
            return v;
        } catch (err) {
            fail(`${name} threw: ${err?.stack ?? err}`, `HTTP log:\n${renderLog(log)}`);
        }
    };
}

/**
 * A fetch wrapper that records every HTTP request the SDK transport makes
 * (method, lower-cased headers, JSON-RPC body) and the response status, so the
 * scripts can assert on what actually went over the wire.
 */
export function recordingFetch() {
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
        const entry = { method: init.method ?? 'GET', headers, body, status: undefined, contentType: undefined };
        log.push(entry);
        const res = await fetch(url, init);
        entry.status = res.status;
        entry.contentType = res.headers.get('content-type');
        return res;
    };
    return { log, fetch: recFetch };
}

/** Short one-line-per-request rendering of a recorded log, for failure messages. */
export function renderLog(log) {
    return log
        .map(e => {
            const rpc = e.body && typeof e.body === 'object' ? ` ${e.body.method ?? 'response'}#${e.body.id ?? '-'}` : '';
            const pv = e.headers['mcp-protocol-version'] ?? '(none)';
            const lei = e.headers['last-event-id'] ? ` last-event-id=${e.headers['last-event-id']}` : '';
            return `  ${e.method}${rpc} mcp-protocol-version=${pv}${lei} -> ${e.status} ${e.contentType ?? ''}`;
        })
        .join('\n');
}

/** The arguments of the single `thought` call both processes make. */
export const THOUGHT_ARGS = {
    thought: 'Interop check: is the resumed result byte-for-byte the original one?',
    thoughtNumber: 1,
    totalThoughts: 3,
    nextThoughtNeeded: true
};

/** Assert the shape of a `thought` CallToolResult. Returns structuredContent. */
export function checkThoughtResult(result, args, label) {
    check(result && typeof result === 'object', `${label}: no result`, result);
    check(result.isError !== true, `${label}: tool returned isError=true`, result);
    const sc = result.structuredContent;
    check(sc && typeof sc === 'object', `${label}: result has no structuredContent`, result);
    check(sc.thoughtNumber === args.thoughtNumber, `${label}: structuredContent.thoughtNumber is ${sc.thoughtNumber}, want ${args.thoughtNumber}`, sc);
    check(sc.totalThoughts === args.totalThoughts, `${label}: structuredContent.totalThoughts is ${sc.totalThoughts}, want ${args.totalThoughts}`, sc);
    check(sc.nextThoughtNeeded === args.nextThoughtNeeded, `${label}: structuredContent.nextThoughtNeeded is ${sc.nextThoughtNeeded}, want ${args.nextThoughtNeeded}`, sc);
    check(Array.isArray(sc.branches), `${label}: structuredContent.branches is not an array`, sc);
    check(Number.isInteger(sc.thoughtHistoryLength) && sc.thoughtHistoryLength >= 1, `${label}: structuredContent.thoughtHistoryLength is not an integer >= 1`, sc);
    const text = (result.content ?? []).find(c => c.type === 'text');
    check(text, `${label}: result has no text content`, result);
    let parsed;
    try {
        parsed = JSON.parse(text.text);
    } catch (e) {
        fail(`${label}: text content is not JSON: ${e}`, text.text);
    }
    checkDeepEqual(parsed, sc, `${label}: text content JSON differs from structuredContent`);
    return sc;
}

export const SUPPORTED_VERSIONS = ['2025-11-25', '2025-06-18', '2025-03-26'];
