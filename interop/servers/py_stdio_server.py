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
            records ``{"label", "request_id", "steps_done"}`` in this process (the
            request ID is this server's, as tether sent it) before re-raising
  tool      ``cancellations()``      -> text: JSON ``{"cancelled": [those records],
            "notifications": [the requestId of every notifications/cancelled this
            process received, as strings]}``, oldest first (a child serves one tether
            session, so these are that session's)
  tool      ``roots()``              asks the client ``roots/list`` (in the middle of the call)
            and answers text: JSON ``{"roots": [the root URIs]}``
  resource  ``pystdio://fixture/info`` -> text/plain ``py-stdio-fixture: a resource read over stdio``
  prompt    ``review(code)``         -> one user message ``Please review this code:\\nCODE``
"""

from __future__ import annotations

import json
from typing import Any

import anyio
from mcp.server.mcpserver import Context, MCPServer

NAME = "py-stdio-fixture"
RESOURCE_URI = "pystdio://fixture/info"
RESOURCE_TEXT = f"{NAME}: a resource read over stdio"

# What `slow` recorded when it was cancelled, and the requestId of every
# notifications/cancelled received, in this process (one child per session).
CANCELLED: list[dict[str, object]] = []
CANCEL_NOTIFICATIONS: list[str] = []


async def observe_cancelled(ctx: Any, call_next: Any) -> Any:
    """Middleware: sees every inbound message; notes each notifications/cancelled
    (the SDK's dispatcher has already cancelled the named request's handler)."""
    if ctx.method == "notifications/cancelled":
        CANCEL_NOTIFICATIONS.append(str((ctx.params or {}).get("requestId")))
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
        CANCELLED.append({"label": label, "request_id": ctx.request_id, "steps_done": done})
        raise
    return f"slow {label} finished"


@server.tool(description="The cancellations `slow` recorded in this process, as JSON.")
def cancellations() -> str:
    return json.dumps({"cancelled": CANCELLED, "notifications": CANCEL_NOTIFICATIONS})


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
