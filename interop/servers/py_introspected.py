#!/usr/bin/env python3
"""The fixture of ``py_server.py`` (the official Python SDK) behind a real
token check: every request to /mcp needs ``Authorization: Bearer TOKEN`` that
the authorization server at ISSUER calls active by RFC 7662 introspection,
asked at each request (nothing remembered, so a token revoked there, RFC 7009,
is refused from the next request on), with this server's URL in its ``aud``;
else 401 with ``WWW-Authenticate: Bearer error="invalid_token"``. It
introspects as the client ``tether`` / ``tether-secret`` of
interop/oauth/provider.mjs.

usage: py_introspected.py SHAPE PORT ISSUER

  SHAPE   stateful      Streamable HTTP with sessions, at /mcp
          modern-only   the sessionless revision 2026-07-28 only (as in py_server.py)
  PORT    TCP port on 127.0.0.1
  ISSUER  the authorization server's issuer URL (its metadata names the
          introspection endpoint)

For the tests: ``POST /test/refuse-all`` makes it refuse every token from
then on (an upstream that never takes tether's credentials again);
``GET /test/auth`` answers ``{"accepted": [TOKEN...], "refused": N}``: the
distinct tokens it took (at most 1000) and how many requests it refused.
``GET /stats`` is py_server.py's. Prints ``READY`` once it accepts connections.
"""

from __future__ import annotations

import asyncio
import base64
import json
import sys
import urllib.parse
import urllib.request

import anyio
import uvicorn

import py_server

INTROSPECTION_CLIENT = ("tether", "tether-secret")
AUTH = {"accepted": [], "refused": 0}
REFUSE_ALL = False


def introspect(endpoint: str, token: str) -> dict:
    """The authorization server's RFC 7662 answer for ``token``."""
    basic = base64.b64encode(":".join(INTROSPECTION_CLIENT).encode()).decode()
    request = urllib.request.Request(
        endpoint,
        data=urllib.parse.urlencode({"token": token}).encode(),
        headers={"Authorization": f"Basic {basic}", "Content-Type": "application/x-www-form-urlencoded"},
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.load(answer)


def guarded(app, endpoint: str, audience: str):
    """ASGI wrapper: the token check in front of /mcp, and the /test routes."""

    async def respond(send, status: int, body: dict, headers=()):
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), *headers]})
        await send({"type": "http.response.body", "body": json.dumps(body).encode()})

    async def wrapped(scope, receive, send):
        global REFUSE_ALL
        if scope["type"] != "http":
            return await app(scope, receive, send)
        path = scope["path"]
        if path == "/test/refuse-all" and scope["method"] == "POST":
            REFUSE_ALL = True
            return await respond(send, 200, {})
        if path == "/test/auth":
            return await respond(send, 200, AUTH)
        if path.startswith("/mcp"):
            value = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
            token = value[7:].strip() if value.lower().startswith("bearer ") else ""
            active = False
            if token and not REFUSE_ALL:
                answer = await anyio.to_thread.run_sync(introspect, endpoint, token)
                aud = answer.get("aud")
                active = answer.get("active") is True and (aud == audience or (isinstance(aud, list) and audience in aud))
            if not active:
                AUTH["refused"] += 1
                return await respond(send, 401, {"error": "invalid_token"},
                                     [(b"www-authenticate", b'Bearer error="invalid_token"')])
            if token not in AUTH["accepted"] and len(AUTH["accepted"]) < 1000:
                AUTH["accepted"].append(token)
        return await app(scope, receive, send)

    return wrapped


def main() -> None:
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    shape, port, issuer = sys.argv[1], int(sys.argv[2]), sys.argv[3].rstrip("/")
    with urllib.request.urlopen(f"{issuer}/.well-known/openid-configuration", timeout=10) as answer:
        endpoint = json.load(answer)["introspection_endpoint"]
    if shape == "stateful":
        app = py_server.server.streamable_http_app()
    elif shape == "modern-only":
        py_server.MODERN_ONLY = True
        app = py_server.server.streamable_http_app(stateless_http=True, json_response=True)
    else:
        sys.exit(f"unknown shape {shape!r}: stateful | modern-only")
    app = guarded(py_server.counting(app), endpoint, f"http://127.0.0.1:{port}/mcp")
    uv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))

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
