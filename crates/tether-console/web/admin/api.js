// The admin API from the page. The token lives in this tab's
// sessionStorage and in memory, and goes only in the Authorization header
// of requests to this origin: never in a URL, never in a cookie
// (credentials: 'omit'), so a browser never sends it on its own. A 401
// anywhere signs the page out (onRefused).

import { readSse } from '/console/admin/sse.js';

const KEY = 'tether-admin-token';

export const auth = {
  token: sessionStorage.getItem(KEY) || '',
  /** Called once per refusal: the page shows the sign-in again. */
  onRefused: () => {},
};

export function setToken(token) {
  auth.token = token;
  if (token) sessionStorage.setItem(KEY, token);
  else sessionStorage.removeItem(KEY);
}

/** A refusal or failure of the admin API, with its status and the server's words. */
export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

function headers(extra = {}) {
  return { Authorization: `Bearer ${auth.token}`, ...extra };
}

async function errorOf(response) {
  let message = `HTTP ${response.status}`;
  try {
    const body = await response.json();
    if (body && typeof body.error === 'string') message = body.error;
  } catch {
    // not JSON: the status says it
  }
  return new ApiError(response.status, message);
}

/** `method path` with the token; the JSON answer, or an ApiError. */
export async function api(path, { method = 'GET', signal } = {}) {
  let response;
  try {
    response = await fetch(path, { method, headers: headers({ Accept: 'application/json' }), cache: 'no-store', credentials: 'omit', signal });
  } catch (e) {
    if (e.name === 'AbortError') throw e;
    throw new ApiError(0, `the server did not answer (${e.message})`);
  }
  if (response.status === 401) {
    const error = await errorOf(response);
    auth.onRefused(error);
    throw error;
  }
  if (!response.ok) throw await errorOf(response);
  return response.json();
}

/** The query string of the set values of `params` (URLSearchParams encodes them). */
export function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v !== undefined && v !== null && v !== '') q.set(k, String(v));
  }
  const s = q.toString();
  return s ? `?${s}` : '';
}

/**
 * Follows `/admin/calls/stream` until `signal` aborts: onEvent(name, data)
 * for each event, onState(state, detail) as the connection changes
 * (connecting, live, retrying). A dropped stream is opened again after a
 * pause that doubles up to 30 s; a 401 signs out and stops.
 */
export async function followCalls(onEvent, onState, signal) {
  let pause = 1000;
  while (!signal.aborted) {
    onState('connecting');
    let response = null;
    try {
      response = await fetch('/admin/calls/stream', { headers: headers({ Accept: 'text/event-stream' }), cache: 'no-store', credentials: 'omit', signal });
    } catch (e) {
      if (signal.aborted) return;
      onState('retrying', `the stream could not be opened (${e.message})`);
    }
    if (response && response.status === 401) {
      auth.onRefused(await errorOf(response));
      return;
    }
    if (response && !response.ok) {
      onState('retrying', (await errorOf(response)).message);
    } else if (response) {
      pause = 1000;
      onState('live');
      await readSse(response, (ev) => {
        let data = null;
        try {
          data = JSON.parse(ev.data);
        } catch {
          return signal.aborted;
        }
        onEvent(ev.event, data);
        return signal.aborted;
      });
      if (signal.aborted) return;
      onState('retrying', 'the stream ended');
    }
    await new Promise((resolve) => {
      const t = setTimeout(resolve, pause);
      signal.addEventListener('abort', () => { clearTimeout(t); resolve(); }, { once: true });
    });
    pause = Math.min(pause * 2, 30_000);
  }
}
