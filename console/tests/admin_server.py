#!/usr/bin/env python3
"""A stdio MCP server for the admin page's browser checks (standard library only).

Newline-delimited JSON-RPC on stdin/stdout, each call on a thread of its own.

Tools:
  slow          sleeps `ms` milliseconds (default 3000), then answers "slept N ms"
  HTML_TOOL     the same, under a name full of HTML (see below): the admin page
                must show it as text, and no script in it may run
"""

import json
import sys
import threading
import time

HTML_TOOL = '<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>b&lt;'
out_lock = threading.Lock()
SCHEMA = {"type": "object", "properties": {"ms": {"type": "integer", "minimum": 0, "maximum": 60000}}}
TOOLS = [
    {"name": "slow", "description": "Sleeps `ms` milliseconds.", "inputSchema": SCHEMA},
    {"name": HTML_TOOL, "description": "Sleeps too, under a name full of HTML.", "inputSchema": SCHEMA},
]


def send(message):
    line = json.dumps(message, separators=(",", ":"))
    with out_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def call(id_, params):
    name = params.get("name")
    ms = int((params.get("arguments") or {}).get("ms", 3000))
    if name not in (t["name"] for t in TOOLS):
        send({"jsonrpc": "2.0", "id": id_, "error": {"code": -32602, "message": "unknown tool"}})
        return
    time.sleep(ms / 1000.0)
    send({"jsonrpc": "2.0", "id": id_, "result": {"content": [{"type": "text", "text": "slept %d ms" % ms}]}})


def main():
    for line in sys.stdin:
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        method, id_ = msg.get("method"), msg.get("id")
        if id_ is None or method is None:
            continue
        if method == "initialize":
            send({"jsonrpc": "2.0", "id": id_, "result": {
                "protocolVersion": msg.get("params", {}).get("protocolVersion", "2025-06-18"),
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "admin-fixture", "version": "1"}}})
        elif method == "tools/list":
            send({"jsonrpc": "2.0", "id": id_, "result": {"tools": TOOLS}})
        elif method == "tools/call":
            threading.Thread(target=call, args=(id_, msg.get("params") or {}), daemon=True).start()
        elif method == "ping":
            send({"jsonrpc": "2.0", "id": id_, "result": {}})
        else:
            send({"jsonrpc": "2.0", "id": id_, "error": {"code": -32601, "message": "no such method"}})


if __name__ == "__main__":
    main()
