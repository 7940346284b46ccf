#!/usr/bin/env python3
"""The rmcp example (crates/tether/examples/rmcp_server.rs: an rmcp handler with the
tools echo and slow, served by tether's engine) with the official MCP Python SDK
client (``mcp`` 2.x).

usage: rmcp_example.py URL [CHECK ...]
       CHECK: legacy | modern | auto   (default: all three)

  legacy  Client(..., mode="legacy"), a 2025-11-25 session: initialize, tools/list is
          exactly echo and slow, tools/call echo returns its text, tools/call slow
          {steps: 3} with a progress callback: progress 1, 2, 3 of 3 in order, then
          the result "done after 3 steps"; every POST after initialize carries the
          session's Mcp-Session-Id and leaving the Client sends one DELETE.
  modern  Client(..., mode="2026-07-28"), sessionless: tools/list, tools/call echo,
          tools/call slow {steps: 3} with a progress callback (progress 1, 2, 3 in
          order, then the result); from the HTTP log: no initialize, no Mcp-Session-Id
          sent or answered, no GET or DELETE, every POST carries MCP-Protocol-Version
          2026-07-28.
  auto    the same with the SDK's default mode ("auto"): its first request is the
          server/discover probe, and it goes on sessionless.

Prints one PASS/FAIL line per check and exits non-zero if any failed.
"""

from __future__ import annotations

import sys
import traceback
from typing import Any

import anyio
import httpx2
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client

from client import MODERN_VERSION, SUPPORTED_VERSIONS, TIMEOUT_S, CheckFailed, HttpLog, check, first_check_failed

ECHO_TEXT = "hello from the Python SDK"
STEPS = 3


class SessionLog(HttpLog):
    """HttpLog that also keeps each request's and response's Mcp-Session-Id."""

    async def on_request(self, request: httpx2.Request) -> None:
        await super().on_request(request)
        self.entries[-1]["session"] = request.headers.get("mcp-session-id")
        self.entries[-1]["answered_session"] = None

    async def on_response(self, response: httpx2.Response) -> None:
        await super().on_response(response)
        for e in reversed(self.entries):
            if e["request"] is response.request:
                e["answered_session"] = response.headers.get("mcp-session-id")
                break

    def render(self) -> str:
        return "\n".join(
            f"  {e['method']} {e['rpc'] or ''} mcp-protocol-version={e['version'] or '(none)'}"
            f" mcp-session-id={e.get('session') or '(none)'} -> {e['status']} {e['content_type'] or ''}"
            f"{' (answered mcp-session-id=' + e['answered_session'] + ')' if e.get('answered_session') else ''}"
            for e in self.entries
        )


def text_of(result: Any) -> str:
    return "".join(getattr(c, "text", "") for c in result.content if getattr(c, "type", None) == "text")


async def tools_and_echo(client: Client) -> list[str]:
    names = sorted(t.name for t in (await client.list_tools()).tools)
    check(names == ["echo", "slow"], f"tools/list is not exactly echo and slow: {names}")
    echo = await client.call_tool("echo", {"text": ECHO_TEXT})
    check(not echo.is_error, f"tools/call echo: is_error: {echo!r}")
    check([(c.type, getattr(c, "text", None)) for c in echo.content] == [("text", ECHO_TEXT)],
          f"tools/call echo: content {echo.content!r}, want one text block {ECHO_TEXT!r}")
    return names


async def slow_with_progress(client: Client) -> list[float]:
    """tools/call slow {steps: 3} with a progress callback: 1, 2, 3 of 3 in order, then the result."""
    progress: list[tuple[float, float | None, str | None]] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((value, total, message))

    slow = await client.call_tool("slow", {"steps": STEPS}, progress_callback=on_progress)
    check(not slow.is_error, f"tools/call slow: is_error: {slow!r}")
    check(text_of(slow) == f"done after {STEPS} steps", f"tools/call slow: {slow!r}")
    # the progress callback ran before the result was returned
    check([(p, t) for p, t, _ in progress] == [(float(i), float(STEPS)) for i in range(1, STEPS + 1)],
          f"progress {progress!r}, want 1, 2, 3 of {STEPS} in order")
    return [p for p, _, _ in progress]


async def legacy_check(url: str) -> str:
    log = SessionLog()
    try:
        with anyio.fail_after(TIMEOUT_S):
            async with log.client() as http:
                async with Client(streamable_http_client(url, http_client=http), mode="legacy") as client:
                    version = client.protocol_version
                    check(version in SUPPORTED_VERSIONS, f"negotiated {version!r}, want one of {SUPPORTED_VERSIONS}")
                    names = await tools_and_echo(client)
                    progress = await slow_with_progress(client)
                # leaving the Client sends DELETE (terminate_on_close=True)
        posts = [e for e in log.entries if e["method"] == "POST"]
        rpcs = [e["rpc"] for e in posts]
        check(rpcs[:1] == ["initialize"], f"the first POST was not initialize: {rpcs}")
        sid = posts[0]["answered_session"]
        check(sid, "initialize was answered without an Mcp-Session-Id")
        check(all(e["session"] == sid for e in log.entries[1:]), "a request after initialize lacks the session's Mcp-Session-Id")
        call = next(e for e in posts if e["rpc"] == "tools/call")
        check(call["version"] == version, f"tools/call carried mcp-protocol-version={call['version']}, want {version}")
        dele = [e for e in log.entries if e["method"] == "DELETE"]
        check(len(dele) == 1 and dele[0]["status"] in (200, 202, 204), f"session DELETE on close: {[e['status'] for e in dele]}")
    except BaseException as e:  # noqa: BLE001
        raise failure(e, log) from None
    return (f"protocol={version} session={sid} tools={names}, echo ok, slow: progress "
            f"{progress} of {STEPS} then 'done after {STEPS} steps'; requests={rpcs} + DELETE")



def failure(e: BaseException, log: "SessionLog") -> CheckFailed:
    """The check that failed (or the error, with its traceback), with the HTTP log."""
    failed = first_check_failed(e)
    what = str(failed) if failed else f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
    return CheckFailed(f"{what}\nHTTP log:\n{log.render()}")

async def modern_check(url: str, mode: str) -> str:
    log = SessionLog()
    try:
        with anyio.fail_after(TIMEOUT_S):
            async with log.client() as http:
                transport = streamable_http_client(url, http_client=http)
                # mode="auto" is the SDK default: leave it unset to exercise the default.
                client = Client(transport) if mode == "auto" else Client(transport, mode=mode)
                check(client.mode == mode, f"Client.mode is {client.mode!r}, want {mode!r}")
                async with client:
                    version = client.protocol_version
                    check(version == MODERN_VERSION, f"negotiated {version!r}, want {MODERN_VERSION}")
                    names = await tools_and_echo(client)
                    progress = await slow_with_progress(client)
        check(log.entries, "no HTTP request was recorded")
        for e in log.entries:
            check(e["method"] == "POST", f"a sessionless client sent {e['method']}")
            check(e["rpc"] != "initialize", "a sessionless client sent initialize")
            check(not e["session"], f"{e['rpc']}: an Mcp-Session-Id was sent")
            check(not e["answered_session"], f"{e['rpc']}: the server answered with an Mcp-Session-Id")
            check(e["version"] == MODERN_VERSION, f"{e['rpc']}: mcp-protocol-version={e['version']}, want {MODERN_VERSION}")
            check(e["status"] == 200, f"{e['rpc']}: HTTP {e['status']}")
        rpcs = [e["rpc"] for e in log.entries]
        check("tools/call" in rpcs, f"no tools/call went out: {rpcs}")
        if mode == "auto":
            check(rpcs[0] == "server/discover", f"mode='auto' did not probe server/discover first: {rpcs}")
    except BaseException as e:  # noqa: BLE001
        raise failure(e, log) from None
    return (f"protocol={version} tools={names}, echo ok, slow: progress {progress} of {STEPS} then the result; "
            f"requests={rpcs}, no Mcp-Session-Id either way, no GET or DELETE")


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    url = argv[1]
    checks = {
        "legacy": legacy_check,
        "modern": lambda u: modern_check(u, MODERN_VERSION),
        "auto": lambda u: modern_check(u, "auto"),
    }
    failed = 0
    for name in argv[2:] or list(checks):
        if name not in checks:
            print(f"unknown check {name!r}", file=sys.stderr)
            return 2
        try:
            print(f"PASS py-rmcp:{name}: {anyio.run(checks[name], url)}")
        except CheckFailed as e:
            failed += 1
            print(f"FAIL py-rmcp:{name}: {e}")
        except Exception as e:  # noqa: BLE001
            failed += 1
            print(f"FAIL py-rmcp:{name}: {type(e).__name__}: {e}\n{traceback.format_exc()}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
