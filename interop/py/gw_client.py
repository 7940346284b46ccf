#!/usr/bin/env python3
"""Gateway interop check: the official MCP Python SDK client (``mcp`` 2.x) against a
Python SDK stdio server (interop/servers/py_stdio_server.py) that tether serves at
/mcp/pystdio (``--upstream 'pystdio=stdio:PYTHON py_stdio_server.py'``).

usage: gw_client.py http://127.0.0.1:PORT/mcp/pystdio [MODE]

MODE is the SDK's: ``legacy`` (the default here: a tether session, the upstream's
child per session) or ``auto`` (it probes server/discover, which the gateway answers,
and goes on sessionless on a pooled upstream connection). In either: the upstream's
serverInfo comes back, tools/list has ``greet``, ``slow``, ``cancellations`` and
``roots``, tools/call greet answers the upstream's text,
resources/list and resources/read give the fixture's resource, prompts/list and
prompts/get give its prompt; then a long call (``slow``) is cancelled by the client
after its third progress notification (leaving an anyio cancel scope makes the SDK
send notifications/cancelled, or, sessionless, closes the request's stream), and the
upstream must have received it: on the same child, ``cancellations`` reports that ``slow`` was interrupted
for that call (its label) and that a notifications/cancelled named the request ID
the upstream ran it under (tether maps IDs, so the upstream's own ID is compared
with the upstream's own record, never with the client's). A ``slow`` call after
that still finishes. Leaving the client DELETEs the session. Prints what it saw and
OK, or FAIL and why.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
import uuid

import anyio
import httpx2
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client

TIMEOUT_S = 60
FIXTURE = "py-stdio-fixture"
RESOURCE_URI = "pystdio://fixture/info"


class CheckFailed(Exception):
    pass


def check(cond: object, msg: str) -> None:
    if not cond:
        raise CheckFailed(msg)


async def run(url: str, mode: str) -> None:
    posts: list[tuple[str, int | None]] = []

    async def on_response(response: httpx2.Response) -> None:
        req = response.request
        if req.method == "POST":
            try:
                body = json.loads(req.content)
                method = body.get("method") or "response" if isinstance(body, dict) else "batch"
            except ValueError:
                method = "(not JSON)"
            posts.append((method, response.status_code))

    http = httpx2.AsyncClient(timeout=httpx2.Timeout(30, read=TIMEOUT_S), trust_env=False,
                              event_hooks={"response": [on_response]})
    with anyio.fail_after(TIMEOUT_S):
        async with http:
            async with Client(streamable_http_client(url, http_client=http), mode=mode) as client:
                info = client.server_info
                check(info is not None and info.name == FIXTURE,
                      f"serverInfo is not the upstream's: {info!r}")
                print(f"connected: protocol {client.protocol_version}, server {info.name} {info.version}")

                tools = await client.list_tools()
                names = [t.name for t in tools.tools]
                check(names == ["greet", "slow", "cancellations", "roots"],
                      f"tools/list: want ['greet', 'slow', 'cancellations', 'roots'], got {names}")
                greet = tools.tools[0]
                check("name" in (greet.input_schema or {}).get("properties", {}),
                      f"greet's input schema has no 'name': {greet.input_schema!r}")
                print(f"tools/list: {names}")

                result = await client.call_tool("greet", {"name": "Ada"})
                check(not result.is_error, f"tools/call greet returned is_error: {result!r}")
                texts = [c.text for c in result.content if getattr(c, "type", None) == "text"]
                want = f"Hello, Ada! (from {FIXTURE})"
                check(texts == [want], f"tools/call greet: want [{want!r}], got {texts!r}")
                print(f"tools/call greet: {texts[0]!r}")

                resources = await client.list_resources()
                uris = [str(r.uri) for r in resources.resources]
                check(uris == [RESOURCE_URI], f"resources/list: want [{RESOURCE_URI!r}], got {uris}")
                read = await client.read_resource(RESOURCE_URI)
                check(len(read.contents) == 1, f"resources/read: want one content, got {read.contents!r}")
                content = read.contents[0]
                check(str(content.uri) == RESOURCE_URI and getattr(content, "text", None)
                      == f"{FIXTURE}: a resource read over stdio" and content.mime_type == "text/plain",
                      f"resources/read: unexpected content {content!r}")
                print(f"resources/read {RESOURCE_URI}: {content.text!r}")

                prompts = await client.list_prompts()
                pnames = [p.name for p in prompts.prompts]
                check(pnames == ["review"], f"prompts/list: want ['review'], got {pnames}")
                args = [a.name for a in (prompts.prompts[0].arguments or [])]
                check(args == ["code"], f"prompt review's arguments: want ['code'], got {args}")
                prompt = await client.get_prompt("review", {"code": "print(1)"})
                check(len(prompt.messages) == 1, f"prompts/get: want one message, got {prompt.messages!r}")
                msg = prompt.messages[0]
                check(msg.role == "user" and getattr(msg.content, "text", None)
                      == "Please review this code:\nprint(1)",
                      f"prompts/get review: unexpected message {msg!r}")
                print(f"prompts/get review: {msg.content.text!r}")

                await check_cancel(client)
    print("POSTs: " + ", ".join(f"{m} -> {st}" for m, st in posts))
    rejected = [p for p in posts if p[1] is None or (p[1] >= 400 and p[0] != "server/discover")]
    check(not rejected, f"POSTs refused: {rejected}")


async def check_cancel(client: Client) -> None:
    """Cancel a long call through the gateway; the upstream must see notifications/cancelled."""
    label = f"cancel-{uuid.uuid4().hex[:8]}"
    progress: list[float] = []
    finished = None
    started = time.monotonic()
    with anyio.CancelScope() as scope:

        async def on_progress(p: float, total: float | None, message: str | None) -> None:
            progress.append(p)
            if len(progress) == 3:
                scope.cancel()

        # 100 steps of 0.1 s: 10 s if nothing cancels it.
        finished = await client.call_tool("slow", {"label": label, "steps": 100}, progress_callback=on_progress)
    took = time.monotonic() - started
    check(scope.cancelled_caught and finished is None, f"the cancelled slow call finished: {finished!r}")
    check(len(progress) >= 3, f"the slow call was cancelled before its third progress: {progress}")
    check(took < 5, f"cancelling the slow call took {took:.1f} s")
    print(f"cancel: slow {label} cancelled by the client after progress {progress} ({took:.1f} s)")

    # The notification is one-way: poll the upstream's own record of it.
    report: dict = {}
    mine: list[dict] = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        result = await client.call_tool("cancellations", {})
        check(not result.is_error, f"tools/call cancellations returned is_error: {result!r}")
        texts = [c.text for c in result.content if getattr(c, "type", None) == "text"]
        check(len(texts) == 1, f"cancellations: want one text, got {result.content!r}")
        report = json.loads(texts[0])
        mine = [r for r in report["cancelled"] if r["label"] == label]
        if mine and mine[0]["request_id"] in report["notifications"]:
            break
        await anyio.sleep(0.1)
    check(len(mine) == 1, f"the upstream's slow handler was not cancelled for {label} (upstream report: {report})")
    rec = mine[0]
    check(rec["request_id"] in report["notifications"],
          f"the upstream received no notifications/cancelled for its request {rec['request_id']!r} "
          f"(upstream report: {report})")
    check(3 <= rec["steps_done"] < 100, f"odd steps_done in the upstream's record: {rec}")
    print(f"cancel: the upstream got notifications/cancelled for its request {rec['request_id']} "
          f"(slow {label} interrupted after {rec['steps_done']} of 100 steps)")

    # The session (and its child) still serves calls, long ones included.
    again = await client.call_tool("slow", {"label": "after-cancel", "steps": 3})
    texts = [c.text for c in again.content if getattr(c, "type", None) == "text"]
    check(texts == ["slow after-cancel finished"], f"slow after the cancel: {again!r}")
    print(f"tools/call slow after the cancel: {texts[0]!r}")


def main() -> int:
    if len(sys.argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    try:
        anyio.run(run, sys.argv[1], sys.argv[2] if len(sys.argv) == 3 else "legacy")
    except CheckFailed as e:
        print(f"FAIL: {e}")
        return 1
    except BaseException as e:  # noqa: BLE001 - any failure of the check is reported whole
        print(f"FAIL: {type(e).__name__}: {e}\n{traceback.format_exc()}")
        return 1
    print("OK gw_client.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
