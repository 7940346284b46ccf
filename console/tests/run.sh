#!/usr/bin/env bash
# Browser tests of the web console (/console): headless Chromium driven by
# playwright-core, against a real `tether serve`.
#
# usage: console/tests/run.sh path/to/tether        (e.g. target/release/tether)
#
# Installs what is missing:
#   - Debian's chromium (apt-get install -y chromium) when /usr/bin/chromium is absent,
#   - playwright-core (npm ci into console/tests/node_modules; npm cache in console/.cache),
#   - oidc-provider for oauth-sign-in (npm ci into interop/oauth/node_modules, as
#     interop/run.sh does: same stamp, same lock, npm cache in interop/.cache),
# then runs console/tests/console.mjs: tether on a free loopback port with a
# temporary SQLite store and two gateway endpoints: /mcp/slow in front of
# console/tests/slow_server.py (a stdio server that records every tool run),
# and /mcp/remote, a URL upstream: a second tether serving the same slow
# server, which outlives the first's kill -9. Nine checks: connect-and-call,
# reload-mid-call, kill-9-and-restart, elicitation, two-tabs, unknown-session,
# token, virtual-server (a third tether with a --config file serving /mcp/team,
# two members of crates/tether-gateway/tests/fixtures/stdio_server.py),
# oauth-sign-in (a fourth tether with --oauth-issuer in front of
# interop/oauth/provider.mjs, oidc-provider: the console signs in through the
# provider's login and consent pages).
# Then console/tests/admin.mjs: the admin page /console/admin against a tether
# with --admin-token-env, gateway upstreams of console/tests/admin_server.py (a
# slow tool and one whose name is HTML), a broken upstream, a virtual server
# and an audit log, driven by the official TypeScript SDK's clients:
# sign-in, session-and-calls, upstreams, audit, end-session (ADMIN_BOOK_SHOT=1
# also writes the book's picture, docs/src/operations/admin.png).
# Screenshots of every step go to target/console-shots/.
# CONSOLE_CHECKS=name,name runs only those console checks, ADMIN_CHECKS those
# of the admin page; CONSOLE_SUITES=console or =admin runs one file of checks.
#
# Needs node >= 20 with npm and python3 >= 3.8. CONSOLE_VERBOSE=1 prints tether's log.
set -uo pipefail

if [ $# -ne 1 ]; then
    echo "usage: $0 path/to/tether" >&2
    exit 2
fi
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [ ! -f "$1" ] || [ ! -x "$1" ]; then
    echo "console tests: $1 is not an executable file" >&2
    exit 2
fi
BIN="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
die() {
    echo "console tests: $*" >&2
    exit 1
}
sha() { sha256sum "$1" | cut -d' ' -f1; }

command -v node >/dev/null || die "node (>= 20) not found"
command -v npm >/dev/null || die "npm not found"
[ "$(node -p 'process.versions.node.split(".")[0]')" -ge 20 ] || die "node >= 20 required, found $(node --version)"
PYTHON="${PYTHON:-python3}"
command -v "$PYTHON" >/dev/null || die "$PYTHON not found (set PYTHON=...)"
# tether runs the stdio server with only PATH and HOME: hand it the real interpreter, not a shim.
PYTHON_EXE="$("$PYTHON" -c 'import sys; print(sys.executable)')" || die "$PYTHON does not run"

CHROMIUM=/usr/bin/chromium
if [ ! -x "$CHROMIUM" ]; then
    echo "console tests: $CHROMIUM is missing; installing Debian's chromium package:"
    echo "console tests:   apt-get update && apt-get install -y chromium"
    [ "$(id -u)" -eq 0 ] || die "installing chromium needs root: run 'sudo apt-get install -y chromium' and try again"
    command -v apt-get >/dev/null || die "apt-get not found: install Chromium at $CHROMIUM by hand"
    DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null || die "apt-get update failed"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null || die "apt-get install chromium failed"
    [ -x "$CHROMIUM" ] || die "chromium is installed but $CHROMIUM is still missing"
    echo "console tests: installed $("$CHROMIUM" --version 2>/dev/null)"
fi

STAMP="$HERE/node_modules/.console-stamp"
if [ "$(cat "$STAMP" 2>/dev/null)" != "$(sha "$HERE/package-lock.json")" ]; then
    echo "console tests: npm ci in console/tests"
    mkdir -p "$HERE/../.cache"
    (cd "$HERE" && npm ci --cache "$HERE/../.cache/npm" --no-audit --no-fund --loglevel=error) || die "npm ci failed"
    sha "$HERE/package-lock.json" >"$STAMP"
fi

# The authorization server of oauth-sign-in: interop/oauth (oidc-provider),
# installed as interop/run.sh and interop/servers/ensure.sh do, under their lock.
OAUTH="$HERE/../../interop/oauth"
OAUTH_CACHE="$HERE/../../interop/.cache"
OAUTH_STAMP="$OAUTH/node_modules/.interop-stamp"
mkdir -p "$OAUTH_CACHE"
(
    flock 9
    if [ "$(cat "$OAUTH_STAMP" 2>/dev/null)" != "$(sha "$OAUTH/package-lock.json")" ]; then
        echo "console tests: npm ci in interop/oauth"
        (cd "$OAUTH" && npm ci --cache "$OAUTH_CACHE/npm" --no-audit --no-fund --loglevel=error) || exit 1
        sha "$OAUTH/package-lock.json" >"$OAUTH_STAMP"
    fi
) 9>"$OAUTH_CACHE/ensure.lock" || die "npm ci failed in interop/oauth"

# Any TETHER_* settings of the caller are dropped: the checks expect the defaults.
for v in $(compgen -e | grep '^TETHER_'); do unset "$v"; done
# The console's checks, then the admin page's (admin.mjs); CONSOLE_SUITES=console
# or CONSOLE_SUITES=admin runs one of them.
SUITES="${CONSOLE_SUITES:-console,admin}"
status=0
if [[ ",$SUITES," == *,console,* ]]; then
    node "$HERE/console.mjs" "$BIN" "$PYTHON_EXE" "$CHROMIUM" || status=1
fi
if [[ ",$SUITES," == *,admin,* ]]; then
    node "$HERE/admin.mjs" "$BIN" "$PYTHON_EXE" "$CHROMIUM" || status=1
fi
exit $status
