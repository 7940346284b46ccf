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
// Every other access token is a JWT (RS256) whose `aud` is the requested
// resource and whose `sub` is the client's id. Prints `READY` once it listens.

import { generateKeyPairSync, randomBytes } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import Provider from 'oidc-provider';

const [port, keyFile] = process.argv.slice(2);
if (!port || !keyFile) {
  console.error('usage: node provider.mjs PORT KEYFILE');
  process.exit(2);
}
const issuer = `http://127.0.0.1:${port}`;
const kid = randomBytes(8).toString('hex');
const { privateKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
const jwk = { ...privateKey.export({ format: 'jwk' }), kid, use: 'sig', alg: 'RS256' };
writeFileSync(keyFile, `# kid: ${kid}\n${privateKey.export({ format: 'pem', type: 'pkcs8' })}`, { mode: 0o600 });

const all = 'tools:read tools:write prompts:read files:read';
const scopes = { svc: all, reader: 'tools:read', opaque: all, tether: '' };
const provider = new Provider(issuer, {
  jwks: { keys: [jwk] },
  clients: Object.keys(scopes).map((id) => ({
    client_id: id,
    client_secret: `${id}-secret`,
    grant_types: ['client_credentials'],
    response_types: [],
    redirect_uris: [],
    scope: scopes[id] || undefined,
  })),
  scopes: all.split(' '),
  features: {
    devInteractions: { enabled: false },
    clientCredentials: { enabled: true },
    introspection: { enabled: true },
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
provider.proxy = false;
provider.listen(Number(port), '127.0.0.1', () => {
  console.log('READY');
});
