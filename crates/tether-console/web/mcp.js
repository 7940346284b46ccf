// MCP over Streamable HTTP, written for this page (no SDK): initialize,
// requests answered as JSON or as an SSE stream, the client's answers to
// server requests, and re-attaching to a request's stream with GET +
// Last-Event-ID, retried with backoff while the server is down.

import { readSse } from './sse.js';
import { parseChallenge } from './oauth.js';

export const PROTOCOL_VERSION = '2025-11-25';
const CLIENT_INFO = { name: 'tether-console', title: 'tether web console', version: '0.1.0' };
const FIRST_RETRY_MS = 250;
const MAX_RETRY_MS = 4000;

/** A JSON-RPC error answer. */
export class RpcError extends Error {
  constructor(error) {
    super(typeof error?.message === 'string' ? error.message : 'error');
    this.code = error?.code;
    this.data = error?.data;
  }
}

/** The server does not know the session (404): it expired, was deleted, or the store was reset. */
export class SessionGone extends Error {}

/**
 * 401: the server wants a bearer token (or another one); or 403 with an
 * `insufficient_scope` challenge: it wants a token with more scopes.
 * `challenge` is the parsed Bearer challenge (see oauth.js), or null; an
 * OAuth server names its `resourceMetadata` there.
 */
export class AuthNeeded extends Error {
  constructor(message, challenge = null) {
    super(message);
    this.challenge = challenge;
  }
}

/** Any other refusal, with the server's own sentence when it gave one. */
export class HttpError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

export function newRequestId() {
  const bytes = new Uint8Array(9);
  crypto.getRandomValues(bytes);
  return 'c' + Array.from(bytes, (b) => b.toString(16).padStart(2, '0')).join('');
}

const sleep = (ms, signal) =>
  new Promise((resolve) => {
    const t = setTimeout(resolve, ms);
    signal?.addEventListener('abort', () => { clearTimeout(t); resolve(); }, { once: true });
  });

function isResponseTo(msg, id) {
  return msg && typeof msg === 'object' && !('method' in msg) && msg.id === id && ('result' in msg || 'error' in msg);
}

async function refusal(response) {
  let message = `HTTP ${response.status}`;
  try {
    const text = await response.text();
    const body = JSON.parse(text);
    if (body?.error?.message) message = `${message}: ${body.error.message}`;
  } catch {
    // not JSON: the status says enough
  }
  const challenge = parseChallenge(response.headers.get('WWW-Authenticate'));
  if (response.status === 401) return new AuthNeeded(message, challenge);
  if (response.status === 403 && challenge?.error === 'insufficient_scope' && challenge.resourceMetadata) return new AuthNeeded(message, challenge);
  if (response.status === 404) return new SessionGone(message);
  return new HttpError(response.status, message);
}

export class Client {
  /**
   * @param {object} o
   * @param {string} o.endpoint   `/mcp` or `/mcp/NAME` (same origin)
   * @param {string} o.token      bearer token, or ''
   * @param {object|null} o.session  {id, protocolVersion, ...} of a stored session
   * @param {(text: string, kind: string) => void} o.onStatus
   */
  constructor({ endpoint, token, session, onStatus }) {
    this.endpoint = endpoint;
    this.token = token || '';
    this.session = session;
    this.onStatus = onStatus || (() => {});
    this.closed = new AbortController();
    this.reconnecting = 0;
  }

  close() {
    this.closed.abort();
  }

  headers(accept) {
    const h = { Accept: accept };
    if (this.session) {
      h['Mcp-Session-Id'] = this.session.id;
      h['MCP-Protocol-Version'] = this.session.protocolVersion || PROTOCOL_VERSION;
    }
    if (this.token) h.Authorization = 'Bearer ' + this.token;
    return h;
  }

  post(message) {
    return fetch(this.endpoint, {
      method: 'POST',
      headers: { ...this.headers('application/json, text/event-stream'), 'Content-Type': 'application/json' },
      body: JSON.stringify(message),
      cache: 'no-store',
      signal: this.closed.signal,
    });
  }

  /** Starts a new session: initialize, then notifications/initialized. */
  async initialize(capabilities) {
    this.session = null;
    const id = newRequestId();
    const response = await this.post({
      jsonrpc: '2.0', id, method: 'initialize',
      params: { protocolVersion: PROTOCOL_VERSION, capabilities, clientInfo: CLIENT_INFO },
    });
    if (!response.ok) throw await refusal(response);
    const sessionId = response.headers.get('Mcp-Session-Id');
    const msg = await this.answerOf(response, id, () => {});
    if (!msg) throw new HttpError(response.status, 'the initialize answer ended early; try again');
    if (msg.error) throw new RpcError(msg.error);
    if (!sessionId) throw new HttpError(response.status, 'the server started no session (no Mcp-Session-Id header)');
    const r = msg.result || {};
    this.session = {
      id: sessionId,
      protocolVersion: typeof r.protocolVersion === 'string' ? r.protocolVersion : PROTOCOL_VERSION,
      serverInfo: r.serverInfo || null,
      capabilities: r.capabilities || {},
      instructions: typeof r.instructions === 'string' ? r.instructions : '',
      startedAt: Date.now(),
    };
    await this.notify('notifications/initialized');
    return this.session;
  }

  async notify(method, params) {
    const message = { jsonrpc: '2.0', method };
    if (params !== undefined) message.params = params;
    const response = await this.post(message);
    if (!response.ok) throw await refusal(response);
  }

  /** Answers a server-to-client request. */
  async answer(id, result) {
    const response = await this.post({ jsonrpc: '2.0', id, result });
    if (!response.ok) throw await refusal(response);
  }

  async answerError(id, code, message) {
    const response = await this.post({ jsonrpc: '2.0', id, error: { code, message } });
    if (!response.ok) throw await refusal(response);
  }

  /** A request whose answer is all that matters (lists, reads); result or RpcError. */
  async request(method, params, onEvent) {
    const msg = await this.call({ id: newRequestId(), method, params, lastEventId: null, onEvent: onEvent || (() => {}) });
    if (msg.error) throw new RpcError(msg.error);
    return msg.result;
  }

  /**
   * One request to its answer, durably: POSTs it (unless `lastEventId` is
   * given: then it only re-attaches), reads its stream, and whenever the
   * stream drops before the answer, re-attaches with GET + Last-Event-ID,
   * retrying with backoff while the server is unreachable.
   *
   * `onEvent(msg, eventId)` is called synchronously for every event, the
   * answer included (msg is null for a priming event); the caller stores the
   * event ID with what it did with the message, in the same step, so a reload
   * never skips or repeats one.
   *
   * Resolves with the answer message; rejects with SessionGone, AuthNeeded,
   * HttpError (e.g. 400: the stream is no longer kept) or when closed.
   */
  async call({ id, method, params, lastEventId, onEvent }) {
    let last = lastEventId;
    let answer = null;
    const handle = (ev) => {
      if (ev.id) last = ev.id;
      let msg = null;
      if (ev.data) {
        try {
          msg = JSON.parse(ev.data);
        } catch {
          msg = null; // not JSON: nothing to act on, but its ID still counts
        }
      }
      if (msg === null && !ev.id) return false;
      onEvent(msg, ev.id || null);
      if (isResponseTo(msg, id)) {
        answer = msg;
        return true;
      }
      return false;
    };

    let response = null;
    if (last === null || last === undefined) {
      const message = { jsonrpc: '2.0', id, method };
      if (params !== undefined) message.params = params;
      response = await this.post(message); // a network error here: we cannot know whether it arrived
      if (!response.ok) throw await refusal(response);
      const type = response.headers.get('Content-Type') || '';
      if (!type.startsWith('text/event-stream')) {
        const msg = await response.json();
        handle({ id: null, data: JSON.stringify(msg) });
        if (answer) return answer;
        throw new HttpError(response.status, 'the answer was not the one asked for');
      }
    }

    let delay = FIRST_RETRY_MS;
    for (;;) {
      if (this.closed.signal.aborted) throw new Error('closed');
      if (!response) {
        if (!last) throw new HttpError(0, 'the stream dropped before its first event; it cannot be re-attached');
        try {
          response = await fetch(this.endpoint, {
            method: 'GET',
            headers: { ...this.headers('text/event-stream'), 'Last-Event-ID': last },
            cache: 'no-store',
            signal: this.closed.signal,
          });
        } catch (e) {
          if (this.closed.signal.aborted) throw e;
          response = null;
        }
        if (response && !response.ok) {
          const status = response.status;
          if (status === 404 || status === 401 || status === 400 || status === 403) throw await refusal(response);
          response = null; // 429, 503 (draining or store down), a proxy's 502: try again
        }
        if (!response) {
          this.waiting(+1, delay);
          await sleep(delay, this.closed.signal);
          this.waiting(-1);
          delay = Math.min(delay * 2, MAX_RETRY_MS);
          continue;
        }
      }
      const before = last;
      const outcome = await this.answerOf(response, id, handle, true);
      response = null;
      if (answer) return answer;
      if (last !== before) {
        // It delivered something before it ended: re-attach at once.
        delay = FIRST_RETRY_MS;
      } else {
        // Nothing new on it: do not spin; wait as the server asked, or back off.
        const wait = outcome && outcome.retry ? Math.min(outcome.retry, MAX_RETRY_MS) : delay;
        await sleep(wait, this.closed.signal);
        delay = Math.min(delay * 2, MAX_RETRY_MS);
      }
    }
  }

  waiting(change, delay) {
    this.reconnecting += change;
    if (change > 0) this.onStatus(`server unreachable; retrying in ${(delay / 1000).toFixed(1)} s`, 'reconnecting');
    else if (this.reconnecting === 0) this.onStatus('re-attaching', 'reconnecting');
  }

  /** Reads one response (JSON or SSE) until the answer to `id`. */
  async answerOf(response, id, handle, raw = false) {
    const type = response.headers.get('Content-Type') || '';
    if (type.startsWith('application/json')) {
      const msg = await response.json();
      if (raw) {
        handle({ id: null, data: JSON.stringify(msg) });
        return null;
      }
      return isResponseTo(msg, id) ? msg : null;
    }
    let found = null;
    const outcome = await readSse(response, (ev) => {
      if (raw) return handle(ev);
      if (!ev.data) return false;
      try {
        const msg = JSON.parse(ev.data);
        if (isResponseTo(msg, id)) {
          found = msg;
          return true;
        }
      } catch {
        // ignore
      }
      return false;
    });
    if (!outcome.dropped) this.onStatus('connected', 'ok');
    return raw ? outcome : found;
  }

  /**
   * Opens the session's standalone stream for a short while to answer what
   * the server asked outside any call (the notebook's first roots/list). The
   * console never keeps it open: tether has one standalone GET per session
   * and a newer one replaces the older, so a tab holding it would take the
   * stream from another tab, and a call whose POST is gone would have its
   * notifications sent there instead of kept on the call's own stream.
   */
  async briefly(ms, onMessage) {
    const stop = new AbortController();
    const timer = setTimeout(() => stop.abort(), ms);
    const onClose = () => stop.abort();
    this.closed.signal.addEventListener('abort', onClose, { once: true });
    try {
      const response = await fetch(this.endpoint, { method: 'GET', headers: this.headers('text/event-stream'), signal: stop.signal, cache: 'no-store' });
      if (!response.ok) throw await refusal(response);
      await readSse(response, (ev) => {
        if (!ev.data) return false;
        try {
          onMessage(JSON.parse(ev.data));
        } catch {
          // not JSON
        }
        return false;
      });
    } catch (e) {
      if (!stop.signal.aborted) throw e;
    } finally {
      clearTimeout(timer);
      this.closed.signal.removeEventListener('abort', onClose);
    }
  }
}
