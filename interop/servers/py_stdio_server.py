#!/usr/bin/env python3
"""Fixture MCP stdio server on the official Python SDK (``mcp`` 2.x, ``MCPServer``):
a third-party upstream for tether's gateway interop check (interop/run.sh serves it
at /mcp/pystdio with ``--upstream 'pystdio=stdio:PYTHON py_stdio_server.py'``).

usage: py_stdio_server.py          (newline-delimited JSON-RPC on stdin/stdout)

Tools, one resource, one prompt:
  tool      ``greet(name)``          -> text ``Hello, NAME! (from py-stdio-fixture)``
  tool      ``slow(label, steps=100)`` sleeps ``steps`` x 0.1 s, reporting progress
            ``i/steps`` after each step, then answers ``slow LABEL finished``; when its
            handler is cancelled (the SDK cancels it on ``notifications/cancelled``), it
            records ``{"label", "request_id", "steps_done"}`` (the request ID is this
            server's, as tether sent it) before re-raising
  tool      ``cancellations()``      -> text: JSON ``{"cancelled": [those records],
            "notifications": [the requestId of every notifications/cancelled
            received, as strings]}``, oldest first, of every child of the same
            gateway process (a file they share: a sessionless client's requests may
            reach different children of its pool); callers pick theirs by label
  tool      ``roots()``              asks the client ``roots/list`` (in the middle of the call)
            and answers text: JSON ``{"roots": [the root URIs]}``
  resource  ``pystdio://fixture/info`` -> text/plain ``py-stdio-fixture: a resource read over stdio``
  prompt    ``review(code)``         -> one user message ``Please review this code:\\nCODE``
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

import anyio
from mcp.server.mcpserver import Context, MCPServer

NAME = "py-stdio-fixture"
RESOURCE_URI = "pystdio://fixture/info"
RESOURCE_TEXT = f"{NAME}: a resource read over stdio"

# What `slow` recorded when it was cancelled, and the requestId of every
# notifications/cancelled received, by every child of the same gateway process:
# a sessionless client's requests may reach different children of its pool, so
# the record is a file shared by the siblings (named after their parent), one
# JSON object per line.
RECORD = os.path.join(tempfile.gettempdir(), f"py-stdio-fixture-{os.getppid()}.jsonl")


def note(entry: dict[str, object]) -> None:
    with open(RECORD, "a", encoding="utf-8") as f:
        f.write(json.dumps(entry) + "\n")


def recorded() -> tuple[list[dict[str, object]], list[str]]:
    cancelled: list[dict[str, object]] = []
    notifications: list[str] = []
    try:
        with open(RECORD, encoding="utf-8") as f:
            for line in f:
                entry = json.loads(line)
                if entry.get("kind") == "notification":
                    notifications.append(str(entry["request_id"]))
                elif entry.get("kind") == "cancelled":
                    cancelled.append({k: v for k, v in entry.items() if k != "kind"})
    except FileNotFoundError:
        pass
    return cancelled, notifications


async def observe_cancelled(ctx: Any, call_next: Any) -> Any:
    """Middleware: sees every inbound message; notes each notifications/cancelled
    (the SDK's dispatcher has already cancelled the named request's handler)."""
    if ctx.method == "notifications/cancelled":
        note({"kind": "notification", "request_id": str((ctx.params or {}).get("requestId"))})
    return await call_next(ctx)


server = MCPServer(name=NAME, version="1.0", middleware=[observe_cancelled])


@server.tool(description="Greet someone by name.")
def greet(name: str) -> str:
    return f"Hello, {name}! (from {NAME})"


@server.tool(description="Sleep STEPS x 0.1 s with progress; records its own cancellation.")
async def slow(label: str, ctx: Context, steps: int = 100) -> str:
    done = 0
    try:
        for _ in range(steps):
            await anyio.sleep(0.1)
            done += 1
            await ctx.report_progress(done, steps)
    except anyio.get_cancelled_exc_class():
        note({"kind": "cancelled", "label": label, "request_id": ctx.request_id, "steps_done": done})
        raise
    return f"slow {label} finished"


@server.tool(description="The cancellations `slow` recorded in this gateway's children, as JSON.")
def cancellations() -> str:
    cancelled, notifications = recorded()
    return json.dumps({"cancelled": cancelled, "notifications": notifications})


@server.tool(description="Ask the client for its roots and list their URIs.")
async def roots(ctx: Context) -> str:
    listed = await ctx.session.list_roots()
    return json.dumps({"roots": [str(r.uri) for r in listed.roots]})


@server.resource(RESOURCE_URI, name="info", description="What this fixture is.", mime_type="text/plain")
def info() -> str:
    return RESOURCE_TEXT


@server.prompt(description="Ask for a code review.")
def review(code: str) -> str:
    return f"Please review this code:\n{code}"


if __name__ == "__main__":
    server.run("stdio")
