#!/usr/bin/env python3
"""Fixture MCP stdio server on the official Python SDK (``mcp`` 2.x, ``MCPServer``):
a third-party upstream for tether's gateway interop check (interop/run.sh serves it
at /mcp/pystdio with ``--upstream 'pystdio=stdio:PYTHON py_stdio_server.py'``).

usage: py_stdio_server.py          (newline-delimited JSON-RPC on stdin/stdout)

One tool, one resource, one prompt:
  tool      ``greet(name)``          -> text ``Hello, NAME! (from py-stdio-fixture)``
  resource  ``pystdio://fixture/info`` -> text/plain ``py-stdio-fixture: a resource read over stdio``
  prompt    ``review(code)``         -> one user message ``Please review this code:\\nCODE``
"""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer

NAME = "py-stdio-fixture"
RESOURCE_URI = "pystdio://fixture/info"
RESOURCE_TEXT = f"{NAME}: a resource read over stdio"

server = MCPServer(name=NAME, version="1.0")


@server.tool(description="Greet someone by name.")
def greet(name: str) -> str:
    return f"Hello, {name}! (from {NAME})"


@server.resource(RESOURCE_URI, name="info", description="What this fixture is.", mime_type="text/plain")
def info() -> str:
    return RESOURCE_TEXT


@server.prompt(description="Ask for a code review.")
def review(code: str) -> str:
    return f"Please review this code:\n{code}"


if __name__ == "__main__":
    server.run("stdio")
