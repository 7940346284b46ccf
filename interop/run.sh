#!/usr/bin/env bash
# Interop tests: the official MCP client SDKs against a tether binary.
#
# usage: interop/run.sh path/to/tether        (e.g. target/release/tether)
#
# Installs what is missing (npm ci into interop/ts/node_modules,
# interop/ts2/node_modules and interop/oauth/node_modules, a venv in
# interop/py/.venv; npm/pip caches in interop/.cache; Debian's chromium when
# /usr/bin/chromium is absent and we are root), starts the TypeScript SDK
# fixture (interop/servers/ts_server.mjs) and @modelcontextprotocol/server-everything
# in its Streamable HTTP mode on free ports, and
# `tether serve --listen 127.0.0.1:<free port> --store sqlite:<tmp>/t.db
# --config <tmp>/tether.toml` with five gateway upstreams (third-party servers
# installed here too; the first three are [upstreams.NAME] tables of that file,
# the other two --upstream flags) and one virtual server ([servers.team]):
#   /mcp/everything       @modelcontextprotocol/server-everything (npm), a stdio command
#   /mcp/pystdio          interop/servers/py_stdio_server.py (Python SDK), a stdio command
#   /mcp/tsfixture        the TypeScript SDK fixture, a URL upstream
#   /mcp/everything-http  server-everything in its Streamable HTTP mode, a URL upstream
#   /mcp/pymodern         interop/servers/py_server.py modern-only (Python SDK, 2026-07-28 only), a URL
#   /mcp/team             a virtual server over everything, pystdio and tsfixture
#                         (names = "prefix": tools and prompts as MEMBER__NAME)
# FastMCP's Client (PyPI fastmcp, a venv in interop/.cache/fastmcp-venv) and
# MCP Inspector's CLI (npm ci into interop/inspector/node_modules) run checks
# of their own on /mcp and /mcp/pystdio. It
# waits for /healthz, runs every check (the gateway durability check kills
# tether with -9 and restarts it on the same SQLite file). Then the rmcp example
# at $RMCP_EXAMPLE, else next to the tether binary (`$(dirname BIN)/examples/rmcp_server`,
# from `cargo build --release -p tether --example rmcp_server`; scripts/test points
# RMCP_EXAMPLE at the debug build the Rust tests made; its checks fail when it is
# missing): an rmcp handler (tools echo and slow) served by tether's engine, on a
# free port and a fresh SQLite file: the TypeScript SDK client starts a slow call
# with progress (interop/ts/rmcp_example.mjs call), the example is killed with -9
# and restarted on the same port and store, and the client resumes the session
# without initialize and the cut call with GET + Last-Event-ID (its progress
# replayed, then one -32603 "interrupted" error; rmcp_example.mjs resume); the
# Python SDK client (interop/py/rmcp_example.py) in a 2025-11-25 session and
# sessionless (2026-07-28), and the TypeScript SDK v2 client
# (interop/ts2/rmcp_example.mjs) sessionless. Then it starts an
# authorization server (interop/oauth/provider.mjs, oidc-provider) and a second
# tether that is an OAuth 2.1 resource server of it (--oauth-issuer), and runs
# the TypeScript SDK client's own authorization against it (interop/ts/oauth.mjs:
# client credentials, and authorization code with PKCE, the login and consent
# pages in headless Chromium); stops the servers, prints one PASS/FAIL line per
# check and exits non-zero if any failed.
#
# Needs only node >= 20 with npm, and python3.11 (or $PYTHON) on the machine
# (and /usr/bin/chromium, installed with apt-get if missing when run as root).
# INTEROP_VERBOSE=1 prints every check's output, not only failing ones.
set -uo pipefail

if [ $# -ne 1 ]; then
    echo "usage: $0 path/to/tether" >&2
    exit 2
fi

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [ ! -f "$1" ] || [ ! -x "$1" ]; then
    echo "interop: $1 is not an executable file" >&2
    exit 2
fi
BIN="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"

CACHE="$HERE/.cache"
TS="$HERE/ts"
TS2="$HERE/ts2"
PY="$HERE/py"
mkdir -p "$CACHE"

die() {
    echo "interop: $*" >&2
    exit 1
}

sha() { sha256sum "$1" | cut -d' ' -f1; }

# ---------------------------------------------------------------- toolchains
command -v node >/dev/null || die "node (>= 20) not found"
command -v npm >/dev/null || die "npm not found"
NODE_MAJOR="$(node -p 'process.versions.node.split(".")[0]')"
[ "$NODE_MAJOR" -ge 20 ] || die "node >= 20 required, found $(node --version)"

PYTHON="${PYTHON:-}"
if [ -z "$PYTHON" ]; then
    for p in python3.11 python3; do
        if command -v "$p" >/dev/null; then PYTHON="$p"; break; fi
    done
fi
[ -n "$PYTHON" ] || die "python3.11 not found (set PYTHON=...)"
"$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' \
    || die "$PYTHON is older than 3.10 (mcp 2.x needs >= 3.10)"

# ---------------------------------------------------------------- installs
# Reinstall only when the lockfile / requirements changed (stamp = their hash).
TS_STAMP="$TS/node_modules/.interop-stamp"
if [ "$(cat "$TS_STAMP" 2>/dev/null)" != "$(sha "$TS/package-lock.json")" ]; then
    echo "interop: npm ci in interop/ts"
    (cd "$TS" && npm ci --cache "$CACHE/npm" --no-audit --no-fund --loglevel=error) \
        || die "npm ci failed"
    sha "$TS/package-lock.json" >"$TS_STAMP"
fi
# The TypeScript SDK v2 client (@modelcontextprotocol/client 2.x, 2026-07-28).
TS2_STAMP="$TS2/node_modules/.interop-stamp"
if [ "$(cat "$TS2_STAMP" 2>/dev/null)" != "$(sha "$TS2/package-lock.json")" ]; then
    echo "interop: npm ci in interop/ts2"
    (cd "$TS2" && npm ci --cache "$CACHE/npm" --no-audit --no-fund --loglevel=error) \
        || die "npm ci failed in interop/ts2"
    sha "$TS2/package-lock.json" >"$TS2_STAMP"
fi
EVERYTHING="$TS/node_modules/.bin/mcp-server-everything"
[ -x "$EVERYTHING" ] || die "$EVERYTHING is missing after npm ci"

# The authorization server of the OAuth checks (oidc-provider) and
# playwright-core. The same folder and stamp as interop/servers/ensure.sh (which
# the Rust tests run), under its lock.
OAUTH="$HERE/oauth"
OAUTH_STAMP="$OAUTH/node_modules/.interop-stamp"
(
    flock 9
    if [ "$(cat "$OAUTH_STAMP" 2>/dev/null)" != "$(sha "$OAUTH/package-lock.json")" ]; then
        echo "interop: npm ci in interop/oauth"
        (cd "$OAUTH" && npm ci --cache "$CACHE/npm" --no-audit --no-fund --loglevel=error) || exit 1
        sha "$OAUTH/package-lock.json" >"$OAUTH_STAMP"
    fi
) 9>"$CACHE/ensure.lock" || die "npm ci failed in interop/oauth"

# Headless Chromium for the authorization code check (the user's login and
# consent pages); installed as console/tests/run.sh does when it is missing.
# Without it that check fails (saying so); the others run.
CHROMIUM=/usr/bin/chromium
if [ ! -x "$CHROMIUM" ]; then
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
        echo "interop: $CHROMIUM is missing; apt-get update && apt-get install -y chromium"
        { DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null \
            && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null; } \
            || echo "interop: installing chromium failed; ts-oauth-authorization-code will fail" >&2
    else
        echo "interop: $CHROMIUM is missing (as root: apt-get install -y chromium); ts-oauth-authorization-code will fail" >&2
    fi
fi

PY_STAMP="$PY/.venv/.interop-stamp"
if [ "$(cat "$PY_STAMP" 2>/dev/null)" != "$(sha "$PY/requirements.txt")" ]; then
    echo "interop: creating venv interop/py/.venv with $PYTHON"
    rm -rf "$PY/.venv"
    "$PYTHON" -m venv "$PY/.venv" || die "python -m venv failed (Debian: apt-get install python3-venv)"
    PIP_CACHE_DIR="$CACHE/pip" "$PY/.venv/bin/python" -m pip install --quiet --disable-pip-version-check \
        -r "$PY/requirements.txt" || die "pip install -r interop/py/requirements.txt failed"
    sha "$PY/requirements.txt" >"$PY_STAMP"
fi
VPY="$PY/.venv/bin/python"

# FastMCP's Client (interop/py/fastmcp_*.py), in a venv of its own under the
# cache: its pinned set (interop/py/requirements-fastmcp.txt) is its own
# resolution of the mcp SDK's dependencies, so it cannot disturb interop/py/.venv.
FMVENV="$CACHE/fastmcp-venv"
FM_STAMP="$FMVENV/.interop-stamp"
if [ "$(cat "$FM_STAMP" 2>/dev/null)" != "$(sha "$PY/requirements-fastmcp.txt")" ]; then
    echo "interop: creating venv interop/.cache/fastmcp-venv with $PYTHON (FastMCP)"
    rm -rf "$FMVENV"
    "$PYTHON" -m venv "$FMVENV" || die "python -m venv failed (Debian: apt-get install python3-venv)"
    PIP_CACHE_DIR="$CACHE/pip" "$FMVENV/bin/python" -m pip install --quiet --disable-pip-version-check \
        -r "$PY/requirements-fastmcp.txt" || die "pip install -r interop/py/requirements-fastmcp.txt failed"
    sha "$PY/requirements-fastmcp.txt" >"$FM_STAMP"
fi
FMPY="$FMVENV/bin/python"

# MCP Inspector (@modelcontextprotocol/inspector), whose CLI (inspector --cli)
# interop/py/inspector_cli.py runs.
INSPECTOR_DIR="$HERE/inspector"
INSPECTOR_STAMP="$INSPECTOR_DIR/node_modules/.interop-stamp"
if [ "$(cat "$INSPECTOR_STAMP" 2>/dev/null)" != "$(sha "$INSPECTOR_DIR/package-lock.json")" ]; then
    echo "interop: npm ci in interop/inspector"
    (cd "$INSPECTOR_DIR" && npm ci --cache "$CACHE/npm" --no-audit --no-fund --loglevel=error) \
        || die "npm ci failed in interop/inspector"
    sha "$INSPECTOR_DIR/package-lock.json" >"$INSPECTOR_STAMP"
fi
INSPECTOR="$INSPECTOR_DIR/node_modules/.bin/inspector"
[ -x "$INSPECTOR" ] || die "$INSPECTOR is missing after npm ci"

# ---------------------------------------------------------------- servers
TMP="$(mktemp -d "${TMPDIR:-/tmp}/tether-interop.XXXXXX")"
SERVER_PID=""
FIXTURE_PID=""
EVERYTHING_HTTP_PID=""
PYMODERN_PID=""
OAUTH_AS_PID=""
OAUTH_SERVER_PID=""
RMCP_PID=""
stop_pid() {
    local pid="$1"
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        kill "$pid" 2>/dev/null
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
    fi
}
cleanup() {
    stop_pid "$SERVER_PID"
    stop_pid "$FIXTURE_PID"
    stop_pid "$EVERYTHING_HTTP_PID"
    stop_pid "$PYMODERN_PID"
    stop_pid "$OAUTH_SERVER_PID"
    stop_pid "$OAUTH_AS_PID"
    stop_pid "$RMCP_PID"
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
    "$VPY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

server_log() {
    echo "---- server log (last 60 lines) ----"
    tail -n 60 "$TMP/server.log"
    echo "------------------------------------"
}

# is_ready LOG PID SECONDS: waits (SECONDS at most) until process PID prints
# READY to LOG; fails if it does not (or exits first).
is_ready() {
    for _ in $(seq $(($3 * 10))); do
        grep -q '^READY' "$1" 2>/dev/null && return 0
        kill -0 "$2" 2>/dev/null || break
        sleep 0.1
    done
    grep -q '^READY' "$1" 2>/dev/null
}

# wait_ready LOG PID WHAT: waits (15 s at most) until the fixture PID prints
# READY to LOG; dies with its log otherwise.
wait_ready() {
    is_ready "$1" "$2" 15 && return 0
    cat "$1"
    die "$3 did not start"
}

# The TypeScript SDK fixture (an HTTP server): the gateway's URL upstream.
FIXTURE_PORT="$(free_port)"
FIXTURE="http://127.0.0.1:$FIXTURE_PORT"
node "$HERE/servers/ts_server.mjs" "$FIXTURE_PORT" >"$TMP/fixture.log" 2>&1 &
FIXTURE_PID=$!
wait_ready "$TMP/fixture.log" "$FIXTURE_PID" "the TypeScript SDK fixture"

# wait_http URL PID any|200 [SECONDS]: waits (SECONDS, 30 by default, at most)
# until URL answers HTTP (any status, or 200 only) while process PID lives.
wait_http() {
    "$VPY" - "$1" "$2" "$3" "${4:-30}" <<'EOF'
import os, sys, time, urllib.error, urllib.request
url, pid, want, limit = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
deadline = time.monotonic() + limit
while time.monotonic() < deadline:
    try:
        os.kill(pid, 0)
    except OSError:
        sys.exit(f"the process behind {url} exited")
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            if want == "any" or r.status == 200:
                sys.exit(0)
    except urllib.error.HTTPError:
        if want == "any":
            sys.exit(0)  # it answers (e.g. 400: no session), so it is listening
    except OSError:
        pass
    time.sleep(0.1)
sys.exit(f"GET {url} did not answer {want} within {limit} s")
EOF
}

# server-everything in its Streamable HTTP mode (`mcp-server-everything
# streamableHttp`: express, MCP at /mcp, port from $PORT, default 3001), a
# second URL upstream. It listens without naming a host (every interface);
# interop/servers/loopback.mjs makes that 127.0.0.1. Ready once it answers HTTP
# (a GET /mcp without a session gets 400).
EVERYTHING_HTTP_PORT="$(free_port)"
EVERYTHING_HTTP="http://127.0.0.1:$EVERYTHING_HTTP_PORT"
PORT="$EVERYTHING_HTTP_PORT" node --import "$HERE/servers/loopback.mjs" "$EVERYTHING" streamableHttp \
    >"$TMP/everything-http.log" 2>&1 &
EVERYTHING_HTTP_PID=$!
wait_http "$EVERYTHING_HTTP/mcp" "$EVERYTHING_HTTP_PID" any || { cat "$TMP/everything-http.log"; die "server-everything (streamableHttp) did not start"; }

# The Python SDK server in its sessionless-only shape (refuses initialize with
# -32022): a URL upstream that session-era clients reach through the gateway.
PYMODERN_PORT="$(free_port)"
PYMODERN="http://127.0.0.1:$PYMODERN_PORT"
"$VPY" "$HERE/servers/py_server.py" modern-only "$PYMODERN_PORT" >"$TMP/pymodern.log" 2>&1 &
PYMODERN_PID=$!
wait_ready "$TMP/pymodern.log" "$PYMODERN_PID" "the Python SDK modern-only fixture"

PORT="$(free_port)"
BASE="http://127.0.0.1:$PORT"
URL="$BASE/mcp"
# The config file: the virtual server's three members as [upstreams.NAME]
# tables (a stdio command is an argv list, so no shell quoting; a JSON string
# is a TOML basic string) and [servers.team] over them. The other two upstreams
# stay --upstream flags (a name is defined once across flags and file).
CONFIG="$TMP/tether.toml"
"$VPY" - "$CONFIG" "$EVERYTHING" "$VPY" "$HERE/servers/py_stdio_server.py" "$FIXTURE/mcp" <<'EOF' || die "cannot write $CONFIG"
import json, sys
path, everything, vpy, pystdio, tsfixture = sys.argv[1:]
q = lambda v: json.dumps(v, ensure_ascii=False)
with open(path, "w", encoding="utf-8") as f:
    f.write(f"""# written by interop/run.sh
[upstreams.everything]
command = [{q(everything)}, "stdio"]

[upstreams.pystdio]
command = [{q(vpy)}, {q(pystdio)}]

[upstreams.tsfixture]
url = {q(tsfixture)}

[servers.team]
upstreams = ["everything", "pystdio", "tsfixture"]
names = "prefix"
# small pages, so that the clients follow nextCursor through every merged list
page_size = 4
""")
EOF
SERVE_ARGS=(
    --config "$CONFIG"
    --upstream "everything-http=$EVERYTHING_HTTP/mcp"
    --upstream "pymodern=$PYMODERN/mcp"
)

# start_server: tether on $PORT with $TMP/t.db and the same flags and config
# file every time; sets SERVER_PID and waits for /healthz.
start_server() {
    echo "interop: starting $BIN serve --listen 127.0.0.1:$PORT --store sqlite:$TMP/t.db ${SERVE_ARGS[*]}"
    echo "==== interop: tether starting ($(date +%T)) ====" >>"$TMP/server.log"
    # Any TETHER_* settings in the caller's environment are dropped: the checks
    # expect the defaults (e.g. SSE answers, not --json-response).
    (
        for v in $(compgen -e | grep '^TETHER_'); do unset "$v"; done
        exec "$BIN" serve --listen "127.0.0.1:$PORT" --store "sqlite:$TMP/t.db" "${SERVE_ARGS[@]}"
    ) >>"$TMP/server.log" 2>&1 &
    SERVER_PID=$!

    wait_http "$BASE/healthz" "$SERVER_PID" 200 || { server_log; die "server did not become healthy"; }
}
start_server

# ---------------------------------------------------------------- checks
PASSED=0
FAILED=0
SUMMARY=()

# run_check NAME TIMEOUT_S CMD...
run_check() {
    local name="$1" limit="$2"
    shift 2
    local out="$TMP/$name.out" rc
    timeout --kill-after=5 "$limit" "$@" >"$out" 2>&1
    rc=$?
    if [ $rc -eq 0 ]; then
        PASSED=$((PASSED + 1))
        SUMMARY+=("PASS $name")
        echo "PASS $name"
        [ "${INTEROP_VERBOSE:-0}" = 1 ] && sed 's/^/    /' "$out"
    else
        FAILED=$((FAILED + 1))
        [ $rc -eq 124 ] && echo "    (timed out after ${limit}s)" >>"$out"
        SUMMARY+=("FAIL $name (exit $rc)")
        echo "FAIL $name (exit $rc)"
        sed 's/^/    /' "$out"
    fi
    return $rc
}

# fail_check NAME REASON: counts NAME as failed without running it.
fail_check() {
    FAILED=$((FAILED + 1))
    SUMMARY+=("FAIL $1 ($2)")
    echo "FAIL $1 ($2)"
}

STATE="$TMP/ts-state.json"
if run_check ts-first 60 node "$TS/first.mjs" "$URL" "$STATE"; then
    # A new process: reconnect with the stored session, resume, DELETE.
    run_check ts-resume 60 node "$TS/resume.mjs" "$URL" "$STATE"
else
    FAILED=$((FAILED + 1))
    SUMMARY+=("FAIL ts-resume (skipped: ts-first failed)")
    echo "FAIL ts-resume (skipped: ts-first failed)"
fi
run_check py-legacy 90 "$VPY" "$PY/client.py" "$URL" legacy
run_check py-auto 90 "$VPY" "$PY/client.py" "$URL" auto
# The same default mode through the whole notebook: init start_new with a root,
# 100 thoughts, session list/get/search, a ~112 KB export whole, load_context by root.
run_check py-auto-notebook 150 "$VPY" "$PY/client.py" "$URL" auto-notebook
# The sessionless revision (2026-07-28) on the same endpoint; and through the
# gateway to a session-era stdio server (the Python SDK fixture): discover,
# calls, and the upstream's roots/list as an input_required round.
run_check py-modern 90 "$VPY" "$PY/client.py" "$URL" modern
run_check py-roots-modern 90 "$VPY" "$PY/client.py" "$URL" roots-modern
run_check py-gw-auto 90 "$VPY" "$PY/client.py" "$URL/pystdio" gw-auto
run_check py-gw-roots-modern 90 "$VPY" "$PY/client.py" "$URL/pystdio" gw-roots-modern
# The TypeScript SDK v2 client with modern negotiation (server/discover, no
# initialize, no session): tools/list and thought here, roots asked through an
# input_required round (MRTR) and answered by the SDK's handler; then a `session` call
# as a task followed to completion on a second tether of the same binary that
# the script starts itself with --resume-wait 0s (every such call a task).
run_check ts2-modern 90 node "$TS2/modern.mjs" "$URL" "$BIN"
# tether call / tether tools (auto) against a server that speaks only the
# sessionless revision: the official Python SDK server, refusing initialize.
# They must find server/discover, never send initialize, and print the result.
# shellcheck disable=SC2016
run_check cli-modern-only 60 bash -c '
    port="$1"; vpy="$2"; fixture="$3"; bin="$4"; out="$5"
    "$vpy" "$fixture" modern-only "$port" >"$out.server" 2>&1 &
    server=$!
    trap "kill $server 2>/dev/null" EXIT
    for _ in $(seq 100); do grep -q READY "$out.server" && break; sleep 0.1; done
    url="http://127.0.0.1:$port/mcp"
    "$bin" tools "$url" | grep -q "^add " || { echo "FAIL: tether tools did not list add"; exit 1; }
    "$bin" call "$url" add --arg a=2 --arg b=3 | tr -d " \n" | grep -q "\"sum\":5" || { echo "FAIL: tether call add"; exit 1; }
    stats="$(curl -s "http://127.0.0.1:$port/stats" 2>/dev/null || "$vpy" -c "import urllib.request,sys;print(urllib.request.urlopen(sys.argv[1]).read().decode())" "http://127.0.0.1:$port/stats")"
    echo "server stats: $stats"
    echo "$stats" | grep -q "\"initialize\": 0" || { echo "FAIL: an initialize reached the server"; exit 1; }
    echo "$stats" | grep -q "\"initialize_rejected\": 0" || { echo "FAIL: tether tried initialize"; exit 1; }
    echo "$stats" | grep -q "\"discover\": [1-9]" || { echo "FAIL: no server/discover"; exit 1; }
' _ "$(free_port)" "$VPY" "$HERE/servers/py_server.py" "$BIN" "$TMP/cli-modern-only"
run_check py-no-header 60 "$VPY" "$PY/client.py" "$URL" no-header
run_check py-roots 90 "$VPY" "$PY/client.py" "$URL" roots

# Gateway: the official SDK clients through tether to third-party servers.
run_check gw-everything 120 node "$TS/gw_everything.mjs" "$URL/everything"
# The same script through the URL upstream; then, from server-everything's own
# log, that it served the session over HTTP (one initialize, the standalone GET
# stream its logging and roots/list go on) and that the client's DELETE reached it.
# shellcheck disable=SC2016
run_check gw-everything-http 120 bash -c '
    node "$1" "$2" || exit
    for _ in $(seq 50); do
        grep -q "^Received session termination request" "$3" && break
        sleep 0.1
    done
    for want in "^Session initialized with ID" "^Establishing new SSE stream" "^Received session termination request"; do
        grep -q "$want" "$3" || { echo "FAIL: server-everything (streamableHttp) never logged \"$want\""; cat "$3"; exit 1; }
    done
    echo "server-everything (streamableHttp) log: $(grep -c "^Session initialized" "$3") session(s) initialized, GET stream opened, DELETE received"
' gw-everything-http "$TS/gw_everything.mjs" "$URL/everything-http" "$TMP/everything-http.log"
run_check gw-pystdio 90 "$VPY" "$PY/gw_client.py" "$URL/pystdio" legacy
run_check gw-pystdio-auto 90 "$VPY" "$PY/gw_client.py" "$URL/pystdio" auto
run_check gw-cancel-ts 60 node "$TS/gw_cancel.mjs" "$URL/pystdio"
run_check gw-tsfixture 60 node "$TS/gw_tsfixture.mjs" "$URL/tsfixture" "$FIXTURE"
# A session-era client (Python SDK, mode="legacy") through the gateway to a
# server that speaks only 2026-07-28: tether keeps the session and sends each
# request sessionless; the upstream never accepts an initialize.
# shellcheck disable=SC2016
run_check gw-legacy-to-modern 90 bash -c '
    "$1" "$2" "$3" gw-legacy-to-modern || exit
    stats="$("$1" -c "import urllib.request,sys;print(urllib.request.urlopen(sys.argv[1]).read().decode())" "$4/stats")"
    echo "upstream stats: $stats"
    echo "$stats" | grep -q "\"initialize\": 0" || { echo "FAIL: the modern-only upstream accepted an initialize"; exit 1; }
    echo "$stats" | grep -q "\"discover\": [1-9]" || { echo "FAIL: tether never sent server/discover upstream"; exit 1; }
' _ "$VPY" "$PY/client.py" "$URL/pymodern" "$PYMODERN"
# A virtual server over three third-party upstreams at once (/mcp/team:
# server-everything over stdio, the Python SDK stdio server, the TypeScript SDK
# fixture as a URL upstream), with each official client: the merged lists under
# their prefixed names, a call to each member, a resource read routed by URI, a
# sampling request raised by server-everything answered by the client, and a
# long pystdio__slow call cancelled by the client, which that member must have
# seen as its own notifications/cancelled.
run_check ts-virtual 120 node "$TS/gw_virtual.mjs" "$URL/team"
run_check py-virtual 120 "$VPY" "$PY/gw_virtual.py" "$URL/team"
# FastMCP's Client and MCP Inspector's CLI, as a user runs them, on the notebook
# and through the gateway (the Python SDK stdio fixture, /mcp/pystdio). FastMCP's
# default mode negotiates the sessionless revision (tether offers it); mode="legacy"
# is its session mode. The Inspector CLI's default era is legacy; --protocol-era
# modern is sessionless.
run_check fastmcp-session 90 "$FMPY" "$PY/fastmcp_client.py" "$URL" session
run_check fastmcp-default 90 "$FMPY" "$PY/fastmcp_client.py" "$URL" default
run_check fastmcp-gw-session 90 "$FMPY" "$PY/fastmcp_client.py" "$URL/pystdio" gw-session
run_check fastmcp-gw-default 90 "$FMPY" "$PY/fastmcp_client.py" "$URL/pystdio" gw-default
run_check inspector-notebook-legacy 120 "$VPY" "$PY/inspector_cli.py" "$INSPECTOR" "$URL" notebook-legacy
run_check inspector-notebook-modern 120 "$VPY" "$PY/inspector_cli.py" "$INSPECTOR" "$URL" notebook-modern
run_check inspector-gw-legacy 90 "$VPY" "$PY/inspector_cli.py" "$INSPECTOR" "$URL/pystdio" gateway-legacy
run_check inspector-gw-modern 90 "$VPY" "$PY/inspector_cli.py" "$INSPECTOR" "$URL/pystdio" gateway-modern
# The whole notebook for clients that declare no extension in the sessionless
# era (init and session for FastMCP's default mode and the Inspector CLI's
# modern era), and results over 64 KiB whole (a ~104 KB session export) in
# both eras.
for check in init session init-no-root export-100k-default export-100k-session; do
    run_check "fastmcp-default-$check" 120 "$FMPY" "$PY/fastmcp_default.py" "$URL" "$check"
done
run_check inspector-notebook-modern-init 90 "$VPY" "$PY/inspector_cli.py" "$INSPECTOR" "$URL" notebook-modern-init
run_check inspector-export-100k 120 "$VPY" "$PY/inspector_cli.py" "$INSPECTOR" "$URL" export-100k
# Durability through the gateway: a session on /mcp/everything, kill -9 of
# tether, a restart on the same SQLite file with the same flags; the same
# Mcp-Session-Id goes on without initialize.
DSTATE="$TMP/gw-durable.json"
if run_check gw-durable-call 60 node "$TS/gw_durable.mjs" "$URL/everything" "$DSTATE" call; then
    if kill -0 "$SERVER_PID" 2>/dev/null; then
        kill -9 "$SERVER_PID"
        wait "$SERVER_PID" 2>/dev/null
        echo "interop: killed tether (kill -9 $SERVER_PID); restarting it on the same store"
        start_server
        run_check gw-durable-resume 60 node "$TS/gw_durable.mjs" "$URL/everything" "$DSTATE" resume
    else
        FAILED=$((FAILED + 1))
        SUMMARY+=("FAIL gw-durable-resume (skipped: the server had exited)")
        echo "FAIL gw-durable-resume (skipped: the server had exited)"
    fi
else
    FAILED=$((FAILED + 1))
    SUMMARY+=("FAIL gw-durable-resume (skipped: gw-durable-call failed)")
    echo "FAIL gw-durable-resume (skipped: gw-durable-call failed)"
fi

# ---------------------------------------------------------------- rmcp example
# crates/tether/examples/rmcp_server.rs: an rmcp handler (tools echo and slow,
# slow sending one progress notification per step, 0.25 s apart) served by
# tether's engine, its sessions in SQLite. Built next to the tether binary
# (target/release/examples/rmcp_server for target/release/tether). On a free
# port and a fresh store file:
#   rmcp-ts-call    the TypeScript SDK client: initialize, tools/list, echo, and
#                   slow {steps: 40} left in flight once 2 progress notifications
#                   came (the session ID and resumption token go to a state file)
#   (kill -9 of the example, a restart on the same port and store file)
#   rmcp-ts-resume  a new TypeScript SDK client with the stored session ID (no
#                   initialize) resumes the cut call with GET + Last-Event-ID: the
#                   progress stored before the kill, in order, then exactly one
#                   JSON-RPC error -32603 "...interrupted..."; echo, tools/list, DELETE
#   rmcp-py         the Python SDK client: a 2025-11-25 session (echo, slow {steps: 3}
#                   with its 3 progress notifications in order, DELETE), then
#                   sessionless 2026-07-28, pinned and by the default mode's
#                   server/discover probe (tools/list, echo, slow, no Mcp-Session-Id)
#   rmcp-ts2        the TypeScript SDK v2 client, sessionless (server/discover,
#                   tools/list, echo, slow with progress)
RMCP_BIN="${RMCP_EXAMPLE:-$(dirname "$BIN")/examples/rmcp_server}"
RMCP_CHECKS=(rmcp-ts-call rmcp-ts-resume rmcp-py rmcp-ts2)
: >"$TMP/rmcp.log"
rmcp_log() {
    echo "---- rmcp example log (last 60 lines) ----"
    tail -n 60 "$TMP/rmcp.log"
    echo "------------------------------------------"
}
# start_rmcp: the example on $RMCP_PORT with $TMP/rmcp.db (the same every
# time); sets RMCP_PID and waits (60 s at most) for its /healthz.
start_rmcp() {
    echo "interop: starting $RMCP_BIN --listen 127.0.0.1:$RMCP_PORT --store sqlite:$TMP/rmcp.db"
    echo "==== interop: rmcp example starting ($(date +%T)) ====" >>"$TMP/rmcp.log"
    (
        for v in $(compgen -e | grep '^TETHER_'); do unset "$v"; done
        exec "$RMCP_BIN" --listen "127.0.0.1:$RMCP_PORT" --store "sqlite:$TMP/rmcp.db"
    ) >>"$TMP/rmcp.log" 2>&1 &
    RMCP_PID=$!
    wait_http "$RMCP_BASE/healthz" "$RMCP_PID" 200 60
}
if [ ! -f "$RMCP_BIN" ] || [ ! -x "$RMCP_BIN" ]; then
    for name in "${RMCP_CHECKS[@]}"; do
        fail_check "$name" "$RMCP_BIN is missing: run cargo build --release -p tether --example rmcp_server (or point RMCP_EXAMPLE at a build of it)"
    done
else
    RMCP_PORT="$(free_port)"
    RMCP_BASE="http://127.0.0.1:$RMCP_PORT"
    RMCP_URL="$RMCP_BASE/mcp"
    rmcp_failed=0
    if ! start_rmcp; then
        for name in "${RMCP_CHECKS[@]}"; do fail_check "$name" "the rmcp example did not become healthy"; done
        rmcp_failed=1
    else
        RSTATE="$TMP/rmcp-ts-state.json"
        if run_check rmcp-ts-call 60 node "$TS/rmcp_example.mjs" "$RMCP_URL" "$RSTATE" call; then
            if kill -0 "$RMCP_PID" 2>/dev/null; then
                # kill -9 while slow is still running; then the same port and store
                kill -9 "$RMCP_PID"
                wait "$RMCP_PID" 2>/dev/null
                echo "interop: killed the rmcp example (kill -9 $RMCP_PID); restarting it on the same port and store"
                if start_rmcp; then
                    run_check rmcp-ts-resume 90 node "$TS/rmcp_example.mjs" "$RMCP_URL" "$RSTATE" resume || rmcp_failed=1
                else
                    fail_check rmcp-ts-resume "skipped: the rmcp example did not become healthy after kill -9"
                    rmcp_failed=1
                fi
            else
                fail_check rmcp-ts-resume "skipped: the rmcp example had exited"
                rmcp_failed=1
            fi
        else
            fail_check rmcp-ts-resume "skipped: rmcp-ts-call failed"
            rmcp_failed=1
        fi
        # The other clients need it up (started again if it is not, e.g. after a
        # failed restart).
        if kill -0 "$RMCP_PID" 2>/dev/null || { stop_pid "$RMCP_PID"; start_rmcp; }; then
            run_check rmcp-py 90 "$VPY" "$PY/rmcp_example.py" "$RMCP_URL" || rmcp_failed=1
            run_check rmcp-ts2 60 node "$TS2/rmcp_example.mjs" "$RMCP_URL" || rmcp_failed=1
            if ! kill -0 "$RMCP_PID" 2>/dev/null; then
                fail_check "rmcp example" "exited during the checks"
                rmcp_failed=1
            fi
        else
            fail_check rmcp-py "skipped: the rmcp example is not running"
            fail_check rmcp-ts2 "skipped: the rmcp example is not running"
            rmcp_failed=1
        fi
    fi
    stop_pid "$RMCP_PID"
    RMCP_PID=""
    [ $rmcp_failed -eq 1 ] && rmcp_log
fi

# ---------------------------------------------------------------- OAuth
# The official TypeScript SDK client authorizing itself against tether as an
# OAuth 2.1 resource server. A real authorization server (oidc-provider,
# interop/oauth/provider.mjs: clients by client credentials, dynamic client
# registration, the authorization code grant with PKCE and its development
# login and consent pages) and a second tether of the same binary protecting
# its /mcp with it. The SDK is given the endpoint URL and an
# OAuthClientProvider (no token, and no authorization server URL but the
# issuer the client-credentials secret is bound to, as the SDK asks): it must
# get the 401, follow the challenge to the protected resource metadata, then
# to the authorization server's metadata, get a token for the endpoint as
# resource (RFC 8707), and call `thought` with it.
#   ts-oauth-client-credentials  the SDK's ClientCredentialsProvider (client svc)
#   ts-oauth-authorization-code  a public client registered by the SDK (RFC
#                                7591); the login and consent pages in headless
#                                Chromium, the redirect to the check's own
#                                callback server, transport.finishAuth(code)
OAUTH_CHECKS=(ts-oauth-client-credentials ts-oauth-authorization-code)
oauth_logs() {
    echo "---- authorization server log (last 40 lines) ----"
    tail -n 40 "$TMP/oauth-provider.log"
    echo "---- OAuth tether log (last 40 lines) ----"
    tail -n 40 "$TMP/oauth-server.log"
    echo "------------------------------------------"
}
oauth_skip() {
    local name
    for name in "${OAUTH_CHECKS[@]}"; do
        FAILED=$((FAILED + 1))
        SUMMARY+=("FAIL $name (skipped: $1)")
        echo "FAIL $name (skipped: $1)"
    done
    oauth_logs
}
: >"$TMP/oauth-server.log"
OAUTH_AS_PORT="$(free_port)"
OAUTH_ISSUER="http://127.0.0.1:$OAUTH_AS_PORT"
echo "interop: starting the authorization server (interop/oauth/provider.mjs) at $OAUTH_ISSUER"
node "$HERE/oauth/provider.mjs" "$OAUTH_AS_PORT" "$TMP/oauth-key.pem" >"$TMP/oauth-provider.log" 2>&1 &
OAUTH_AS_PID=$!
if ! is_ready "$TMP/oauth-provider.log" "$OAUTH_AS_PID" 60; then
    oauth_skip "the authorization server did not start within 60 s"
else
    OAUTH_PORT="$(free_port)"
    OAUTH_BASE="http://127.0.0.1:$OAUTH_PORT"
    OAUTH_ARGS=(serve --listen "127.0.0.1:$OAUTH_PORT" --store "sqlite:$TMP/oauth.db"
        --oauth-issuer "$OAUTH_ISSUER" --oauth-scopes tools:read,tools:write)
    echo "interop: starting $BIN ${OAUTH_ARGS[*]}"
    (
        for v in $(compgen -e | grep '^TETHER_'); do unset "$v"; done
        exec "$BIN" "${OAUTH_ARGS[@]}"
    ) >>"$TMP/oauth-server.log" 2>&1 &
    OAUTH_SERVER_PID=$!
    if ! wait_http "$OAUTH_BASE/healthz" "$OAUTH_SERVER_PID" 200; then
        oauth_skip "the OAuth tether did not become healthy"
    else
        oauth_failed=0
        run_check ts-oauth-client-credentials 90 \
            node "$TS/oauth.mjs" client-credentials "$OAUTH_BASE/mcp" "$OAUTH_ISSUER" || oauth_failed=1
        run_check ts-oauth-authorization-code 120 \
            node "$TS/oauth.mjs" authorization-code "$OAUTH_BASE/mcp" "$OAUTH_ISSUER" "$CHROMIUM" || oauth_failed=1
        for what in "OAuth tether:$OAUTH_SERVER_PID" "authorization server:$OAUTH_AS_PID"; do
            if ! kill -0 "${what##*:}" 2>/dev/null; then
                FAILED=$((FAILED + 1))
                SUMMARY+=("FAIL ${what%%:*} (exited during the checks)")
                echo "FAIL ${what%%:*} (exited during the checks)"
                oauth_failed=1
            fi
        done
        [ $oauth_failed -eq 1 ] && oauth_logs
    fi
fi

if ! kill -0 "$SERVER_PID" 2>/dev/null; then
    FAILED=$((FAILED + 1))
    SUMMARY+=("FAIL server (exited during the checks)")
    echo "FAIL server (exited during the checks)"
fi
[ $FAILED -gt 0 ] && server_log

echo
echo "interop summary:"
printf '  %s\n' "${SUMMARY[@]}"
echo "interop: $PASSED passed, $FAILED failed"
[ $FAILED -eq 0 ]
