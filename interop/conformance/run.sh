#!/usr/bin/env bash
# The official MCP conformance suite (@modelcontextprotocol/conformance, npm)
# against tether's gateway, for both protocol revisions.
#
# usage: interop/conformance/run.sh path/to/tether     (e.g. target/debug/tether)
#
# Installs what is missing (npm ci into interop/conformance/node_modules, npm
# cache in interop/.cache), starts the fixture interop/conformance/server.mjs
# (the official TypeScript SDK v2, serving 2025-11-25 sessions and 2026-07-28
# sessionless requests on one endpoint) on a free port, and
# `tether serve --listen 127.0.0.1:<free port> --store sqlite:<tmp>/t.db
#  --upstream conf=<fixture URL>`, waits for both, then runs
# `conformance server --suite all --spec-version REV` for REV in 2025-11-25 and
# 2026-07-28 against
#   direct   the fixture itself (the baseline: what the SDK passes), and
#   tether   http://127.0.0.1:<port>/mcp/conf (the same fixture through the gateway).
# Prints one PASS/FAIL line per scenario, target and revision (failing ones
# with the suite's failed checks), one summary line per target and revision
# (`conformance 2025-11-25 via tether: 33/33`), stops what it started, and
# exits non-zero when
#   - a via-tether score is below CONFORMANCE_MIN_2025 / CONFORMANCE_MIN_2026
#     (scenarios passed; defaults below: the scores measured through tether),
#   - the fixture fails a scenario directly (the harness itself is broken), or
#   - tether exited during the run.
#
# Needs only node >= 20 with npm (and the network for the first npm ci).
# CONFORMANCE_VERBOSE=1 prints the suite's whole output;
# CONFORMANCE_RESULTS=DIR keeps the suite's checks.json files and the logs there.
set -uo pipefail

# Measured via tether (see README.md): 2025-11-25 33/33; 2026-07-28 40/40.
MIN_2025="${CONFORMANCE_MIN_2025:-33}"
MIN_2026="${CONFORMANCE_MIN_2026:-40}"
REVISIONS=(2025-11-25 2026-07-28)

if [ $# -ne 1 ]; then
    echo "usage: $0 path/to/tether" >&2
    exit 2
fi

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [ ! -f "$1" ] || [ ! -x "$1" ]; then
    echo "conformance: $1 is not an executable file" >&2
    exit 2
fi
BIN="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
CACHE="$(cd "$HERE/.." && pwd)/.cache"
mkdir -p "$CACHE"

die() {
    echo "conformance: $*" >&2
    exit 1
}

sha() { sha256sum "$1" | cut -d' ' -f1; }

# ---------------------------------------------------------------- toolchain
command -v node >/dev/null || die "node (>= 20) not found"
command -v npm >/dev/null || die "npm not found"
NODE_MAJOR="$(node -p 'process.versions.node.split(".")[0]')"
[ "$NODE_MAJOR" -ge 20 ] || die "node >= 20 required, found $(node --version)"

# Reinstall only when the lockfile changed (stamp = its hash).
STAMP="$HERE/node_modules/.interop-stamp"
if [ "$(cat "$STAMP" 2>/dev/null)" != "$(sha "$HERE/package-lock.json")" ]; then
    echo "conformance: npm ci in interop/conformance"
    (cd "$HERE" && npm ci --cache "$CACHE/npm" --no-audit --no-fund --loglevel=error) \
        || die "npm ci failed in interop/conformance"
    sha "$HERE/package-lock.json" >"$STAMP"
fi
SUITE="$HERE/node_modules/@modelcontextprotocol/conformance/dist/index.js"
[ -f "$SUITE" ] || die "$SUITE is missing after npm ci"

# ---------------------------------------------------------------- processes
TMP="$(mktemp -d "${TMPDIR:-/tmp}/tether-conformance.XXXXXX")"
FIXTURE_PID=""
SERVER_PID=""
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
    if [ -n "${CONFORMANCE_RESULTS:-}" ] && [ -d "$TMP" ]; then
        mkdir -p "$CONFORMANCE_RESULTS" && cp -r "$TMP/." "$CONFORMANCE_RESULTS/" \
            && echo "conformance: results and logs kept in $CONFORMANCE_RESULTS"
    fi
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
    node -e 'const s = require("net").createServer().listen(0, "127.0.0.1", () => { console.log(s.address().port); s.close(); })'
}

# wait_for WHAT PID SECONDS CMD...: polls CMD (every 0.1 s) until it succeeds,
# while PID lives, for at most SECONDS; dies with the process's log otherwise.
wait_for() {
    local what="$1" pid="$2" limit="$3" log="$4"
    shift 4
    local deadline=$((SECONDS + limit))
    while [ $SECONDS -lt $deadline ]; do
        "$@" >/dev/null 2>&1 && return 0
        kill -0 "$pid" 2>/dev/null || { tail -n 40 "$log"; die "$what exited before it was ready"; }
        sleep 0.1
    done
    tail -n 40 "$log"
    die "$what was not ready within ${limit}s"
}
http_ok() {
    node -e 'fetch(process.argv[1]).then((r) => process.exit(r.ok ? 0 : 1), () => process.exit(1))' "$1"
}

FIXTURE_PORT="$(free_port)"
FIXTURE_URL="http://127.0.0.1:$FIXTURE_PORT/mcp"
node "$HERE/server.mjs" "$FIXTURE_PORT" >"$TMP/fixture.log" 2>&1 &
FIXTURE_PID=$!
wait_for "the fixture (server.mjs)" "$FIXTURE_PID" 30 "$TMP/fixture.log" grep -q '^READY' "$TMP/fixture.log"

PORT="$(free_port)"
BASE="http://127.0.0.1:$PORT"
echo "conformance: starting $BIN serve --listen 127.0.0.1:$PORT --store sqlite:$TMP/t.db --upstream conf=$FIXTURE_URL"
# TETHER_* settings in the caller's environment are dropped: the defaults are measured.
(
    for v in $(compgen -e | grep '^TETHER_'); do unset "$v"; done
    exec "$BIN" serve --listen "127.0.0.1:$PORT" --store "sqlite:$TMP/t.db" --upstream "conf=$FIXTURE_URL"
) >"$TMP/tether.log" 2>&1 &
SERVER_PID=$!
wait_for "tether" "$SERVER_PID" 30 "$TMP/tether.log" http_ok "$BASE/healthz"

# The suite's bundle imports fs.globSync (node >= 22; used only by its
# tier-check command). On node 20 a loader hook gives it an `fs` that has one.
NODE_ARGS=()
if ! node -e 'process.exit(typeof require("fs").globSync === "function" ? 0 : 1)'; then
    mkdir -p "$TMP/node20"
    cat >"$TMP/node20/fs.mjs" <<'EOF'
import fs from 'node:fs';
export * from 'node:fs';
export default fs;
export function globSync() {
    throw new Error('fs.globSync needs node >= 22');
}
EOF
    cat >"$TMP/node20/hooks.mjs" <<'EOF'
const shim = new URL('./fs.mjs', import.meta.url).href;
export async function resolve(specifier, context, next) {
    if ((specifier === 'fs' || specifier === 'node:fs') && context.parentURL?.includes('/@modelcontextprotocol/conformance/')) {
        return { url: shim, shortCircuit: true };
    }
    return next(specifier, context);
}
EOF
    cat >"$TMP/node20/register.mjs" <<'EOF'
import { register } from 'node:module';
register('./hooks.mjs', import.meta.url);
EOF
    NODE_ARGS=(--import "$TMP/node20/register.mjs")
fi

# ---------------------------------------------------------------- the suite
# failed_checks DIR SCENARIO: the failed checks of SCENARIO's checks.json in DIR.
failed_checks() {
    node - "$1" "$2" <<'EOF'
const fs = require('fs');
const [dir, scenario] = process.argv.slice(2);
const runs = fs.readdirSync(dir).filter((d) => d.startsWith(`server-${scenario}-2`)).sort();
if (runs.length === 0) {
    console.log('    (no checks.json: see the suite output)');
    process.exit(0);
}
const checks = JSON.parse(fs.readFileSync(`${dir}/${runs.at(-1)}/checks.json`, 'utf8'));
const lines = checks.filter((c) => c.status === 'FAILURE')
    .map((c) => `    ${c.id}: ${(c.errorMessage ?? c.description ?? '').replace(/\s+/g, ' ').slice(0, 300)}`);
console.log([...new Set(lines)].join('\n'));
EOF
}

declare -A SCORE TOTAL FAILED_AT
FAILED=0
START=$SECONDS
for rev in "${REVISIONS[@]}"; do
    for target in direct tether; do
        if [ "$target" = direct ]; then url="$FIXTURE_URL"; else url="$BASE/mcp/conf"; fi
        key="$rev $target"
        out="$TMP/results/$rev-$target"
        mkdir -p "$out"
        echo "conformance: --suite all --spec-version $rev against $target ($url)"
        timeout --kill-after=10 900 node "${NODE_ARGS[@]}" "$SUITE" server --url "$url" --suite all \
            --spec-version "$rev" -o "$out" >"$out.log" 2>&1
        rc=$?
        [ "${CONFORMANCE_VERBOSE:-0}" = 1 ] && sed 's/^/    | /' "$out.log"
        [ $rc -eq 124 ] && echo "    (the suite timed out after 900s)"
        # The suite's summary: "✓ NAME: N passed, M failed" (✗ when M > 0).
        pass=0 total=0 failing=""
        while read -r mark name; do
            total=$((total + 1))
            if [ "$mark" = "✓" ]; then
                pass=$((pass + 1))
                echo "PASS $rev $target $name"
            else
                failing+=" $name"
                echo "FAIL $rev $target $name"
                failed_checks "$out" "$name"
            fi
        done < <(sed -n '/^=== SUMMARY ===$/,$p' "$out.log" | sed -nE 's/^(✓|✗) ([^:]+): [0-9]+ passed, [0-9]+ failed$/\1 \2/p')
        if [ $total -eq 0 ]; then
            echo "FAIL $rev $target (no summary from the suite, exit $rc)"
            tail -n 30 "$out.log" | sed 's/^/    | /'
        fi
        SCORE[$key]=$pass
        TOTAL[$key]=$total
        FAILED_AT[$key]="$failing"
    done
done
ELAPSED=$((SECONDS - START))

if ! kill -0 "$SERVER_PID" 2>/dev/null; then
    echo "FAIL tether exited during the run"
    tail -n 60 "$TMP/tether.log"
    FAILED=1
fi

echo
echo "conformance summary (@modelcontextprotocol/conformance $(node -p "require('$HERE/node_modules/@modelcontextprotocol/conformance/package.json').version"), ${ELAPSED}s):"
for rev in "${REVISIONS[@]}"; do
    echo "conformance $rev direct: ${SCORE[$rev direct]}/${TOTAL[$rev direct]}"
    echo "conformance $rev via tether: ${SCORE[$rev tether]}/${TOTAL[$rev tether]}"
    # Scenarios the fixture passes but tether does not.
    worse=""
    for s in ${FAILED_AT[$rev tether]}; do
        case " ${FAILED_AT[$rev direct]} " in *" $s "*) ;; *) worse+=" $s" ;; esac
    done
    [ -n "$worse" ] && echo "  failing via tether only:$worse"
    if [ "${TOTAL[$rev direct]}" -eq 0 ] || [ "${SCORE[$rev direct]}" -lt "${TOTAL[$rev direct]}" ]; then
        echo "  FAIL: the fixture itself fails $rev scenarios:${FAILED_AT[$rev direct]:- (no results)}"
        FAILED=1
    fi
    case "$rev" in
        2025-11-25) min="$MIN_2025" ;;
        *) min="$MIN_2026" ;;
    esac
    if [ "${SCORE[$rev tether]}" -lt "$min" ]; then
        echo "  FAIL: $rev via tether scored ${SCORE[$rev tether]}, below the minimum $min"
        FAILED=1
    fi
done
[ $FAILED -eq 0 ] && echo "conformance: PASS" || echo "conformance: FAIL"
exit $FAILED
