#!/usr/bin/env bash
# Makes sure the fixture servers in interop/servers can run: the official
# MCP Python SDK in interop/py/.venv and the TypeScript SDK in
# interop/ts/node_modules, installed from the same pinned files (and with the
# same stamps) as interop/run.sh, so both scripts share one install; and the
# authorization server of the OAuth tests (interop/oauth/node_modules).
#
# usage: interop/servers/ensure.sh          (prints nothing on success)
#
# Needs python3 (>= 3.10, or $PYTHON) with venv, and node >= 20 with npm.
# Concurrent callers (parallel tests) are serialized with a lock file.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TS="$HERE/ts"
PY="$HERE/py"
CACHE="$HERE/.cache"
mkdir -p "$CACHE"

die() {
    echo "interop/servers/ensure.sh: $*" >&2
    exit 1
}

sha() { sha256sum "$1" | cut -d' ' -f1; }

exec 9>"$CACHE/ensure.lock"
flock 9

PY_STAMP="$PY/.venv/.interop-stamp"
if [ "$(cat "$PY_STAMP" 2>/dev/null)" != "$(sha "$PY/requirements.txt")" ]; then
    PYTHON="${PYTHON:-}"
    if [ -z "$PYTHON" ]; then
        for p in python3.11 python3; do
            if command -v "$p" >/dev/null; then PYTHON="$p"; break; fi
        done
    fi
    [ -n "$PYTHON" ] || die "python3 not found (set PYTHON=...)"
    "$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' \
        || die "$PYTHON is older than 3.10 (the mcp SDK needs >= 3.10)"
    echo "interop: creating interop/py/.venv with $PYTHON" >&2
    rm -rf "$PY/.venv"
    "$PYTHON" -m venv "$PY/.venv" >&2 || die "python -m venv failed (Debian: apt-get install python3-venv)"
    PIP_CACHE_DIR="$CACHE/pip" "$PY/.venv/bin/python" -m pip install --quiet --disable-pip-version-check \
        -r "$PY/requirements.txt" >&2 || die "pip install -r interop/py/requirements.txt failed"
    sha "$PY/requirements.txt" >"$PY_STAMP"
fi

TS_STAMP="$TS/node_modules/.interop-stamp"
if [ "$(cat "$TS_STAMP" 2>/dev/null)" != "$(sha "$TS/package-lock.json")" ]; then
    command -v node >/dev/null || die "node (>= 20) not found"
    command -v npm >/dev/null || die "npm not found"
    echo "interop: npm ci in interop/ts" >&2
    (cd "$TS" && npm ci --cache "$CACHE/npm" --no-audit --no-fund --loglevel=error >&2) || die "npm ci failed"
    sha "$TS/package-lock.json" >"$TS_STAMP"
fi

# The authorization server of the OAuth tests (oidc-provider, interop/oauth).
OAUTH="$HERE/oauth"
OAUTH_STAMP="$OAUTH/node_modules/.interop-stamp"
if [ "$(cat "$OAUTH_STAMP" 2>/dev/null)" != "$(sha "$OAUTH/package-lock.json")" ]; then
    command -v node >/dev/null || die "node (>= 20) not found"
    command -v npm >/dev/null || die "npm not found"
    echo "interop: npm ci in interop/oauth" >&2
    (cd "$OAUTH" && npm ci --cache "$CACHE/npm" --no-audit --no-fund --loglevel=error >&2) || die "npm ci in interop/oauth failed"
    sha "$OAUTH/package-lock.json" >"$OAUTH_STAMP"
fi
