// /console/sign-in: the part of the sign-in that talks to the authorization
// server (see oauth.js for the whole flow). The console page recorded what
// to sign in to (store.signIn: endpoint, issuer, resource, scope) and sent
// the tab here; this page
//   1. makes sure its own URL names exactly the origins it needs
//      (`?connect=ORIGIN`: its Content-Security-Policy allows those and no
//      others), reloading itself once with the right ones if not;
//   2. reads the authorization server's metadata, registers the console
//      there if it has no client yet, and sends the tab to the authorization
//      endpoint (PKCE S256, state, resource, scope);
//   3. on the way back (?code=&state=): checks the state (and `iss`),
//      exchanges the code for an access token, keeps it in this tab's
//      sessionStorage for the endpoint, and returns to the console, which
//      connects with it.
// It only ever talks to origins the endpoint's metadata names, and shows
// nothing but its own sentences.

import * as oauth from './oauth.js';
import * as store from './store.js';

const $ = (id) => document.getElementById(id);
const MAX_HOPS = 4;

function step(text) {
  const li = document.createElement('li');
  li.textContent = text;
  $('steps').append(li);
}

function status(text, kind) {
  $('sign-in-status').textContent = text;
  $('sign-in-status').dataset.kind = kind;
}

function fail(message) {
  const box = $('sign-in-error');
  box.replaceChildren();
  const strong = document.createElement('strong');
  strong.textContent = 'Not signed in: ';
  box.append(strong, document.createTextNode(message));
  box.hidden = false;
  status('not signed in', 'error');
}

function backTo(endpoint) {
  const u = new URL('/console/', location.origin);
  if (endpoint) u.searchParams.set('endpoint', endpoint);
  return u.href;
}

/**
 * Makes sure this page's URL names exactly `origins` (so its policy allows
 * them and nothing else): true when it does; else reloads the page with
 * them (keeping the other parameters) and returns false.
 */
function allowing(origins, pending) {
  const here = new URL(location.href);
  const named = here.searchParams.getAll('connect');
  if (named.length === origins.length && origins.every((o) => named.includes(o))) return true;
  pending.hops = (pending.hops || 0) + 1;
  if (pending.hops > MAX_HOPS) throw new Error(`this page could not be given a policy that allows ${origins.join(', ')}`);
  store.signIn.set(pending);
  location.replace(oauth.signInUrl(origins, here.searchParams));
  return false;
}

async function register(metadata, pending) {
  const redirectUri = oauth.redirectUri();
  const known = store.oauthClient.get(metadata.issuer);
  if (known && typeof known.clientId === 'string' && known.redirectUri === redirectUri) {
    step(`Using the console's client ${known.clientId} at ${metadata.issuer} (registered ${new Date(known.registeredAt).toLocaleString()}).`);
    return known.clientId;
  }
  if (!metadata.registration_endpoint) {
    throw new Error(`${metadata.issuer} offers no dynamic client registration (no registration_endpoint in its metadata), and the console has no client there`);
  }
  step(`Registering the console at ${metadata.registration_endpoint} (RFC 7591, a public client).`);
  const response = await fetch(metadata.registration_endpoint, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', Accept: 'application/json' },
    body: JSON.stringify({
      client_name: `tether console (${location.host})`,
      redirect_uris: [redirectUri],
      grant_types: ['authorization_code'],
      response_types: ['code'],
      token_endpoint_auth_method: 'none',
      application_type: 'web',
    }),
    credentials: 'omit',
    cache: 'no-store',
  });
  let body = null;
  try {
    body = await response.json();
  } catch {
    body = null;
  }
  if (!response.ok || typeof body?.client_id !== 'string') {
    throw new Error(`the registration was refused (HTTP ${response.status}${body?.error ? `: ${body.error}${body.error_description ? ` (${body.error_description})` : ''}` : ''})`);
  }
  if (body.token_endpoint_auth_method && body.token_endpoint_auth_method !== 'none') {
    throw new Error(`the authorization server registered the console as a confidential client (${body.token_endpoint_auth_method}); a page cannot keep a secret`);
  }
  store.oauthClient.set(metadata.issuer, { clientId: body.client_id, redirectUri, registeredAt: Date.now() });
  step(`Registered as client ${body.client_id}.`);
  return body.client_id;
}

/** Step 1 and 2: metadata, client, then off to the authorization endpoint. */
async function start(pending) {
  if (!allowing(oauth.originsOf(pending.issuer, pending.metadata), pending)) return;
  $('sign-in-what').textContent = `Signing in to ${pending.endpoint} (${pending.resource}) at ${pending.issuer}.`;
  if (!pending.metadata) {
    step(`Reading the metadata of ${pending.issuer}.`);
    pending.metadata = await oauth.authServerMetadata(pending.issuer);
    store.signIn.set(pending);
    if (!allowing(oauth.originsOf(pending.issuer, pending.metadata), pending)) return;
  }
  const metadata = pending.metadata;
  const clientId = await register(metadata, pending);
  const verifier = oauth.randomString(32);
  const challenge = await oauth.s256(verifier);
  const state = oauth.randomString(24);
  const redirectUri = oauth.redirectUri();
  store.signIn.set({ ...pending, phase: 'authorize', state, verifier, clientId, redirectUri, redirectedAt: Date.now(), hops: 0 });
  const to = new URL(metadata.authorization_endpoint);
  to.searchParams.set('response_type', 'code');
  to.searchParams.set('client_id', clientId);
  to.searchParams.set('redirect_uri', redirectUri);
  to.searchParams.set('code_challenge', challenge);
  to.searchParams.set('code_challenge_method', 'S256');
  to.searchParams.set('state', state);
  to.searchParams.set('resource', pending.resource);
  if (pending.scope) to.searchParams.set('scope', pending.scope);
  step(`Going to ${to.origin}${to.pathname} to sign in.`);
  status('going to the sign-in page', 'busy');
  location.assign(to.href);
}

/** Step 3: back from the authorization server. */
async function finish(params, pending) {
  const answered = { state: params.get('state'), iss: params.get('iss') };
  if (!pending || (pending.phase !== 'authorize' && pending.phase !== 'exchanging')) {
    throw new Error('this tab started no sign-in that is waiting for this answer (or it was already used); nothing was done with it');
  }
  if (answered.state !== pending.state) {
    store.signIn.clear();
    throw new Error('the answer does not carry the state this tab sent; it was not used');
  }
  if (answered.iss !== null ? answered.iss !== pending.metadata.issuer : pending.metadata.iss_parameter) {
    store.signIn.clear();
    throw new Error(`the answer comes from issuer ${answered.iss ?? '(not named)'}, not ${pending.metadata.issuer}; it was not used`);
  }
  $('sign-in-what').textContent = `Signing in to ${pending.endpoint} (${pending.resource}) at ${pending.issuer}.`;
  if (params.has('error')) {
    const error = params.get('error');
    if (error === 'invalid_client' || error === 'unauthorized_client') store.oauthClient.clear(pending.metadata.issuer);
    store.signIn.clear();
    throw new Error(`the authorization server answered ${error}${params.get('error_description') ? `: ${params.get('error_description')}` : ''}`);
  }
  if (pending.phase === 'exchanging') {
    store.signIn.clear();
    throw new Error('the page was reloaded while the code was being exchanged; a code is good once, so sign in again');
  }
  if (!allowing(oauth.originsOf(pending.issuer, pending.metadata), pending)) return;
  store.signIn.set({ ...pending, phase: 'exchanging' });
  step(`Exchanging the code at ${pending.metadata.token_endpoint}.`);
  const body = new URLSearchParams({
    grant_type: 'authorization_code',
    code: params.get('code') || '',
    redirect_uri: pending.redirectUri,
    client_id: pending.clientId,
    code_verifier: pending.verifier,
    resource: pending.resource,
  });
  let response;
  let answer = null;
  try {
    response = await fetch(pending.metadata.token_endpoint, {
      method: 'POST',
      headers: { 'Content-Type': 'application/x-www-form-urlencoded', Accept: 'application/json' },
      body,
      credentials: 'omit',
      cache: 'no-store',
    });
    answer = await response.json().catch(() => null);
  } catch (e) {
    store.signIn.clear();
    throw new Error(`could not reach the token endpoint (${e.message})`);
  }
  store.signIn.clear();
  if (!response.ok || typeof answer?.access_token !== 'string') {
    if (answer?.error === 'invalid_client') store.oauthClient.clear(pending.metadata.issuer);
    throw new Error(`the token endpoint answered HTTP ${response.status}${answer?.error ? `: ${answer.error}${answer.error_description ? ` (${answer.error_description})` : ''}` : ''}`);
  }
  if (typeof answer.token_type !== 'string' || answer.token_type.toLowerCase() !== 'bearer') {
    throw new Error(`the token endpoint gave a ${answer.token_type} token, not a Bearer token`);
  }
  const lifetime = Number(answer.expires_in);
  store.oauthToken.set(pending.endpoint, {
    accessToken: answer.access_token,
    expiresAt: Number.isFinite(lifetime) && lifetime > 0 ? Date.now() + lifetime * 1000 : null,
    issuer: pending.metadata.issuer,
    resource: pending.resource,
    scope: typeof answer.scope === 'string' ? answer.scope : pending.scope,
    subject: oauth.subjectOf(answer.access_token),
    clientId: pending.clientId,
  });
  store.signedIn.set({ endpoint: pending.endpoint });
  step('Signed in; back to the console.');
  status('signed in', 'ok');
  location.replace(backTo(pending.endpoint));
}

async function main() {
  const params = new URL(location.href).searchParams;
  const pending = store.signIn.get();
  $('back').href = backTo(pending?.endpoint);
  try {
    if (params.has('code') || params.has('error')) await finish(params, pending);
    else if (pending && pending.phase === 'start') await start(pending);
    else throw new Error('no sign-in is under way in this tab: go back to the console and connect');
  } catch (e) {
    fail(e.message || String(e));
  }
}

main();
