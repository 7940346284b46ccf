// Signing in at the OAuth 2.1 authorization server that protects this
// server's endpoints, as the MCP authorization spec describes it for a
// public client: the 401's `WWW-Authenticate` names the endpoint's protected
// resource metadata (RFC 9728, served by tether on this origin), which names
// the authorization server; its metadata (RFC 8414, else OpenID discovery)
// gives the endpoints; the console registers itself there (RFC 7591) once
// per authorization server, then sends the tab to the authorization endpoint
// with PKCE (S256), a state and the endpoint as `resource` (RFC 8707). The
// way back lands on /console/sign-in, which checks the state, exchanges the
// code and keeps the access token in this tab's sessionStorage only.
//
// The console page (connect-src 'self') only reads tether's own metadata and
// starts the sign-in (startSignIn). Everything that talks to the
// authorization server runs on /console/sign-in (sign-in.js), whose policy
// adds exactly the origins named in its URL (`?connect=ORIGIN`): the ones
// the metadata names, nothing else.

import * as store from './store.js';

export const SIGN_IN_PATH = '/console/sign-in';
const MAX_CONNECT_ORIGINS = 4;
const FETCH_TIMEOUT_MS = 15000;

/** The redirect URI of this console: the sign-in page on this origin. */
export function redirectUri() {
  return location.origin + SIGN_IN_PATH;
}

/**
 * The Bearer challenge of a `WWW-Authenticate` value: {resourceMetadata,
 * scope, error, errorDescription}, or null when there is no Bearer
 * challenge. Several challenges may be listed; parameters are a token or a
 * quoted string (RFC 9110 section 11.6.1); a token68 is skipped.
 */
export function parseChallenge(header) {
  if (typeof header !== 'string') return null;
  const s = header;
  const TCHAR = /[!#$%&'*+\-.^_`|~0-9A-Za-z]/;
  let i = 0;
  let bearer = null;
  let current = null;
  const spaces = () => { while (s[i] === ' ' || s[i] === '\t') i++; };
  const word = () => {
    const start = i;
    while (i < s.length && TCHAR.test(s[i])) i++;
    return s.slice(start, i);
  };
  while (i < s.length) {
    spaces();
    if (s[i] === ',') { i++; continue; }
    const name = word();
    if (!name) { i++; continue; }
    spaces();
    if (s[i] === '=') {
      let j = i;
      while (s[j] === '=') j++;
      let k = j;
      while (s[k] === ' ' || s[k] === '\t') k++;
      if (j - i > 1 || k >= s.length || s[k] === ',') { i = j; continue; } // a token68
      i = k;
      let value = '';
      if (s[i] === '"') {
        i++;
        while (i < s.length && s[i] !== '"') {
          if (s[i] === '\\' && i + 1 < s.length) i++;
          value += s[i++];
        }
        i++;
      } else {
        const v = i;
        while (i < s.length && s[i] !== ',' && s[i] !== ' ' && s[i] !== '\t') i++;
        value = s.slice(v, i);
      }
      if (current) current[name.toLowerCase()] = value;
      continue;
    }
    current = {}; // a new challenge's scheme
    if (name.toLowerCase() === 'bearer' && !bearer) bearer = current;
  }
  if (!bearer) return null;
  return {
    resourceMetadata: bearer.resource_metadata || '',
    scope: bearer.scope || '',
    error: bearer.error || '',
    errorDescription: bearer.error_description || '',
  };
}

/** `url`'s origin as the sign-in page's policy takes it, or '' if it is not a plain http(s) origin. */
export function cspOrigin(url) {
  let u;
  try {
    u = new URL(url);
  } catch {
    return '';
  }
  if (u.protocol !== 'https:' && u.protocol !== 'http:') return '';
  const origin = u.origin;
  return /^https?:\/\/(([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*|\[[0-9a-f:.]+\])(:[1-9][0-9]{0,4})?$/.test(origin) ? origin : '';
}

async function fetchJson(url, init = {}) {
  const stop = new AbortController();
  const timer = setTimeout(() => stop.abort(), FETCH_TIMEOUT_MS);
  try {
    const response = await fetch(url, { cache: 'no-store', credentials: 'omit', redirect: 'error', ...init, signal: stop.signal, headers: { Accept: 'application/json', ...(init.headers || {}) } });
    let body = null;
    try {
      body = await response.json();
    } catch {
      body = null;
    }
    return { response, body };
  } catch (e) {
    if (stop.signal.aborted) throw new Error(`${url} did not answer within ${FETCH_TIMEOUT_MS / 1000} s`);
    throw new Error(`could not reach ${url} (${e.message})`);
  } finally {
    clearTimeout(timer);
  }
}

/**
 * The resource identifier a metadata URL was made from (RFC 9728 section 3:
 * the well-known segment is inserted between the host and the path).
 */
export function resourceOfMetadataUrl(metadataUrl) {
  const u = new URL(metadataUrl);
  const prefix = '/.well-known/oauth-protected-resource';
  if (!u.pathname.startsWith(prefix)) return null;
  return u.origin + (u.pathname.slice(prefix.length) || '/');
}

/**
 * The protected resource metadata the challenge names, read from this
 * origin (tether serves it itself; its own URL may name the public URL of
 * a proxy in front): {resource, issuer, scopesSupported}.
 */
export async function resourceMetadata(challenge) {
  let named;
  try {
    named = new URL(challenge.resourceMetadata, location.href);
  } catch {
    throw new Error(`the server's challenge names no usable resource metadata (${challenge.resourceMetadata})`);
  }
  const { response, body } = await fetchJson(named.pathname + named.search);
  if (!response.ok || !body || typeof body !== 'object') throw new Error(`${named.pathname}: HTTP ${response.status}`);
  const expected = resourceOfMetadataUrl(named.href);
  if (typeof body.resource !== 'string' || (expected && body.resource.replace(/\/$/, '') !== expected.replace(/\/$/, ''))) {
    throw new Error(`the resource metadata names resource ${body.resource}, not ${expected}: not used`);
  }
  const servers = Array.isArray(body.authorization_servers) ? body.authorization_servers.filter((s) => typeof s === 'string' && cspOrigin(s)) : [];
  if (servers.length === 0) throw new Error('the resource metadata names no http(s) authorization server');
  const scopes = Array.isArray(body.scopes_supported) ? body.scopes_supported.filter((s) => typeof s === 'string') : [];
  return { resource: body.resource, issuer: servers[0], scopesSupported: scopes };
}

/** Where an issuer's metadata may be, in the order the MCP spec gives. */
export function authServerMetadataUrls(issuer) {
  const u = new URL(issuer);
  const path = u.pathname.replace(/\/$/, '');
  if (!path) return [`${u.origin}/.well-known/oauth-authorization-server`, `${u.origin}/.well-known/openid-configuration`];
  return [
    `${u.origin}/.well-known/oauth-authorization-server${path}`,
    `${u.origin}/.well-known/openid-configuration${path}`,
    `${u.origin}${path}/.well-known/openid-configuration`,
  ];
}

const sameIssuer = (a, b) => typeof a === 'string' && typeof b === 'string' && a.replace(/\/$/, '') === b.replace(/\/$/, '');

/** The authorization server's metadata, checked: its issuer, its endpoints, PKCE with S256. */
export async function authServerMetadata(issuer) {
  const tried = [];
  for (const url of authServerMetadataUrls(issuer)) {
    const { response, body } = await fetchJson(url);
    tried.push(`${url}: HTTP ${response.status}`);
    if (!response.ok || !body || typeof body !== 'object') continue;
    if (!sameIssuer(body.issuer, issuer)) throw new Error(`${url} names issuer ${body.issuer}, not ${issuer}`);
    for (const key of ['authorization_endpoint', 'token_endpoint']) {
      if (!cspOrigin(body[key])) throw new Error(`the authorization server's ${key} is missing or not an http(s) URL`);
    }
    if (body.registration_endpoint !== undefined && !cspOrigin(body.registration_endpoint)) throw new Error('the registration_endpoint is not an http(s) URL');
    const methods = body.code_challenge_methods_supported;
    if (!Array.isArray(methods) || !methods.includes('S256')) {
      throw new Error('the authorization server does not advertise PKCE with S256 (code_challenge_methods_supported), so the console does not sign in there');
    }
    if (Array.isArray(body.response_types_supported) && !body.response_types_supported.includes('code')) {
      throw new Error('the authorization server does not offer the authorization code flow');
    }
    return {
      issuer: body.issuer,
      authorization_endpoint: body.authorization_endpoint,
      token_endpoint: body.token_endpoint,
      registration_endpoint: body.registration_endpoint || null,
      iss_parameter: body.authorization_response_iss_parameter_supported === true,
    };
  }
  throw new Error(`no authorization server metadata for ${issuer} (${tried.join('; ')})`);
}

/** The origins the sign-in page talks to for this authorization server, issuer first. */
export function originsOf(issuer, metadata) {
  const list = [cspOrigin(issuer)];
  if (metadata) for (const url of [metadata.token_endpoint, metadata.registration_endpoint]) if (url) list.push(cspOrigin(url));
  const unique = [...new Set(list)];
  if (unique.some((o) => !o)) throw new Error('an authorization server URL is not a plain http(s) origin');
  if (unique.length > MAX_CONNECT_ORIGINS) throw new Error('the authorization server spreads over too many origins');
  return unique;
}

/** The sign-in page's URL allowing `origins`, with `params` (code, state, ...) kept. */
export function signInUrl(origins, params = new URLSearchParams()) {
  const u = new URL(SIGN_IN_PATH, location.origin);
  for (const o of origins) u.searchParams.append('connect', o);
  for (const [k, v] of params) if (k !== 'connect') u.searchParams.append(k, v);
  return u.href;
}

export function randomString(bytes = 32) {
  const b = new Uint8Array(bytes);
  crypto.getRandomValues(b);
  return base64url(b);
}

function base64url(bytes) {
  let s = '';
  for (const b of bytes) s += String.fromCharCode(b);
  return btoa(s).replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
}

/** The PKCE S256 challenge of a verifier. */
export async function s256(verifier) {
  if (!crypto.subtle) throw new Error('signing in needs a secure context (https, or http on localhost / 127.0.0.1): the browser offers no SHA-256 here');
  const digest = await crypto.subtle.digest('SHA-256', new TextEncoder().encode(verifier));
  return base64url(new Uint8Array(digest));
}

/** The `sub` of a JWT access token, for display only (the server checks the token, not the page). */
export function subjectOf(token) {
  try {
    const part = String(token).split('.')[1];
    if (!part) return '';
    const json = atob(part.replace(/-/g, '+').replace(/_/g, '/').padEnd(Math.ceil(part.length / 4) * 4, '='));
    const claims = JSON.parse(decodeURIComponent(Array.from(json, (c) => '%' + c.charCodeAt(0).toString(16).padStart(2, '0')).join('')));
    return typeof claims.sub === 'string' ? claims.sub : '';
  } catch {
    return '';
  }
}

const unionScopes = (...lists) => [...new Set(lists.join(' ').split(/\s+/).filter(Boolean))].join(' ');

/**
 * From the console page: reads the endpoint's resource metadata, records the
 * sign-in in this tab and sends the tab to the sign-in page. `challenge` is
 * the 401's (or, for a step-up, the 403's); `granted` the scope of the token
 * the endpoint has now, if any (a step-up asks for both).
 */
export async function startSignIn({ endpoint, challenge, granted = '' }) {
  const meta = await resourceMetadata(challenge);
  const wanted = challenge.error === 'insufficient_scope' ? unionScopes(granted, challenge.scope) : challenge.scope || meta.scopesSupported.join(' ');
  store.signIn.set({
    phase: 'start',
    endpoint,
    issuer: meta.issuer,
    resource: meta.resource,
    scope: wanted,
    startedAt: Date.now(),
  });
  location.assign(signInUrl(originsOf(meta.issuer, null)));
}
