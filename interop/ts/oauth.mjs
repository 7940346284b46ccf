// The TypeScript SDK client authorizing itself against tether as an OAuth 2.1
// resource server (run by interop/run.sh against a tether started with
// --oauth-issuer ISSUER, ISSUER being interop/oauth/provider.mjs).
//
// The SDK is given no token and no authorization server: only tether's URL and
// an OAuthClientProvider. Its first POST must get 401, and it must then find
// everything itself: the protected resource metadata named by the challenge
// (RFC 9728), the authorization server metadata of the server listed there
// (RFC 8414 / OpenID discovery), and a token for the resource (RFC 8707
// `resource` = tether's endpoint URL); then initialize, tools/list and a
// tools/call of `thought` go through with that token.
//
//   client-credentials   the SDK's own ClientCredentialsProvider (client `svc`
//                        of the provider, client_secret_basic, grant
//                        client_credentials) as the transport's authProvider.
//   authorization-code   a public client: an OAuthClientProvider of this file
//                        (redirect URL on a small HTTP server of this script,
//                        token_endpoint_auth_method none) that the SDK's auth()
//                        registers by dynamic client registration (RFC 7591)
//                        and sends to the authorization endpoint with PKCE;
//                        the user's part (oidc-provider's login and consent
//                        pages) is done in headless Chromium (playwright-core,
//                        installed in interop/oauth); the redirect brings the
//                        code to the callback server, transport.finishAuth(code)
//                        exchanges it, and a new connection makes the calls.
//
// Every HTTP request of the SDK (MCP and OAuth alike, through the transport's
// fetch) is recorded and the sequence is checked; so are the access token's
// claims (aud = the endpoint URL, iss = the issuer, sub).
//
// usage: node oauth.mjs client-credentials   http://127.0.0.1:PORT/mcp ISSUER
//        node oauth.mjs authorization-code   http://127.0.0.1:PORT/mcp ISSUER [CHROMIUM]
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import { createRequire } from 'node:module';
import os from 'node:os';
import path from 'node:path';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { UnauthorizedError } from '@modelcontextprotocol/sdk/client/auth.js';
import { ClientCredentialsProvider } from '@modelcontextprotocol/sdk/client/auth-extensions.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { THOUGHT_ARGS, check, checkThoughtResult, fail } from './lib.mjs';

const [mode, urlArg, issuerArg, chromiumArg] = process.argv.slice(2);
if (!['client-credentials', 'authorization-code'].includes(mode) || !urlArg || !issuerArg) {
    console.error('usage: node oauth.mjs client-credentials|authorization-code http://127.0.0.1:PORT/mcp ISSUER [CHROMIUM]');
    process.exit(2);
}
const URL_ = new URL(urlArg);
const ENDPOINT = URL_.href;
const ISSUER = issuerArg.replace(/\/$/, '');
const CHROMIUM = chromiumArg || '/usr/bin/chromium';
const SCOPE = 'tools:read tools:write';
const LOGIN = 'interop-user';

// ---------------------------------------------------------------- the wire
// One entry per HTTP request the SDK makes (through the transport's fetch,
// which the SDK also uses for discovery, registration and the token request).
const trace = [];
async function tracingFetch(input, init = {}) {
    const url = new URL(typeof input === 'string' || input instanceof URL ? input : input.url);
    const headers = new Headers(init.headers ?? {});
    const entry = {
        method: init.method ?? 'GET',
        url: url.href,
        bearer: /^Bearer /i.test(headers.get('authorization') ?? ''),
        basic: /^Basic /i.test(headers.get('authorization') ?? ''),
        status: undefined
    };
    if (init.body instanceof URLSearchParams) {
        // The token request: what was asked (no secrets are printed: the code
        // and verifier only as present/absent).
        const p = init.body;
        entry.form = Object.fromEntries([...p.keys()].map(k => [k, ['code', 'code_verifier', 'client_secret'].includes(k) ? '(present)' : p.get(k)]));
    } else if (typeof init.body === 'string') {
        try {
            entry.json = JSON.parse(init.body);
        } catch {
            // not JSON
        }
    }
    trace.push(entry);
    const res = await fetch(input, init);
    entry.status = res.status;
    entry.wwwAuthenticate = res.headers.get('www-authenticate') ?? undefined;
    if (url.pathname.includes('/.well-known/') && res.ok) {
        entry.document = await res.clone().json().catch(() => undefined);
    }
    return res;
}
const render = () =>
    trace
        .map(e => {
            const rpc = e.json?.method ? ` ${e.json.method}` : '';
            const auth = e.bearer ? ' [Bearer]' : e.basic ? ' [Basic]' : '';
            const form = e.form ? ` ${JSON.stringify(e.form)}` : '';
            return `  ${e.method} ${e.url}${rpc}${auth}${form} -> ${e.status}`;
        })
        .join('\n');

async function step(name, fn) {
    try {
        return await fn();
    } catch (err) {
        fail(`${name} threw: ${err?.stack ?? err}`, `HTTP requests of the SDK:\n${render()}`);
    }
}

const claimsOf = token => {
    try {
        return JSON.parse(Buffer.from(String(token).split('.')[1], 'base64url').toString());
    } catch {
        return fail('the access token the SDK got is not a JWT', token);
    }
};

/**
 * The discovery the SDK must have done on its own, in this order: a POST to
 * the endpoint without a token answered 401 with a challenge naming the
 * resource metadata; that document (resource = the endpoint, the issuer
 * listed); the issuer's metadata; returns the index after the metadata.
 */
function checkDiscovery() {
    const first = trace[0];
    check(first && first.method === 'POST' && first.url === ENDPOINT && !first.bearer, 'the SDK did not begin with a POST to the endpoint without a token', render());
    check(first.status === 401, `the first POST got ${first.status}, not 401`, render());
    const challenge = first.wwwAuthenticate ?? '';
    const named = /resource_metadata="([^"]+)"/.exec(challenge)?.[1];
    check(named, `the 401 has no resource_metadata in WWW-Authenticate: ${challenge}`);
    const prmAt = trace.findIndex(e => e.method === 'GET' && e.url === named);
    check(prmAt > 0, `the SDK never fetched the protected resource metadata the challenge names (${named})`, render());
    const prm = trace[prmAt];
    check(prm.status === 200 && prm.document, `GET ${named} -> ${prm.status}`, render());
    check(prm.document.resource === ENDPOINT, `the resource metadata names resource ${prm.document.resource}, not ${ENDPOINT}`, prm.document);
    check(
        (prm.document.authorization_servers ?? []).map(s => s.replace(/\/$/, '')).includes(ISSUER),
        `the resource metadata does not list ${ISSUER}`,
        prm.document
    );
    const asAt = trace.findIndex(
        (e, i) =>
            i > prmAt &&
            e.method === 'GET' &&
            e.status === 200 &&
            [`${ISSUER}/.well-known/oauth-authorization-server`, `${ISSUER}/.well-known/openid-configuration`].includes(e.url)
    );
    check(asAt > prmAt, `after the resource metadata, the SDK never fetched ${ISSUER}'s metadata`, render());
    check(trace[asAt].document?.issuer === ISSUER, `the authorization server metadata names issuer ${trace[asAt].document?.issuer}`, trace[asAt].document);
    console.log(`discovery: POST ${ENDPOINT} -> 401 (${challenge}); GET ${named} -> 200 (authorization_servers ${JSON.stringify(prm.document.authorization_servers)}); GET ${trace[asAt].url} -> 200`);
    return { after: asAt + 1, metadata: trace[asAt].document };
}

/** The token request: to the token endpoint, for the endpoint as resource, answered 200. */
function checkTokenRequest(from, metadata, grantType) {
    const at = trace.findIndex((e, i) => i >= from && e.method === 'POST' && e.url === metadata.token_endpoint);
    check(at >= from, `the SDK never POSTed to the token endpoint ${metadata.token_endpoint}`, render());
    const t = trace[at];
    check(t.status === 200, `the token request got ${t.status}`, render());
    check(t.form?.grant_type === grantType, `the token request's grant_type is ${t.form?.grant_type}, not ${grantType}`, t);
    check(t.form?.resource === ENDPOINT, `the token request's resource is ${t.form?.resource}, not ${ENDPOINT} (RFC 8707)`, t);
    console.log(`token: POST ${t.url} ${JSON.stringify(t.form)}${t.basic ? ' with client_secret_basic' : ''} -> 200`);
    return at;
}

function checkClaims(token, sub) {
    const c = claimsOf(token);
    const aud = [].concat(c.aud ?? []);
    check(aud.includes(ENDPOINT), `the access token's aud is ${JSON.stringify(c.aud)}, not ${ENDPOINT}`, c);
    check(c.iss === ISSUER, `the access token's iss is ${c.iss}, not ${ISSUER}`, c);
    check(c.sub === sub, `the access token's sub is ${c.sub}, not ${sub}`, c);
    console.log(`access token claims: iss=${c.iss} aud=${JSON.stringify(c.aud)} sub=${c.sub} client_id=${c.client_id} scope=${JSON.stringify(c.scope)}`);
    return c;
}

/** initialize (already done by connect) -> tools/list -> tools/call thought, with the token. */
async function listAndCall(client, from) {
    const tools = await step('tools/list', () => client.listTools());
    const names = tools.tools.map(t => t.name);
    check(names.includes('thought'), `tools/list does not contain "thought": ${JSON.stringify(names)}`);
    console.log(`tools/list: ${JSON.stringify(names)}`);
    const result = await step('tools/call thought', () => client.callTool({ name: 'thought', arguments: THOUGHT_ARGS }, undefined, { timeout: 30000 }));
    const sc = checkThoughtResult(result, THOUGHT_ARGS, 'tools/call thought');
    console.log(`tools/call thought: structuredContent=${JSON.stringify(sc)}`);
    // Every MCP request after the token went with it, and none was refused.
    const mcp = trace.slice(from).filter(e => e.url === ENDPOINT);
    check(mcp.length >= 3, 'fewer than three MCP requests after the token', render());
    for (const e of mcp) {
        check(e.bearer, `an MCP request after the token went without it: ${e.method} ${e.json?.method ?? ''}`, render());
        check(e.status < 400, `${e.method} ${e.json?.method ?? ''} with the token got ${e.status}`, render());
    }
    for (const want of ['initialize', 'tools/list', 'tools/call']) {
        check(mcp.some(e => e.json?.method === want && e.status === 200), `no ${want} answered 200 with the token`, render());
    }
}

// ---------------------------------------------------------------- client credentials
async function clientCredentials() {
    // The SDK's provider for machine-to-machine clients; expectedIssuer binds
    // the credentials to the issuer (they are sent nowhere else): where the
    // token endpoint is, the SDK finds out from tether.
    const provider = new ClientCredentialsProvider({
        clientId: 'svc',
        clientSecret: 'svc-secret',
        scope: SCOPE,
        clientName: 'tether-interop-ts',
        expectedIssuer: ISSUER
    });
    check(provider.tokens() === undefined, 'the provider has a token before the flow');
    const client = new Client({ name: 'tether-interop-ts-oauth-cc', version: '0.0.0' });
    const transport = new StreamableHTTPClientTransport(URL_, { authProvider: provider, fetch: tracingFetch });
    await step('connect/initialize', () => client.connect(transport));
    console.log(`initialized: session=${transport.sessionId} protocol=${transport.protocolVersion}`);

    const { after, metadata } = checkDiscovery();
    const tokenAt = checkTokenRequest(after, metadata, 'client_credentials');
    check(trace[tokenAt].basic, 'the token request did not authenticate the client with HTTP Basic (client_secret_basic)', trace[tokenAt]);
    check(trace[tokenAt].form?.scope === SCOPE, `the token request asked for scope ${trace[tokenAt].form?.scope}`, trace[tokenAt]);
    const tokens = provider.tokens();
    check(tokens?.access_token, 'the provider holds no access token after connect', tokens);
    checkClaims(tokens.access_token, 'svc');
    await listAndCall(client, tokenAt + 1);
    await client.close();
}

// ---------------------------------------------------------------- authorization code
/** An OAuthClientProvider for a public client whose redirect lands on `redirectUrl`. */
class PublicClientProvider {
    constructor(redirectUrl) {
        this._redirectUrl = redirectUrl;
        this.authorizationUrls = [];
    }
    get redirectUrl() {
        return this._redirectUrl;
    }
    get clientMetadata() {
        return {
            client_name: 'tether-interop-ts (public client)',
            redirect_uris: [this._redirectUrl],
            grant_types: ['authorization_code'],
            response_types: ['code'],
            token_endpoint_auth_method: 'none'
        };
    }
    state() {
        this.lastState = randomBytes(16).toString('base64url');
        return this.lastState;
    }
    clientInformation() {
        return this._clientInformation;
    }
    saveClientInformation(info) {
        this._clientInformation = info;
    }
    tokens() {
        return this._tokens;
    }
    saveTokens(tokens) {
        this._tokens = tokens;
    }
    redirectToAuthorization(url) {
        // The browser is driven below, once connect() has given up with UnauthorizedError.
        this.authorizationUrls.push(new URL(url));
    }
    saveCodeVerifier(verifier) {
        this._codeVerifier = verifier;
    }
    codeVerifier() {
        if (!this._codeVerifier) throw new Error('no code verifier saved');
        return this._codeVerifier;
    }
}

/** The redirect's target: GET /callback?code=...&state=...; resolves `redirect` with its query. */
async function startCallbackServer() {
    let deliver;
    const redirect = new Promise(resolve => (deliver = resolve));
    const server = http.createServer((req, res) => {
        const u = new URL(req.url, 'http://127.0.0.1');
        if (req.method !== 'GET' || u.pathname !== '/callback') {
            res.writeHead(404, { 'content-type': 'text/plain' }).end('not found');
            return;
        }
        const query = Object.fromEntries(u.searchParams);
        const ok = Boolean(query.code);
        res.writeHead(ok ? 200 : 400, { 'content-type': 'text/html; charset=utf-8' });
        res.end(`<!doctype html><title>tether interop</title><p id="result">${ok ? 'Authorized' : 'Authorization failed'}: you may close this window.</p>`);
        deliver(query);
    });
    await new Promise((resolve, reject) => {
        server.once('error', reject);
        server.listen(0, '127.0.0.1', resolve);
    });
    return { server, redirect, url: `http://127.0.0.1:${server.address().port}/callback` };
}

function deadline(promise, ms, what) {
    let timer;
    return Promise.race([
        promise,
        new Promise((_, reject) => {
            timer = setTimeout(() => reject(new Error(`${what}: nothing within ${ms / 1000} s`)), ms);
        })
    ]).finally(() => clearTimeout(timer));
}

async function authorizationCode() {
    check(fs.existsSync(CHROMIUM), `Chromium is not at ${CHROMIUM}`);
    const require = createRequire(new URL('../oauth/package.json', import.meta.url));
    const { chromium } = require('playwright-core');

    const callback = await startCallbackServer();
    const provider = new PublicClientProvider(callback.url);
    const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'tether-interop-chromium-'));
    let context;
    try {
        // 1. connect without a token: 401, discovery, registration, and the
        //    redirect to the authorization endpoint; connect gives up.
        const first = new Client({ name: 'tether-interop-ts-oauth-code', version: '0.0.0' });
        const transport = new StreamableHTTPClientTransport(URL_, { authProvider: provider, fetch: tracingFetch });
        let refused;
        try {
            await first.connect(transport);
        } catch (err) {
            refused = err;
        }
        check(refused instanceof UnauthorizedError, `connect without a token should end with UnauthorizedError (the redirect), got: ${refused?.stack ?? 'success'}`, render());
        const { after, metadata } = checkDiscovery();

        const regAt = trace.findIndex((e, i) => i >= after && e.method === 'POST' && e.url === metadata.registration_endpoint);
        check(regAt >= after, `the SDK did not register at ${metadata.registration_endpoint}`, render());
        const reg = trace[regAt];
        check(reg.status === 201, `dynamic client registration got ${reg.status}`, render());
        const registered = provider.clientInformation();
        check(registered?.client_id, 'no client information saved after the registration', registered);
        check(registered.client_secret === undefined, 'the public client was given a client_secret', registered);
        check(registered.token_endpoint_auth_method === 'none', `registered token_endpoint_auth_method ${registered.token_endpoint_auth_method}, not none`, registered);
        console.log(`registration: POST ${reg.url} ${JSON.stringify(reg.json)} -> 201, client_id=${registered.client_id}`);

        check(provider.authorizationUrls.length === 1, `the SDK redirected ${provider.authorizationUrls.length} times`);
        const authUrl = provider.authorizationUrls[0];
        const q = authUrl.searchParams;
        check(`${authUrl.origin}${authUrl.pathname}` === metadata.authorization_endpoint, `redirected to ${authUrl.origin}${authUrl.pathname}, not ${metadata.authorization_endpoint}`);
        const wantParams = {
            response_type: 'code',
            client_id: registered.client_id,
            code_challenge_method: 'S256',
            redirect_uri: callback.url,
            resource: ENDPOINT,
            scope: SCOPE,
            state: provider.lastState
        };
        for (const [k, v] of Object.entries(wantParams)) {
            check(q.get(k) === v, `the authorization request's ${k} is ${q.get(k)}, want ${v}`, authUrl.href);
        }
        check(q.get('code_challenge'), 'the authorization request has no code_challenge (PKCE)', authUrl.href);
        console.log(`authorization request: ${authUrl.href.replace(/code_challenge=[^&]+/, 'code_challenge=...')}`);

        // 2. the user's part, in headless Chromium: oidc-provider's login
        //    form, then its consent form; the redirect lands on the callback.
        context = await chromium.launchPersistentContext(profile, {
            executablePath: CHROMIUM,
            headless: true,
            args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync']
        });
        // Nothing leaves the machine (the dev pages import a web font).
        await context.route('**/*', route => (new URL(route.request().url()).hostname === '127.0.0.1' ? route.continue() : route.abort()));
        const page = context.pages()[0] || (await context.newPage());
        page.setDefaultTimeout(30_000);
        const onPage = async (what, fn) => {
            try {
                return await fn();
            } catch (err) {
                const body = await page.content().catch(() => '(no content)');
                fail(`${what}: ${err?.message ?? err}`, `page ${page.url()}:\n${body.slice(0, 3000)}`);
            }
        };
        await onPage('open the authorization URL', () => page.goto(authUrl.href, { waitUntil: 'domcontentloaded' }));
        await onPage('the login form', async () => {
            await page.locator('input[name="login"]').waitFor();
            await page.fill('input[name="login"]', LOGIN);
            await page.fill('input[name="password"]', 'any-password');
            await page.click('button[type="submit"]');
        });
        console.log(`browser: signed in as ${LOGIN} at ${new URL(page.url()).origin}`);
        await onPage('the consent form', async () => {
            await page.locator('input[name="prompt"][value="consent"]').waitFor({ state: 'attached' });
            await page.click('button[type="submit"]');
        });
        console.log('browser: consent given');
        const query = await step('the redirect to the callback', () => deadline(callback.redirect, 60_000, `GET ${callback.url}`));
        await onPage('the callback page', () => page.locator('#result').waitFor());
        check(!query.error, `the authorization server answered error=${query.error} (${query.error_description ?? ''})`, query);
        check(query.code, 'the redirect carries no code', query);
        check(query.state === provider.lastState, `the redirect's state ${query.state} is not the one sent`, query);
        if (query.iss !== undefined) check(query.iss === ISSUER, `the redirect's iss is ${query.iss}, not ${ISSUER}`, query);
        console.log(`redirect: ${callback.url}?code=...&state=(as sent)${query.iss ? `&iss=${query.iss}` : ''}`);
        await context.close();
        context = undefined;

        // 3. the code for a token, by the SDK.
        const beforeExchange = trace.length;
        await step('transport.finishAuth(code)', () => transport.finishAuth(query.code));
        const tokenAt = checkTokenRequest(beforeExchange, metadata, 'authorization_code');
        const t = trace[tokenAt];
        check(!t.basic && t.form.client_id === registered.client_id, 'the public client did not send its client_id without a secret', t);
        check(t.form.code_verifier === '(present)' && t.form.redirect_uri === callback.url, 'the code exchange lacks the PKCE verifier or redirect_uri', t);
        const tokens = provider.tokens();
        check(tokens?.access_token, 'no access token saved after finishAuth', tokens);
        const claims = checkClaims(tokens.access_token, LOGIN);
        check(claims.client_id === registered.client_id, `the access token's client_id is ${claims.client_id}, not ${registered.client_id}`, claims);

        // 4. a new connection with the same provider (now holding the token).
        const client = new Client({ name: 'tether-interop-ts-oauth-code', version: '0.0.0' });
        const second = new StreamableHTTPClientTransport(URL_, { authProvider: provider, fetch: tracingFetch });
        const beforeConnect = trace.length;
        await step('connect/initialize with the token', () => client.connect(second));
        console.log(`initialized: session=${second.sessionId} protocol=${second.protocolVersion}`);
        check(trace[beforeConnect].bearer && trace[beforeConnect].status === 200, 'the reconnect did not initialize with the token', render());
        await listAndCall(client, beforeConnect);
        await client.close();
    } finally {
        await context?.close().catch(() => {});
        callback.server.close();
        fs.rmSync(profile, { recursive: true, force: true });
    }
}

await (mode === 'client-credentials' ? clientCredentials() : authorizationCode());
console.log(`HTTP requests of the SDK:\n${render()}`);
console.log(`PASS: ${mode}`);
process.exit(0);
