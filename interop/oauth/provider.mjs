// A real authorization server for tether's OAuth tests: oidc-provider (npm,
// OpenID certified) on 127.0.0.1, issuing JWT access tokens for a resource
// (RFC 8707 resource indicators) by client credentials.
//
// usage: node provider.mjs PORT KEYFILE
//   PORT     the port to listen on (the issuer is http://127.0.0.1:PORT)
//   KEYFILE  where the provider's RSA signing key is written (PKCS#8 PEM),
//            with its kid on the first line as `# kid: KID`, so a test can
//            sign tokens of its own with the issuer's key (expired, for the
//            wrong audience, ...)
//
// Clients (client_secret_post or basic):
//   svc / svc-secret      client credentials; scopes tools:read tools:write
//                         prompts:read files:read
//   reader / reader-secret client credentials; scope tools:read only
//   opaque / opaque-secret client credentials, every scope; its access
//                         tokens are opaque (checked by introspection)
//   tether / tether-secret tether's own client, for RFC 7662 introspection
//   tether-up / tether-up-secret
//                          tether's own client toward its upstreams: client
//                          credentials, and RFC 8693 token exchange (a grant
//                          registered below: the subject token must be an
//                          unexpired access token of this server; the new
//                          JWT names the subject's `sub`, the requested
//                          `resource` as `aud`, and tether-up in `act.sub`)
// Every other access token is a JWT (RS256) whose `aud` is the requested
// resource and whose `sub` is the client's id (by client credentials) or the
// user's login (by authorization code).
//
// RFC 7009 revocation at /token/revocation, of a client's own opaque tokens
// (a revoked token is inactive at introspection from then on), and, for the
// tests, the tokens issued so far per client at GET /test/tokens-issued.
//
// For the interop checks of MCP clients that authorize on their own
// (interop/ts/oauth.mjs), beside those clients:
//   - dynamic client registration (RFC 7591) at /reg, open (no initial access
//     token): an MCP client registers itself, e.g. as a public client
//     (token_endpoint_auth_method none) with a loopback redirect URI;
//   - the authorization code grant with PKCE at /auth, the user's steps on
//     oidc-provider's development pages (devInteractions): a login form (any
//     login, any password; the login becomes the token's `sub`) and a consent
//     form.
//
// For tether's web console (console/tests), a page that signs in from the
// browser: cross-origin requests (CORS) are answered
//   - at /reg, from any origin (registration is open to anyone anyway; no
//     credentials are involved), so the page can register itself;
//   - at the token endpoint, for a public client (token_endpoint_auth_method
//     none) from the origin of one of its redirect URIs (clientBasedCORS,
//     spelled out below: oidc-provider's default rule, unchanged);
//   - discovery and the JWKS are open to every origin (oidc-provider's own).
// Requests without an Origin header (every other client here) are not
// affected.
// For the tests, GET /test/introspected answers `{"count": N, "tokens": [...]}`:
// how many introspection requests it got, and the tokens they asked about
// (the first 10000).
// Prints `READY` once it listens.

import { generateKeyPairSync, randomBytes, sign, verify } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import Provider from 'oidc-provider';

const [port, keyFile] = process.argv.slice(2);
if (!port || !keyFile) {
  console.error('usage: node provider.mjs PORT KEYFILE');
  process.exit(2);
}
const issuer = `http://127.0.0.1:${port}`;
const kid = randomBytes(8).toString('hex');
const { privateKey, publicKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
const jwk = { ...privateKey.export({ format: 'jwk' }), kid, use: 'sig', alg: 'RS256' };
writeFileSync(keyFile, `# kid: ${kid}\n${privateKey.export({ format: 'pem', type: 'pkcs8' })}`, { mode: 0o600 });

const all = 'tools:read tools:write prompts:read files:read';
const scopes = { svc: all, reader: 'tools:read', opaque: all, tether: '', 'tether-up': all };
const TOKEN_EXCHANGE = 'urn:ietf:params:oauth:grant-type:token-exchange';
const ACCESS_TOKEN_TYPE = 'urn:ietf:params:oauth:token-type:access_token';
const provider = new Provider(issuer, {
  jwks: { keys: [jwk] },
  clients: Object.keys(scopes).map((id) => ({
    client_id: id,
    client_secret: `${id}-secret`,
    grant_types: id === 'tether-up' ? ['client_credentials', TOKEN_EXCHANGE] : ['client_credentials'],
    response_types: [],
    redirect_uris: [],
    scope: scopes[id] || undefined,
  })),
  scopes: all.split(' '),
  // CORS at the token endpoint (and introspection, revocation, userinfo)
  // for browser clients: oidc-provider's default rule, written out (the
  // default warns that it should be): a public client from the origin of one
  // of its redirect URIs; userinfo likewise for any client.
  clientBasedCORS(ctx, origin, client) {
    if (origin === 'null') return false;
    if (ctx.oidc.route === 'userinfo' || client.clientAuthMethod === 'none') {
      return client.redirectUris.some((uri) => URL.parse(uri)?.origin === origin);
    }
    return false;
  },
  features: {
    // The login and consent pages of the authorization code flow.
    devInteractions: { enabled: true },
    // RFC 7591: MCP clients register themselves.
    registration: { enabled: true },
    clientCredentials: { enabled: true },
    introspection: { enabled: true },
    // RFC 7009: a client revokes its own tokens.
    revocation: { enabled: true, allowedPolicy: async (_ctx, client, token) => token.clientId === client.clientId },
    resourceIndicators: {
      enabled: true,
      defaultResource: () => undefined,
      useGrantedResource: () => true,
      getResourceServerInfo: (_ctx, resource, client) => ({
        scope: all,
        audience: resource,
        accessTokenTTL: 300,
        accessTokenFormat: client.clientId === 'opaque' ? 'opaque' : 'jwt',
        jwt: { sign: { alg: 'RS256' } },
      }),
    },
  },
});
// RFC 8693 token exchange, for tether's upstream credentials.
const b64u = (text) => Buffer.from(text).toString('base64url');
const signJwt = (claims) => {
  const signing = `${b64u(JSON.stringify({ alg: 'RS256', typ: 'at+jwt', kid }))}.${b64u(JSON.stringify(claims))}`;
  return `${signing}.${sign('sha256', Buffer.from(signing), privateKey).toString('base64url')}`;
};
const ownAccessToken = (token) => {
  const [header, payload, signature] = String(token).split('.');
  if (!signature || !verify('sha256', Buffer.from(`${header}.${payload}`), publicKey, Buffer.from(signature, 'base64url'))) {
    return null;
  }
  const claims = JSON.parse(Buffer.from(payload, 'base64url').toString());
  return claims.iss === issuer && claims.exp > Date.now() / 1000 ? claims : null;
};
provider.registerGrantType(TOKEN_EXCHANGE, async (ctx) => {
  const { subject_token: subjectToken, subject_token_type: subjectType, scope } = ctx.oidc.params;
  const resource = [].concat(ctx.oidc.params.resource ?? [])[0];
  const refuse = (error, description) => {
    ctx.status = 400;
    ctx.body = { error, error_description: description };
  };
  if (subjectType !== ACCESS_TOKEN_TYPE) return refuse('invalid_request', 'subject_token_type must be an access token');
  const subject = ownAccessToken(subjectToken);
  if (!subject) return refuse('invalid_grant', 'the subject token is not a valid access token of this server');
  if (!resource) return refuse('invalid_target', 'name the resource the token is for');
  const now = Math.floor(Date.now() / 1000);
  const client = ctx.oidc.client.clientId;
  const claims = {
    iss: issuer, sub: subject.sub, aud: resource, iat: now, exp: now + 300, scope: scope ?? '',
    client_id: client, act: { sub: client }, jti: randomBytes(8).toString('hex'),
  };
  ctx.body = { access_token: signJwt(claims), issued_token_type: ACCESS_TOKEN_TYPE, token_type: 'Bearer', expires_in: 300 };
}, ['subject_token', 'subject_token_type', 'requested_token_type', 'resource', 'scope', 'audience']);

// CORS at the registration endpoint (oidc-provider has none there): the
// preflight of a browser's JSON POST, and the header on the answer.
provider.use(async (ctx, next) => {
  const origin = ctx.get('Origin');
  if (ctx.path !== '/reg' || !origin) return next();
  ctx.vary('Origin');
  if (ctx.method === 'OPTIONS') {
    if (!ctx.get('Access-Control-Request-Method')) return next();
    ctx.set('Access-Control-Allow-Origin', origin);
    ctx.set('Access-Control-Allow-Methods', 'POST');
    ctx.set('Access-Control-Allow-Headers', 'Content-Type, Accept');
    ctx.set('Access-Control-Max-Age', '600');
    ctx.status = 204;
    return undefined;
  }
  await next();
  if (ctx.method === 'POST') ctx.set('Access-Control-Allow-Origin', origin);
  return undefined;
});

// How often its keys were fetched, for the tests (GET /test/jwks-fetches).
let jwksFetches = 0;
provider.use(async (ctx, next) => {
  if (ctx.path === '/test/jwks-fetches') {
    ctx.body = { fetches: jwksFetches };
    return;
  }
  if (ctx.path === '/jwks') jwksFetches += 1;
  await next();
});

// The introspection requests so far (GET /test/introspected): the token is
// read from the parameters oidc-provider parsed for the route.
const introspected = { count: 0, tokens: [] };
provider.use(async (ctx, next) => {
  if (ctx.path === '/test/introspected') {
    ctx.body = introspected;
    return;
  }
  await next();
  if (ctx.path === '/token/introspection' && ctx.method === 'POST') {
    introspected.count += 1;
    if (introspected.tokens.length < 10000) introspected.tokens.push(String(ctx.oidc?.params?.token ?? ''));
  }
});

// The tokens issued so far, per client (GET /test/tokens-issued).
const tokensIssued = {};
provider.use(async (ctx, next) => {
  if (ctx.path === '/test/tokens-issued') {
    ctx.body = tokensIssued;
    return;
  }
  await next();
  const client = ctx.oidc?.client?.clientId;
  if (ctx.path === '/token' && ctx.method === 'POST' && ctx.status === 200 && client) {
    tokensIssued[client] = (tokensIssued[client] ?? 0) + 1;
  }
});

provider.proxy = false;
provider.listen(Number(port), '127.0.0.1', () => {
  console.log('READY');
});
