#!/usr/bin/env python3
"""Interop checks: FastMCP's ``Client`` (``fastmcp`` 4.x) against tether.

usage: fastmcp_client.py URL CHECK

  session     Client(URL, mode="legacy", roots=[ROOT]) on the notebook (/mcp): the
              initialize handshake (2025-11-25); tools/list names thought, init and
              session; a `thought`; init list_roots shows ROOT bound; session get, search
              and export (markdown) of the current notebook session hold the thought;
              then a second Client (a new MCP session, same root): init load_context
              with no sessionId finds that notebook session again, session list names it.
  default     Client(URL) on the notebook with FastMCP's default mode ("auto"): it
              probes server/discover and goes on sessionless (2026-07-28), because
              tether offers it; tools/list; a `thought` whose result names its notebook
              session in _meta["dev.tether/notebookSession"]; a second `thought` that
              sends that back in _meta goes on in the same notebook session.
  gw-session  mode="legacy" on a gateway endpoint whose upstream is the Python SDK
              stdio fixture (/mcp/pystdio): tools/list names greet; greet answers.
  gw-default  the default mode on the same endpoint: sessionless (2026-07-28, tether
              answers server/discover for the session-era upstream); tools/list; greet.

The checks of the notebook's `init` and `session` in the default (sessionless) mode,
and of a ~100 KB export, are in fastmcp_default.py.

Prints one PASS/FAIL line and exits non-zero if the check failed.
"""

from __future__ import annotations

import asyncio
import sys
import traceback
import uuid
from typing import Any

from fastmcp import Client

SESSION_ERA = "2025-11-25"
SESSIONLESS = "2026-07-28"
NOTEBOOK_SESSION_META = "dev.tether/notebookSession"
NOTEBOOK_TOOLS = {"thought", "init", "session"}


class CheckFailed(Exception):
    pass


def check(cond: object, msg: str) -> None:
    if not cond:
        raise CheckFailed(msg)


def thought_args(text: str, n: int, total: int) -> dict[str, Any]:
    return {"thought": text, "thoughtNumber": n, "totalThoughts": total, "nextThoughtNeeded": n < total}


def check_thought(result: Any, n: int, total: int, history: int, label: str) -> None:
    check(not result.is_error, f"{label}: isError: {result.content}")
    sc = result.structured_content
    check(isinstance(sc, dict), f"{label}: no structuredContent: {result!r}")
    want = {"thoughtNumber": n, "totalThoughts": total, "nextThoughtNeeded": n < total,
            "thoughtHistoryLength": history}
    for key, value in want.items():
        check(sc.get(key) == value, f"{label}: structuredContent.{key} is {sc.get(key)!r}, want {value!r} ({sc})")


def text_of(result: Any) -> str:
    return "".join(getattr(block, "text", "") for block in result.content)


async def tool_names(client: Client) -> set[str]:
    return {t.name for t in await client.list_tools()}


async def session_check(url: str) -> str:
    root = f"file:///tmp/interop-fastmcp-{uuid.uuid4().hex[:8]}"
    marker = f"fastmcp session-mode marker {uuid.uuid4().hex[:8]}"
    async with Client(url, mode="legacy", roots=[root], timeout=60) as c:
        check(c.protocol_version == SESSION_ERA, f"protocol_version is {c.protocol_version!r}, want {SESSION_ERA}")
        names = await tool_names(c)
        check(names == NOTEBOOK_TOOLS, f"tools/list names {sorted(names)}, want {sorted(NOTEBOOK_TOOLS)}")
        check_thought(await c.call_tool("thought", thought_args(marker, 1, 1)), 1, 1, 1, "thought")
        roots = (await c.call_tool("init", {"operation": "list_roots"})).structured_content
        check(roots.get("boundRoot") == root, f"init list_roots: boundRoot is {roots.get('boundRoot')!r}, want {root}")
        got = (await c.call_tool("session", {"operation": "get"})).structured_content
        sid = got["session"]["sessionId"]
        check(got["session"].get("mcpRootUri") == root, f"session get: mcpRootUri is {got['session'].get('mcpRootUri')!r}")
        check([t["thought"] for t in got["thoughts"]] == [marker], f"session get: thoughts {got['thoughts']!r}")
        hits = (await c.call_tool("session", {"operation": "search", "query": marker})).structured_content["hits"]
        check(any(h["sessionId"] == sid for h in hits), f"session search found {hits!r}, not {sid}")
        export = text_of(await c.call_tool("session", {"operation": "export"}))
        check(export.startswith("# Session") and marker in export and sid in export,
              f"session export (markdown) does not hold the session and its thought: {export[:300]!r}")
    # A new MCP session of the same project finds that notebook session again.
    async with Client(url, mode="legacy", roots=[root], timeout=60) as c:
        loaded = await c.call_tool("init", {"operation": "load_context"}, raise_on_error=False)
        sc = loaded.structured_content or {}
        check(not loaded.is_error and sc.get("success") is True and sc.get("sessionId") == sid,
              f"init load_context (no sessionId, same root) gave {sc or text_of(loaded)!r}, want session {sid}")
        listed = (await c.call_tool("session", {"operation": "list"})).structured_content["sessions"]
        check(any(s["sessionId"] == sid for s in listed), f"session list does not name {sid}")
    return (f"{SESSION_ERA}; tools {sorted(names)}; thought; root bound; session get/search/export "
            f"({len(export)} B); a new session's init load_context found {sid}")


async def default_check(url: str) -> str:
    async with Client(url, timeout=60) as c:
        check(c.protocol_version == SESSIONLESS,
              f"the default mode negotiated {c.protocol_version!r}, want {SESSIONLESS} (tether offers it)")
        names = await tool_names(c)
        check(names == NOTEBOOK_TOOLS, f"tools/list names {sorted(names)}, want {sorted(NOTEBOOK_TOOLS)}")
        first = await c.call_tool("thought", thought_args("FastMCP default mode, step 1", 1, 2))
        check_thought(first, 1, 2, 1, "thought 1")
        sid = (first.meta or {}).get(NOTEBOOK_SESSION_META)
        check(isinstance(sid, str) and sid, f"thought 1: no _meta[{NOTEBOOK_SESSION_META!r}]: {first.meta!r}")
        second = await c.call_tool("thought", thought_args("FastMCP default mode, step 2", 2, 2),
                                   meta={NOTEBOOK_SESSION_META: sid})
        check_thought(second, 2, 2, 2, "thought 2 (with the notebook session in _meta)")
        check((second.meta or {}).get(NOTEBOOK_SESSION_META) == sid, f"thought 2 went on in {second.meta!r}, not {sid}")
    return f"{SESSIONLESS}; tools {sorted(names)}; two thoughts in notebook session {sid}"


async def gateway_check(url: str, mode: str | None, want_version: str) -> str:
    kwargs: dict[str, Any] = {"timeout": 60}
    if mode:
        kwargs["mode"] = mode
    async with Client(url, **kwargs) as c:
        check(c.protocol_version == want_version, f"protocol_version is {c.protocol_version!r}, want {want_version}")
        names = await tool_names(c)
        check("greet" in names, f"tools/list does not name greet: {sorted(names)}")
        result = await c.call_tool("greet", {"name": "tether"})
        text = text_of(result)
        check(not result.is_error and text == "Hello, tether! (from py-stdio-fixture)", f"greet answered {text!r}")
    return f"{want_version}; {len(names)} tools; greet: {text!r}"


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    url, name = argv[1], argv[2]
    runs = {
        "session": lambda: session_check(url),
        "default": lambda: default_check(url),
        "gw-session": lambda: gateway_check(url, "legacy", SESSION_ERA),
        "gw-default": lambda: gateway_check(url, None, SESSIONLESS),
    }
    if name not in runs:
        print(f"unknown check {name!r}", file=sys.stderr)
        return 2
    try:
        detail = asyncio.run(runs[name]())
    except CheckFailed as e:
        print(f"FAIL fastmcp:{name}: {e}")
        return 1
    except Exception as e:  # noqa: BLE001
        print(f"FAIL fastmcp:{name}: {type(e).__name__}: {e}\n{traceback.format_exc()}")
        return 1
    print(f"PASS fastmcp:{name}: {detail}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
