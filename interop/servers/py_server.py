#!/usr/bin/env python3
"""Fixture MCP server on the official Python SDK (``mcp`` 2.x, ``MCPServer``) for
tether's client tests.

usage: py_server.py SHAPE PORT

  SHAPE  stateful        Streamable HTTP with sessions (SSE answers), at /mcp
         stateless-json  Streamable HTTP without sessions, JSON answers, at /mcp
         legacy          the 2024-11-05 HTTP+SSE transport: GET /sse, POST /messages/
         modern-only     Streamable HTTP, sessionless revision 2026-07-28 only: an
                         ``initialize`` is refused (400, -32022 naming 2026-07-28)
         bearer          ``stateful`` behind a bearer check: every request to /mcp
                         needs ``Authorization: Bearer JWT`` whose ``aud`` is this
                         server's URL (read, not verified: the test verifies), else
                         401; the distinct tokens seen are in ``/stats`` as ``tokens``
         shared-store    ``stateful`` with resumable streams kept in ONE event store
                         for every session, keyed by request ID alone (the pattern of
                         the SDK's example store): sessions that reuse request IDs
                         get each other's events replayed
  PORT   TCP port on 127.0.0.1 (the test picks a free one, so a restart reuses it)

Tools: ``echo(text)`` (text back), ``add(a, b)`` (structured ``{"sum": ...}``),
``fail(message)`` (a tool error: ``isError``), ``roots()`` (asks the client
``roots/list`` and returns the URIs), ``slow(ms)`` (sleeps, reports progress).

With ``PY_SERVER_TRACE`` set, the shared store says on stderr what it stores and replays.

Every HTTP request is counted by a small ASGI wrapper; ``GET /stats`` answers
``{"initialize": N, "posts": N, "deletes": N, "gets": N, "sessionless_rejected": N}``
(``initialize``: accepted initialize requests; ``sessionless_rejected``: other
requests without ``Mcp-Session-Id`` answered 400)
so a test can check, for example, that 100 parallel first calls made exactly one
``initialize``. Prints ``READY`` on stdout once it accepts connections.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

import anyio
import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.streamable_http import EventMessage, EventStore

MODERN_ONLY = False
# The URL a token must name as its audience (the ``bearer`` shape), and the tokens seen.
BEARER_AUDIENCE = None
TOKENS_SEEN: list = []
STATS = {"initialize": 0, "initialize_rejected": 0, "posts": 0, "deletes": 0, "gets": 0, "sessionless_rejected": 0}

server = MCPServer(name="py-fixture", version="1.0")


@server.tool(description="Echo the text back.\nSecond line of the description.")
def echo(text: str) -> str:
    return text


@server.tool(description="Add two integers.")
def add(a: int, b: int) -> dict:
    return {"sum": a + b}


@server.tool(description="Always fails with the given message.")
def fail(message: str = "failed as asked") -> str:
    raise ValueError(message)


@server.tool(description="The client's roots (asks roots/list).")
async def roots(ctx: Context) -> str:
    result = await ctx.session.list_roots()
    return json.dumps([str(r.uri) for r in result.roots])


@server.tool(description="Sleep for ms milliseconds, reporting progress.")
async def slow(ms: int, ctx: Context) -> str:
    steps = 4
    for i in range(steps):
        await anyio.sleep(ms / 1000 / steps)
        await ctx.report_progress(i + 1, steps)
    return f"slept {ms} ms"


class SharedEventStore(EventStore):
    """Every session's streams in one place, a stream named by its request ID alone."""

    def __init__(self):
        self.streams = {}  # stream ID (the request ID) -> [(event ID, message)]
        self.stream_of = {}  # event ID -> stream ID
        self.counter = 0

    async def store_event(self, stream_id, message):
        self.counter += 1
        event_id = str(self.counter)
        self.streams.setdefault(stream_id, []).append((event_id, message))
        self.stream_of[event_id] = stream_id
        if os.environ.get("PY_SERVER_TRACE"):
            kind = "priming" if message is None else type(getattr(message, "root", message)).__name__
            print(f"store {event_id} stream={stream_id} {kind}", file=sys.stderr, flush=True)
        return event_id

    async def replay_events_after(self, last_event_id, send_callback):
        stream_id = self.stream_of.get(last_event_id)
        if os.environ.get("PY_SERVER_TRACE"):
            print(f"replay after {last_event_id} stream={stream_id}", file=sys.stderr, flush=True)
        if stream_id is None:
            return None
        after = False
        for event_id, message in list(self.streams.get(stream_id, [])):
            if after and message is not None:
                await send_callback(EventMessage(message, event_id))
            after = after or event_id == last_event_id
        return stream_id


def counting(app):
    """ASGI wrapper: counts requests (initialize POSTs by their body) and serves /stats."""

    async def wrapped(scope, receive, send):
        if scope["type"] != "http":
            return await app(scope, receive, send)
        method, path = scope["method"], scope["path"]
        if path == "/stats":
            body = json.dumps({**STATS, "tokens": TOKENS_SEEN}).encode()
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": body})
            return
        if BEARER_AUDIENCE is not None and not bearer_ok(scope):
            await send({"type": "http.response.start", "status": 401,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"www-authenticate", b'Bearer error="invalid_token"')]})
            await send({"type": "http.response.body", "body": b'{"error": "a token for this server is needed"}'})
            return
        if method == "DELETE":
            STATS["deletes"] += 1
        if method == "GET":
            STATS["gets"] += 1
        if method != "POST":
            return await app(scope, receive, send)
        STATS["posts"] += 1
        chunks = []
        more = True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        try:
            parsed = json.loads(body)
        except ValueError:
            parsed = None
        is_initialize = isinstance(parsed, dict) and parsed.get("method") == "initialize"
        if is_initialize and MODERN_ONLY:
            STATS["initialize_rejected"] += 1
            error = {"jsonrpc": "2.0", "id": parsed.get("id"), "error": {
                "code": -32022, "message": "this server speaks only the 2026-07-28 revision",
                "data": {"supported": ["2026-07-28"], "requested": (parsed.get("params") or {}).get("protocolVersion")}}}
            await send({"type": "http.response.start", "status": 400,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": json.dumps(error).encode()})
            return
        if isinstance(parsed, dict) and parsed.get("method") == "server/discover":
            STATS["discover"] = STATS.get("discover", 0) + 1
        has_session = any(k == b"mcp-session-id" for k, _ in scope["headers"])
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        async def watch(message):
            if message["type"] == "http.response.start":
                status = message["status"]
                if is_initialize and status < 400:
                    STATS["initialize"] += 1
                if is_initialize and status >= 400:
                    # e.g. a Streamable HTTP probe at a legacy server's /sse
                    STATS["initialize_rejected"] += 1
                if status == 400 and not has_session and isinstance(parsed, dict) and not is_initialize:
                    STATS["sessionless_rejected"] += 1
            await send(message)

        return await app(scope, replay, watch)

    return wrapped


def bearer_ok(scope) -> bool:
    """Whether the request carries a JWT for this server (``aud``), remembering it."""
    import base64
    value = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
    if not value.lower().startswith("bearer "):
        return False
    token = value[7:].strip()
    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (IndexError, ValueError):
        return False
    audience = claims.get("aud")
    if audience != BEARER_AUDIENCE and not (isinstance(audience, list) and BEARER_AUDIENCE in audience):
        return False
    if token not in TOKENS_SEEN and len(TOKENS_SEEN) < 1000:
        TOKENS_SEEN.append(token)
    return True


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    shape, port = sys.argv[1], int(sys.argv[2])
    if shape == "stateful":
        app = server.streamable_http_app()
    elif shape == "stateless-json":
        app = server.streamable_http_app(stateless_http=True, json_response=True)
    elif shape == "legacy":
        app = server.sse_app()
    elif shape == "bearer":
        global BEARER_AUDIENCE
        BEARER_AUDIENCE = f"http://127.0.0.1:{port}/mcp"
        app = server.streamable_http_app()
    elif shape == "shared-store":
        app = server.streamable_http_app(event_store=SharedEventStore())
    elif shape == "modern-only":
        global MODERN_ONLY
        MODERN_ONLY = True
        app = server.streamable_http_app(stateless_http=True, json_response=True)
    else:
        sys.exit(f"unknown shape {shape!r}: stateful | stateless-json | legacy | modern-only | bearer | shared-store")
    config = uvicorn.Config(counting(app), host="127.0.0.1", port=port, log_level="warning",
                            lifespan="on")
    uv = uvicorn.Server(config)

    async def run():
        task = asyncio.create_task(uv.serve())
        while not uv.started:
            if task.done():
                await task
                return
            await asyncio.sleep(0.02)
        print("READY", flush=True)
        await task

    asyncio.run(run())


if __name__ == "__main__":
    main()
