#!/usr/bin/env python3
"""Interop checks: the whole notebook for FastMCP's ``Client`` in its default mode.

FastMCP's default mode ("auto") negotiates the sessionless revision (2026-07-28)
because tether offers it, and declares no extension (no Tasks). These checks ask
of the notebook what a user of that client relies on: every tool works, and a
large result comes back whole. interop/run.sh runs them only with
INTEROP_SESSIONLESS_NOTEBOOK=1.

usage: fastmcp_default.py URL CHECK

  init         Client(URL, roots=[ROOT]): init list_roots names ROOT; init start_new
               (title) answers its notebook session; a `thought` goes on in it; a second
               Client with the same root: init load_context with no sessionId finds it,
               init list_sessions (rootUri) names it.
  session      session list, get (sessionId), search (query) and export (markdown) of a
               notebook session of two thoughts, each answered inline (no -32021, no task:
               the client declared no Tasks extension).
  init-no-root Client(URL) with no roots: init load_context with nothing to go by ends
               with an error that says what to pass (sessionId or a root), not
               "send initialize first".
  export-100k-default
               a notebook session of 26 thoughts of 4,000 characters (~104 KB) written
               in the default mode; session export answers it whole (every thought, no
               _meta.nextResumeToken), not cut at 64 KiB.
  export-100k-session
               the same with mode="legacy" (the session era).

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
BIG_THOUGHTS = 26
BIG_THOUGHT_CHARS = 4000


class CheckFailed(Exception):
    pass


def check(cond: object, msg: str) -> None:
    if not cond:
        raise CheckFailed(msg)


def thought_args(text: str, n: int, total: int) -> dict[str, Any]:
    return {"thought": text, "thoughtNumber": n, "totalThoughts": total, "nextThoughtNeeded": n < total}


def text_of(result: Any) -> str:
    return "".join(getattr(block, "text", "") for block in result.content)


async def call(c: Client, tool: str, args: dict[str, Any], **kw: Any) -> Any:
    """A call that must succeed inline: an MCPError (e.g. -32021) or isError fails the check."""
    try:
        result = await c.call_tool(tool, args, raise_on_error=False, **kw)
    except Exception as e:  # noqa: BLE001
        raise CheckFailed(f"{tool} {args}: {type(e).__name__}: {e}") from e
    check(not result.is_error, f"{tool} {args}: isError: {text_of(result)[:500]}")
    return result


def sessionless(c: Client) -> None:
    check(c.protocol_version == SESSIONLESS,
          f"the default mode negotiated {c.protocol_version!r}, want {SESSIONLESS} (tether offers it)")


async def init_check(url: str) -> str:
    root = f"file:///tmp/interop-fastmcp-default-{uuid.uuid4().hex[:8]}"
    title = f"FastMCP default mode {uuid.uuid4().hex[:8]}"
    async with Client(url, roots=[root], timeout=60) as c:
        sessionless(c)
        roots = (await call(c, "init", {"operation": "list_roots"})).structured_content or {}
        uris = [r.get("uri") for r in roots.get("roots", [])]
        check(root in uris, f"init list_roots names {uris}, not {root} ({roots})")
        started = await call(c, "init", {"operation": "start_new", "title": title})
        sc = started.structured_content or {}
        sid = sc.get("sessionId") or (started.meta or {}).get(NOTEBOOK_SESSION_META)
        check(isinstance(sid, str) and sid, f"init start_new names no notebook session: {sc or text_of(started)!r}")
        thought = await call(c, "thought", thought_args("after start_new", 1, 1), meta={NOTEBOOK_SESSION_META: sid})
        check((thought.meta or {}).get(NOTEBOOK_SESSION_META) == sid,
              f"the thought went on in {thought.meta!r}, not the new session {sid}")
    async with Client(url, roots=[root], timeout=60) as c:
        sessionless(c)
        loaded = await call(c, "init", {"operation": "load_context"})
        sc = loaded.structured_content or {}
        check(sc.get("success") is True and sc.get("sessionId") == sid,
              f"init load_context (no sessionId, same root) gave {sc or text_of(loaded)!r}, want {sid}")
        listed = (await call(c, "init", {"operation": "list_sessions", "rootUri": root})).structured_content or {}
        ids = [s.get("sessionId") for s in listed.get("sessions", [])]
        check(sid in ids, f"init list_sessions rootUri={root} names {ids}, not {sid}")
    return f"{SESSIONLESS}; list_roots, start_new ({sid}), thought, load_context and list_sessions by root"


async def session_check(url: str) -> str:
    marker = f"fastmcp default session marker {uuid.uuid4().hex[:8]}"
    async with Client(url, timeout=60) as c:
        sessionless(c)
        first = await call(c, "thought", thought_args(marker, 1, 2))
        sid = (first.meta or {}).get(NOTEBOOK_SESSION_META)
        check(isinstance(sid, str) and sid, f"thought: no _meta[{NOTEBOOK_SESSION_META!r}]: {first.meta!r}")
        await call(c, "thought", thought_args("second step", 2, 2), meta={NOTEBOOK_SESSION_META: sid})
        listed = (await call(c, "session", {"operation": "list"})).structured_content or {}
        check(any(s.get("sessionId") == sid for s in listed.get("sessions", [])), f"session list does not name {sid}")
        got = (await call(c, "session", {"operation": "get", "sessionId": sid})).structured_content or {}
        thoughts = [t.get("thought") for t in got.get("thoughts", [])]
        check(thoughts == [marker, "second step"], f"session get {sid}: thoughts {thoughts!r}")
        hits = (await call(c, "session", {"operation": "search", "query": marker})).structured_content or {}
        check(any(h.get("sessionId") == sid for h in hits.get("hits", [])), f"session search found {hits!r}")
        export = text_of(await call(c, "session", {"operation": "export", "sessionId": sid}))
        check(marker in export and "second step" in export, f"session export: {export[:300]!r}")
    return f"{SESSIONLESS}; session list/get/search/export of {sid} answered inline"


async def init_no_root_check(url: str) -> str:
    async with Client(url, timeout=60) as c:
        sessionless(c)
        try:
            result = await c.call_tool("init", {"operation": "load_context"}, raise_on_error=False)
            failed, message = result.is_error, text_of(result)
        except Exception as e:  # noqa: BLE001  (an MCPError is an answer too, if it says what to do)
            failed, message = True, str(e)
    check(failed, f"init load_context with no root and no sessionId succeeded: {message[:300]!r}")
    check("initialize" not in message, f"the error asks for initialize, which this client cannot send: {message!r}")
    check("sessionId" in message or "root" in message, f"the error does not say what to pass: {message!r}")
    return f"the error says what to pass: {message[:160]!r}"


def big_thought(i: int) -> str:
    head = f"big thought {i:02d} "
    return head + "x" * (BIG_THOUGHT_CHARS - len(head))


async def export_100k_check(url: str, mode: str | None) -> str:
    kwargs: dict[str, Any] = {"timeout": 120}
    if mode:
        kwargs["mode"] = mode
    async with Client(url, **kwargs) as c:
        check(c.protocol_version == (SESSION_ERA if mode == "legacy" else SESSIONLESS),
              f"negotiated {c.protocol_version!r}")
        sid = None
        for i in range(1, BIG_THOUGHTS + 1):
            meta = {NOTEBOOK_SESSION_META: sid} if sid and mode != "legacy" else None
            r = await call(c, "thought", thought_args(big_thought(i), i, BIG_THOUGHTS), meta=meta)
            check((r.structured_content or {}).get("thoughtHistoryLength") == i,
                  f"thought {i}: thoughtHistoryLength {(r.structured_content or {}).get('thoughtHistoryLength')}")
            sid = sid or (r.meta or {}).get(NOTEBOOK_SESSION_META)
        if sid is None:  # the session era: the current notebook session
            sid = (await call(c, "session", {"operation": "get"})).structured_content["session"]["sessionId"]
        result = await call(c, "session", {"operation": "export", "sessionId": sid})
        export = text_of(result)
        token = (result.meta or {}).get("nextResumeToken")
    size = len(export.encode())
    check(token is None, f"the export came with _meta.nextResumeToken after {size} bytes: paged, not whole")
    missing = [i for i in range(1, BIG_THOUGHTS + 1) if big_thought(i) not in export]
    check(not missing, f"the export ({size} bytes) lacks thoughts {missing} (cut?)")
    check(size >= BIG_THOUGHTS * BIG_THOUGHT_CHARS, f"the export is {size} bytes")
    return f"{c.protocol_version}; export of {BIG_THOUGHTS} thoughts whole: {size} bytes"


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    url, name = argv[1], argv[2]
    runs = {
        "init": lambda: init_check(url),
        "session": lambda: session_check(url),
        "init-no-root": lambda: init_no_root_check(url),
        "export-100k-default": lambda: export_100k_check(url, None),
        "export-100k-session": lambda: export_100k_check(url, "legacy"),
    }
    if name not in runs:
        print(f"unknown check {name!r}", file=sys.stderr)
        return 2
    try:
        detail = asyncio.run(runs[name]())
    except CheckFailed as e:
        print(f"FAIL fastmcp-default:{name}: {e}")
        return 1
    except Exception as e:  # noqa: BLE001
        print(f"FAIL fastmcp-default:{name}: {type(e).__name__}: {e}\n{traceback.format_exc()}")
        return 1
    print(f"PASS fastmcp-default:{name}: {detail}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
