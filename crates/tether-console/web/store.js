// What the page keeps, and where:
// - localStorage (shared by the tabs of this origin, survives closing the
//   browser): the MCP session of each endpoint, the roots typed, the
//   endpoints used, and the OAuth client the console registered at each
//   authorization server (a public client: its id is no secret, and keeping
//   it spares the server a new registration, and the person a new consent,
//   for every tab). Never a token.
// - sessionStorage (this tab only, survives a reload): the token typed, the
//   OAuth access token of each endpoint signed in to, a sign-in under way
//   (its state and PKCE verifier), the endpoint of this tab, and this tab's
//   calls: each open request stream's request id and last event ID, what was
//   shown of it (progress, logs, open server requests) and the results of
//   finished calls. Keeping calls per tab is what stops two tabs from taking
//   over each other's streams.

const PREFIX = 'tether-console:';
const MAX_CALLS = 30;
const MAX_RESULT_CHARS = 256 * 1024;

function read(storage, key, fallback) {
  try {
    const text = storage.getItem(PREFIX + key);
    if (text === null) return fallback;
    const value = JSON.parse(text);
    return value ?? fallback;
  } catch {
    return fallback;
  }
}

function write(storage, key, value) {
  try {
    if (value === undefined || value === null) storage.removeItem(PREFIX + key);
    else storage.setItem(PREFIX + key, JSON.stringify(value));
    return true;
  } catch {
    return false; // quota: the page goes on, it just remembers less
  }
}

export const session = {
  get: (endpoint) => read(localStorage, 'session:' + endpoint, null),
  set: (endpoint, value) => write(localStorage, 'session:' + endpoint, value),
  clear: (endpoint) => write(localStorage, 'session:' + endpoint, null),
};

export const token = {
  get: () => read(sessionStorage, 'token', ''),
  set: (value) => write(sessionStorage, 'token', value || null),
};

const expired = (t) => typeof t.expiresAt === 'number' && t.expiresAt <= Date.now();

/**
 * The access token of an endpoint, from a sign-in: {accessToken, expiresAt
 * (ms, or null), issuer, resource, scope, subject, clientId}. `get` gives
 * none once it has expired; `peek` gives it anyway, with `expired`.
 */
export const oauthToken = {
  get: (endpoint) => {
    const t = read(sessionStorage, 'oauth-token:' + endpoint, null);
    return t && typeof t.accessToken === 'string' && !expired(t) ? t : null;
  },
  peek: (endpoint) => {
    const t = read(sessionStorage, 'oauth-token:' + endpoint, null);
    return t && typeof t.accessToken === 'string' ? { ...t, expired: expired(t) } : null;
  },
  set: (endpoint, value) => write(sessionStorage, 'oauth-token:' + endpoint, value),
  clear: (endpoint) => write(sessionStorage, 'oauth-token:' + endpoint, null),
};

/** A sign-in under way in this tab (one at a time). */
export const signIn = {
  get: () => read(sessionStorage, 'sign-in', null),
  set: (value) => write(sessionStorage, 'sign-in', value),
  clear: () => write(sessionStorage, 'sign-in', null),
};

/** Set by the sign-in page when it is done: the console connects to this endpoint once. */
export const signedIn = {
  take: () => {
    const value = read(sessionStorage, 'signed-in', null);
    write(sessionStorage, 'signed-in', null);
    return value;
  },
  set: (value) => write(sessionStorage, 'signed-in', value),
};

/** The client registered at an authorization server: {clientId, redirectUri, registeredAt}. */
export const oauthClient = {
  get: (issuer) => read(localStorage, 'oauth-client:' + issuer, null),
  set: (issuer, value) => write(localStorage, 'oauth-client:' + issuer, value),
  clear: (issuer) => write(localStorage, 'oauth-client:' + issuer, null),
};

export const tabEndpoint = {
  get: () => read(sessionStorage, 'endpoint', null),
  set: (value) => write(sessionStorage, 'endpoint', value),
};

export const roots = {
  get: () => read(localStorage, 'roots', ''),
  set: (value) => write(localStorage, 'roots', value),
};

export const endpoints = {
  get: () => read(localStorage, 'endpoints', ['/mcp']),
  add: (endpoint) => {
    const list = read(localStorage, 'endpoints', ['/mcp']).filter((e) => e !== endpoint);
    list.unshift(endpoint);
    write(localStorage, 'endpoints', list.slice(0, 12));
  },
};

/** This tab's calls on one endpoint, oldest first. */
export const calls = {
  all: (endpoint) => {
    const list = read(sessionStorage, 'calls:' + endpoint, []);
    return Array.isArray(list) ? list : [];
  },
  save: (endpoint, list) => {
    const kept = list.slice(-MAX_CALLS).map(trim);
    if (!write(sessionStorage, 'calls:' + endpoint, kept)) {
      // Over quota: keep the calls still running and drop finished results.
      write(sessionStorage, 'calls:' + endpoint, kept.filter((c) => c.state === 'running'));
    }
  },
};

function trim(call) {
  if (call.result !== undefined) {
    const text = JSON.stringify(call.result);
    if (text.length > MAX_RESULT_CHARS) {
      return { ...call, result: { content: [{ type: 'text', text: `(a result of ${text.length} characters, not kept across reloads)` }] } };
    }
  }
  return call;
}
