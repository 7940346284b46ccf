// What the page keeps, and where:
// - localStorage (shared by the tabs of this origin, survives closing the
//   browser): the MCP session of each endpoint, the roots typed, the
//   endpoints used. Never the token.
// - sessionStorage (this tab only, survives a reload): the token, the
//   endpoint of this tab, and this tab's calls: each open request stream's
//   request id and last event ID, what was shown of it (progress, logs, open
//   server requests) and the results of finished calls. Keeping calls per tab
//   is what stops two tabs from taking over each other's streams.

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
