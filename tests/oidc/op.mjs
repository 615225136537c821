// A real OpenID Provider (panva/oidc-provider, OpenID Certified) for the SSO tests.
//
// Started by tests/support/oidc_op.py on a loopback port; everything it needs comes from
// one JSON file (argv[2]) the test writes: issuer, port, clients, the RSA signing key,
// and the path of an accounts file read on every sign-in, so a test can change a
// person's groups between two sign-ins. Sign-in and consent are oidc-provider's own
// development interactions (its HTML login page: any password, the login names the
// account).
import { readFileSync } from 'node:fs';
import Provider from 'oidc-provider';

const config = JSON.parse(readFileSync(process.argv[2], 'utf8'));

function accounts() {
  return JSON.parse(readFileSync(config.accounts_file, 'utf8'));
}

const provider = new Provider(config.issuer, {
  clients: config.clients,
  jwks: { keys: [config.signing_jwk] },
  cookies: { keys: ['test-only-cookie-key-not-for-production'] },
  claims: {
    openid: ['sub'],
    email: ['email', 'email_verified'],
    profile: ['name', 'preferred_username', 'given_name', 'family_name'],
    groups: ['groups'],
  },
  scopes: ['openid', 'email', 'profile', 'groups'],
  // Claims in the ID token too (not only at userinfo), as many company IdPs do.
  conformIdTokenClaims: false,
  features: {
    devInteractions: { enabled: true },
    rpInitiatedLogout: { enabled: true },
  },
  pkce: { required: () => true },
  async findAccount(ctx, id) {
    const person = accounts()[id];
    if (!person) return undefined;
    return {
      accountId: id,
      async claims() {
        return { sub: id, ...person };
      },
    };
  },
});
// Errors go to the log file the fixture keeps (the test's failure message points at it).
for (const event of ['end_session.error', 'grant.error', 'server_error', 'authorization.error']) {
  provider.on(event, (ctx, err) => process.stderr.write(`${event}: ${err} ${err.cause ?? ''}\n`));
}
// Plain-http loopback issuer: tell koa the connection is what it is.
provider.proxy = false;

provider.listen(config.port, '127.0.0.1', () => {
  process.stdout.write(`ready ${config.issuer}\n`);
});
