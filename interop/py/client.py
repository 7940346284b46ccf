#!/usr/bin/env python3
"""Interop checks: the official MCP Python SDK client (``mcp`` 2.x) against tether.

usage: client.py URL [CHECK ...]
       CHECK: legacy | auto | auto-notebook | modern | roots-modern | gw-auto | gw-roots-modern
              | gw-legacy-to-modern | no-header | roots
       (default: legacy auto auto-notebook modern no-header roots roots-modern)

  legacy     Client(..., mode="legacy"): initialize handshake, tools/list, tools/call thought.
  auto       Client(...) with the default mode="auto": the SDK probes server/discover
             (protocol 2026-07-28), tether answers it, and the SDK goes on sessionless:
             no initialize, no session, no DELETE; tools/list, tools/call thought, whose
             result names the notebook session in _meta.
  auto-notebook  the whole notebook for Client(...) in that default mode (sessionless):
             init start_new with an explicit root (a file:// URI), 100 thoughts of 1,100
             characters in that notebook session (named in _meta), session list, get,
             search and export; the export is one text block of over 100,000 bytes with
             the first and the last thought and no _meta.nextResumeToken (whole, not
             paged); a second Client's init load_context with the same root finds that
             notebook session. No initialize, GET or DELETE in its HTTP log.
  modern     Client(..., mode="2026-07-28"): the same, without the probe's choice.
  roots-modern  Client(..., mode="2026-07-28", list_roots_callback=...): a sessionless
             thought without a notebook session makes tether ask roots/list through an
             input_required round (MRTR), answered by the SDK with the same callback;
             a second Client with the same root goes on in the same notebook session.
  gw-auto    mode="auto" against a gateway endpoint whose upstream is a session-era
             stdio server (the Python SDK fixture): tether answers server/discover for
             it and the SDK goes on sessionless; tools/list, tools/call greet.
  gw-roots-modern  mode="2026-07-28" with list_roots_callback through the same gateway
             endpoint: the upstream's own roots/list, in the middle of its tool call,
             reaches the SDK as an input_required round (MRTR); the SDK answers with its
             callback and the upstream's result names the root.
  gw-legacy-to-modern  mode="legacy" through a gateway endpoint whose upstream speaks
             only 2026-07-28 (the Python SDK fixture, modern-only): initialize answered by
             tether from the upstream's server/discover, tools/list, tools/call add, slow
             and fail (a tool error stays one). (The fixture answers JSON, so no progress.)
  no-header  Plain HTTP (urllib, no SDK): after initialize, follow-up POSTs that carry
             no MCP-Protocol-Version header (assumed 2025-03-26) work.
  roots      Client(..., list_roots_callback=...): the notebook asks roots/list, binds the
             one root; init start_new stores it; a second Client (a new MCP session)
             recovers that notebook session with init load_context and no sessionId.

Prints one PASS/FAIL line per check and exits non-zero if any failed.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
import urllib.error
import urllib.request
import uuid
from typing import Any

import anyio
import httpx2
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client

SUPPORTED_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26")
MODERN_VERSION = "2026-07-28"
NOTEBOOK_SESSION_META = "dev.tether/notebookSession"
THOUGHT_ARGS: dict[str, Any] = {
    "thought": "Interop check from the Python SDK",
    "thoughtNumber": 1,
    "totalThoughts": 2,
    "nextThoughtNeeded": True,
}
TIMEOUT_S = 60
# auto-notebook: 100 thoughts of 1,100 characters, so that the export is over 100 KB
NOTEBOOK_THOUGHTS = 100
NOTEBOOK_THOUGHT_CHARS = 1100
NOTEBOOK_TIMEOUT_S = 120


class CheckFailed(Exception):
    pass


def check(cond: object, msg: str) -> None:
    if not cond:
        raise CheckFailed(msg)


def check_structured(sc: Any, text: str | None, args: dict[str, Any], label: str) -> None:
    """Assert the shape of a `thought` result (structuredContent + its text twin)."""
    check(isinstance(sc, dict), f"{label}: structuredContent is not an object: {sc!r}")
    for key in ("thoughtNumber", "totalThoughts", "nextThoughtNeeded"):
        check(sc.get(key) == args[key] and type(sc.get(key)) is type(args[key]),
              f"{label}: structuredContent.{key} is {sc.get(key)!r}, want {args[key]!r}")
    check(isinstance(sc.get("branches"), list), f"{label}: structuredContent.branches is not a list: {sc!r}")
    thl = sc.get("thoughtHistoryLength")
    check(isinstance(thl, int) and not isinstance(thl, bool) and thl >= 1,
          f"{label}: structuredContent.thoughtHistoryLength is not an int >= 1: {sc!r}")
    check(text is not None, f"{label}: result has no text content")
    try:
        parsed = json.loads(text)  # type: ignore[arg-type]
    except ValueError as e:
        raise CheckFailed(f"{label}: text content is not JSON ({e}): {text!r}") from None
    check(parsed == sc, f"{label}: text content {parsed!r} differs from structuredContent {sc!r}")


# --------------------------------------------------------------------------- SDK checks

class HttpLog:
    """httpx2 event hooks recording each request's method, headers, JSON-RPC method and status."""

    def __init__(self) -> None:
        self.entries: list[dict[str, Any]] = []

    async def on_request(self, request: httpx2.Request) -> None:
        rpc = None
        try:
            body = json.loads(request.content) if request.content else None
            if isinstance(body, dict):
                rpc = body.get("method") or "response"
        except (ValueError, httpx2.RequestNotRead):  # pragma: no cover
            pass
        self.entries.append({
            "request": request,
            "method": request.method,
            "rpc": rpc,
            "version": request.headers.get("mcp-protocol-version"),
            "status": None,
            "content_type": None,
        })

    async def on_response(self, response: httpx2.Response) -> None:
        for e in reversed(self.entries):
            if e["request"] is response.request:
                e["status"] = response.status_code
                e["content_type"] = response.headers.get("content-type")
                break

    def client(self) -> httpx2.AsyncClient:
        """An HTTP client whose requests and responses this log records."""
        return httpx2.AsyncClient(
            timeout=httpx2.Timeout(30, read=TIMEOUT_S),
            trust_env=False,
            event_hooks={"request": [self.on_request], "response": [self.on_response]},
        )

    def render(self) -> str:
        return "\n".join(
            f"  {e['method']} {e['rpc'] or ''} mcp-protocol-version={e['version'] or '(none)'}"
            f" -> {e['status']} {e['content_type'] or ''}"
            for e in self.entries
        )


async def sdk_check(url: str, mode: str, expect: str) -> str:
    """One SDK client session; `expect` is the era it must end up in ("legacy" | "modern")."""
    log = HttpLog()
    http = log.client()
    try:
        with anyio.fail_after(TIMEOUT_S):
            async with http:
                transport = streamable_http_client(url, http_client=http)
                # mode="auto" is the SDK default: leave it unset to exercise the default.
                client = Client(transport) if mode == "auto" else Client(transport, mode=mode)
                check(client.mode == mode, f"Client.mode is {client.mode!r}, want {mode!r}")
                async with client:
                    version = client.protocol_version
                    wanted = (MODERN_VERSION,) if expect == "modern" else SUPPORTED_VERSIONS
                    check(version in wanted, f"negotiated protocol version {version!r}, want one of {wanted}")
                    tools = await client.list_tools()
                    names = [t.name for t in tools.tools]
                    check(names, "the tool list is empty")
                    if "thought" in names:
                        result = await client.call_tool("thought", THOUGHT_ARGS)
                        check(not result.is_error, f"tools/call thought returned is_error: {result!r}")
                        text = next((c.text for c in result.content if getattr(c, "type", None) == "text"), None)
                        check_structured(result.structured_content, text, THOUGHT_ARGS, "tools/call thought")
                        if expect == "modern":
                            pinned = (result.meta or {}).get(NOTEBOOK_SESSION_META)
                            check(isinstance(pinned, str) and pinned,
                                  f"a sessionless thought's result does not name its notebook session: {result.meta!r}")
                    else:
                        check("greet" in names, f"the fallback endpoint has no greet tool: {names}")
                        result = await client.call_tool("greet", {"name": "interop"})
                        check(not result.is_error, f"tools/call greet returned is_error: {result!r}")
                # leaving the Client sends DELETE (terminate_on_close=True)
    except CheckFailed as e:
        raise CheckFailed(f"{e}\nHTTP log:\n{log.render()}") from None
    except BaseException as e:
        raise CheckFailed(
            f"{type(e).__name__}: {e}\n{traceback.format_exc()}\nHTTP log:\n{log.render()}"
        ) from None

    posts = [e for e in log.entries if e["method"] == "POST"]
    rpcs = [e["rpc"] for e in posts]
    try:
        if expect == "modern":
            if mode == "auto":
                check(rpcs and rpcs[0] == "server/discover" and posts[0]["status"] == 200,
                      f"mode='auto' did not probe server/discover first with a 200 answer: {rpcs}")
            check("initialize" not in rpcs, f"a sessionless client sent initialize: {rpcs}")
            call = next((e for e in posts if e["rpc"] == "tools/call"), None)
            check(call is not None and call["status"] == 200, "tools/call POST missing or not 200")
            check(call["version"] == MODERN_VERSION,
                  f"tools/call carried mcp-protocol-version={call['version']}, want {MODERN_VERSION}")
            check(not [e for e in log.entries if e["method"] in ("GET", "DELETE")],
                  f"a sessionless client opened a GET stream or sent DELETE:\n{log.render()}")
            return f"protocol={version} requests={rpcs} (sessionless)"
        if mode == "auto":
            check(rpcs and rpcs[0] == "server/discover",
                  f"mode='auto' did not probe server/discover first: {rpcs}")
            probe = posts[0]
            check("initialize" in rpcs[1:], f"mode='auto' did not fall back to initialize: {rpcs}")
            fallback = f"server/discover -> HTTP {probe['status']} {probe['content_type'] or ''}".strip()
        else:
            check("server/discover" not in rpcs, f"mode='legacy' sent server/discover: {rpcs}")
            check(rpcs and rpcs[0] == "initialize", f"mode='legacy' did not start with initialize: {rpcs}")
            fallback = None
        init = next(e for e in posts if e["rpc"] == "initialize")
        check(init["status"] == 200, f"initialize answered HTTP {init['status']}")
        call = next((e for e in posts if e["rpc"] == "tools/call"), None)
        check(call is not None and call["status"] == 200, "tools/call POST missing or not 200")
        check(call["version"] == version,
              f"tools/call carried mcp-protocol-version={call['version']}, want {version}")
        dele = [e for e in log.entries if e["method"] == "DELETE"]
        check(len(dele) == 1 and dele[0]["status"] in (200, 202, 204),
              f"session DELETE on close: {[(e['status']) for e in dele]}")
    except CheckFailed as e:
        raise CheckFailed(f"{e}\nHTTP log:\n{log.render()}") from None
    detail = f"protocol={version} requests={rpcs}"
    if fallback:
        detail += f" ({fallback}, then initialize)"
    return detail


def first_check_failed(e: BaseException) -> CheckFailed | None:
    """The CheckFailed in e, or in the exception groups e wraps it in."""
    if isinstance(e, CheckFailed):
        return e
    for inner in getattr(e, "exceptions", ()):
        found = first_check_failed(inner)
        if found:
            return found
    return None


def notebook_thought(run: str, i: int) -> str:
    """Thought i of an auto-notebook run: unique to the run, NOTEBOOK_THOUGHT_CHARS long."""
    head = f"py auto notebook {run} thought {i:03d} "
    return head + "y" * (NOTEBOOK_THOUGHT_CHARS - len(head))


async def auto_notebook_check(url: str) -> str:
    """The whole notebook for the SDK's default mode (sessionless): every tool, a large export whole."""
    run = uuid.uuid4().hex[:8]
    root = f"file:///tmp/interop-py-auto-{run}"
    title = f"python sdk default mode {run}"
    first, last = notebook_thought(run, 1), notebook_thought(run, NOTEBOOK_THOUGHTS)

    async def call(client: Client, tool: str, args: dict[str, Any], meta: dict[str, Any] | None = None) -> Any:
        result = await client.call_tool(tool, args, meta=meta)
        text = "".join(getattr(c, "text", "") for c in result.content)
        label = {k: (v if len(str(v)) < 80 else f"{str(v)[:40]}...") for k, v in args.items()}
        check(not result.is_error, f"{tool} {label}: isError: {text[:500]!r}")
        return result

    log = HttpLog()
    started_at = time.monotonic()
    try:
        with anyio.fail_after(NOTEBOOK_TIMEOUT_S):
            async with log.client() as http:
                client = Client(streamable_http_client(url, http_client=http))  # the default mode
                check(client.mode == "auto", f"Client.mode is {client.mode!r}, want the default 'auto'")
                async with client:
                    check(client.protocol_version == MODERN_VERSION,
                          f"the default mode negotiated {client.protocol_version!r}, want {MODERN_VERSION}")
                    names = {t.name for t in (await client.list_tools()).tools}
                    check({"init", "thought", "session"} <= names, f"tools/list lacks a notebook tool: {names}")

                    started = await call(client, "init", {"operation": "start_new", "root": root, "title": title})
                    sc = started.structured_content or {}
                    sid = sc.get("sessionId")
                    check(isinstance(sid, str) and sid and sc.get("success") is True,
                          f"init start_new names no notebook session: {sc!r}")
                    check(sc.get("mcpRootUri") == root, f"init start_new bound {sc.get('mcpRootUri')!r}, not {root}")
                    check((started.meta or {}).get(NOTEBOOK_SESSION_META) == sid,
                          f"init start_new's _meta does not name {sid}: {started.meta!r}")

                    pin = {NOTEBOOK_SESSION_META: sid}
                    thoughts_at = time.monotonic()
                    for i in range(1, NOTEBOOK_THOUGHTS + 1):
                        args = {"thought": notebook_thought(run, i), "thoughtNumber": i,
                                "totalThoughts": NOTEBOOK_THOUGHTS, "nextThoughtNeeded": i < NOTEBOOK_THOUGHTS}
                        r = await call(client, "thought", args, meta=pin)
                        check((r.meta or {}).get(NOTEBOOK_SESSION_META) == sid,
                              f"thought {i} went on in {r.meta!r}, not {sid}")
                        length = (r.structured_content or {}).get("thoughtHistoryLength")
                        check(length == i, f"thought {i}: thoughtHistoryLength {length}")
                    thoughts_s = time.monotonic() - thoughts_at

                    listed = (await call(client, "session", {"operation": "list"})).structured_content or {}
                    mine = [s for s in listed.get("sessions", []) if s.get("sessionId") == sid]
                    check(mine and mine[0].get("thoughtCount") == NOTEBOOK_THOUGHTS and mine[0].get("mcpRootUri") == root,
                          f"session list: {sid} missing or wrong: {mine!r}")

                    got = (await call(client, "session", {"operation": "get", "sessionId": sid})).structured_content or {}
                    texts = [t.get("thought") for t in got.get("thoughts", [])]
                    check(len(texts) == NOTEBOOK_THOUGHTS and texts[0] == first and texts[-1] == last,
                          f"session get {sid}: {len(texts)} thoughts, want {NOTEBOOK_THOUGHTS} from the first to the last")

                    query = f"{run} thought {NOTEBOOK_THOUGHTS:03d}"
                    hits = (await call(client, "session", {"operation": "search", "query": query})).structured_content or {}
                    found = [(h.get("sessionId"), h.get("thoughtNumber")) for h in hits.get("hits", [])]
                    check(found == [(sid, NOTEBOOK_THOUGHTS)], f"session search {query!r} found {found}")

                    exported = await call(client, "session", {"operation": "export", "sessionId": sid})
                    blocks = [(getattr(c, "type", None), len(getattr(c, "text", "") or "")) for c in exported.content]
                    check(len(blocks) == 1 and blocks[0][0] == "text", f"session export: content blocks {blocks}, want one text block")
                    export = exported.content[0].text
                    size = len(export.encode())
                    token = (exported.meta or {}).get("nextResumeToken")
                    check(token is None, f"session export came with _meta.nextResumeToken after {size} bytes: paged, not whole")
                    check(size > 100_000, f"session export is {size} bytes, want > 100,000")
                    check(first in export and last in export,
                          f"session export ({size} bytes) lacks the first or the last thought (cut?)")

            async with log.client() as http:
                async with Client(streamable_http_client(url, http_client=http)) as again:
                    loaded = await call(again, "init", {"operation": "load_context", "root": root})
                    sc = loaded.structured_content or {}
                    check(sc.get("success") is True and sc.get("sessionId") == sid
                          and sc.get("thoughtCount") == NOTEBOOK_THOUGHTS,
                          f"a second Client's init load_context (root {root}) gave {sc!r}, want {sid}")
                    check((loaded.meta or {}).get(NOTEBOOK_SESSION_META) == sid,
                          f"init load_context's _meta does not name {sid}: {loaded.meta!r}")
        rpcs = [e["rpc"] for e in log.entries if e["method"] == "POST"]
        check("initialize" not in rpcs, f"a sessionless client sent initialize: {rpcs[:5]}")
        check(not [e for e in log.entries if e["method"] in ("GET", "DELETE")],
              "a sessionless client opened a GET stream or sent DELETE")
        bad = [(e["rpc"], e["status"]) for e in log.entries if e["status"] != 200]
        check(not bad, f"POSTs not answered 200: {bad}")
    except BaseException as e:  # a CheckFailed inside `async with Client` comes wrapped in an ExceptionGroup
        tail = "\n".join(log.render().splitlines()[-12:])
        failed = first_check_failed(e)
        what = str(failed) if failed else f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
        raise CheckFailed(f"{what}\nHTTP log (last 12 requests):\n{tail}") from None
    total_s = time.monotonic() - started_at
    return (f"protocol={MODERN_VERSION} (sessionless); init start_new {sid} (root {root}), "
            f"{NOTEBOOK_THOUGHTS} thoughts of {NOTEBOOK_THOUGHT_CHARS} chars in {thoughts_s:.1f}s, session list/get/search, "
            f"export whole: one text block of {size} bytes with the first and last thought, no nextResumeToken; "
            f"a second Client's init load_context by root found {sid}; {len(rpcs)} POSTs in {total_s:.1f}s")


async def roots_check(url: str) -> str:
    from mcp import types

    root = "file:///interop/python-project"
    asked = 0

    async def list_roots(context: Any) -> Any:
        nonlocal asked
        asked += 1
        return types.ListRootsResult(roots=[types.Root(uri=root, name="python-project")])

    async def one_session(operation: dict[str, Any]) -> dict[str, Any]:
        http = httpx2.AsyncClient(timeout=httpx2.Timeout(30, read=TIMEOUT_S), trust_env=False)
        with anyio.fail_after(TIMEOUT_S):
            async with http:
                transport = streamable_http_client(url, http_client=http)
                async with Client(transport, mode="legacy", list_roots_callback=list_roots) as client:
                    result = await client.call_tool("init", operation)
                    check(not result.is_error, f"init {operation}: is_error: {result!r}")
                    return result.structured_content or {}

    started = await one_session({"operation": "start_new", "title": "python interop"})
    check(started.get("mcpRootUri") == root, f"start_new did not bind the client's root: {started!r}")
    loaded = await one_session({"operation": "load_context"})
    check(loaded.get("success") is True, f"load_context without sessionId failed: {loaded!r}")
    check(loaded.get("sessionId") == started.get("sessionId"),
          f"load_context recovered {loaded.get('sessionId')!r}, want {started.get('sessionId')!r}")
    check(asked >= 2, f"the server asked roots/list {asked} times, want one per MCP session")
    return f"roots/list answered {asked}x; recovered {loaded.get('sessionId')}: {loaded.get('message')}"


# --------------------------------------------------------------------------- plain HTTP check

class PlainResponse:
    def __init__(self, status: int, headers: Any, events: list[dict[str, Any]], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.events = events
        self.body = body


def read_sse_until_response(resp: Any, request_id: Any) -> list[dict[str, Any]]:
    """Read SSE events until the JSON-RPC response with `request_id` has arrived."""
    events: list[dict[str, Any]] = []
    cur: dict[str, Any] = {"data": []}
    while True:
        raw = resp.readline()
        if not raw:
            break
        line = raw.decode("utf-8").rstrip("\r\n")
        if line == "":
            if cur["data"] or "id" in cur or "retry" in cur or "event" in cur:
                ev = dict(cur, data="\n".join(cur["data"]))
                events.append(ev)
                if ev["data"]:
                    msg = json.loads(ev["data"])
                    if isinstance(msg, dict) and msg.get("id") == request_id and ("result" in msg or "error" in msg):
                        break
            cur = {"data": []}
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if field == "data":
            cur["data"].append(value)
        elif field in ("id", "event", "retry"):
            cur[field] = value
    return events


def plain_post(url: str, message: dict[str, Any], session: str | None = None,
               version: str | None = None) -> PlainResponse:
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    if session:
        headers["Mcp-Session-Id"] = session
    if version:
        headers["MCP-Protocol-Version"] = version
    req = urllib.request.Request(url, data=json.dumps(message).encode(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            ctype = resp.headers.get("Content-Type", "")
            if "id" in message and ctype.startswith("text/event-stream"):
                return PlainResponse(resp.status, resp.headers, read_sse_until_response(resp, message["id"]), b"")
            return PlainResponse(resp.status, resp.headers, [], resp.read())
    except urllib.error.HTTPError as e:
        return PlainResponse(e.code, e.headers, [], e.read())


def rpc_result(r: PlainResponse, request_id: int, label: str) -> dict[str, Any]:
    """The JSON-RPC result for request_id from an SSE or JSON answer."""
    check(r.status == 200, f"{label}: HTTP {r.status}: {r.body[:500]!r}")
    if r.events:
        # (Whether a priming event leads the stream is not asserted here: a server may
        # skip it for 2025-03-26 clients, which is what a header-less request means.)
        msgs = [json.loads(ev["data"]) for ev in r.events if ev["data"]]
    else:
        msgs = [json.loads(r.body)]
    resp = next((m for m in msgs if isinstance(m, dict) and m.get("id") == request_id), None)
    check(resp is not None, f"{label}: no JSON-RPC response with id {request_id}: {msgs!r}")
    check("result" in resp, f"{label}: JSON-RPC error: {resp.get('error')!r}")
    return resp["result"]


def no_header_check(url: str) -> str:
    # initialize (as the TS SDK does: offers 2025-11-25; no MCP-Protocol-Version on initialize)
    r = plain_post(url, {
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                   "clientInfo": {"name": "tether-interop-plain", "version": "0.0.0"}},
    })
    init = rpc_result(r, 1, "initialize")
    session = r.headers.get("Mcp-Session-Id")
    check(session, "initialize: no Mcp-Session-Id header")
    negotiated = init.get("protocolVersion")
    check(negotiated in SUPPORTED_VERSIONS, f"initialize: odd protocolVersion {negotiated!r}")

    # notifications/initialized, no MCP-Protocol-Version
    r = plain_post(url, {"jsonrpc": "2.0", "method": "notifications/initialized"}, session=session)
    check(r.status == 202, f"notifications/initialized without MCP-Protocol-Version: HTTP {r.status} {r.body[:300]!r}")

    # tools/list, no MCP-Protocol-Version
    r = plain_post(url, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, session=session)
    tools = rpc_result(r, 2, "tools/list without MCP-Protocol-Version")
    names = [t.get("name") for t in tools.get("tools", [])]
    check("thought" in names, f"tools/list without MCP-Protocol-Version lacks 'thought': {names}")

    # tools/call thought, no MCP-Protocol-Version
    args = dict(THOUGHT_ARGS, thought="Interop check: no MCP-Protocol-Version header")
    r = plain_post(url, {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                         "params": {"name": "thought", "arguments": args}}, session=session)
    res = rpc_result(r, 3, "tools/call without MCP-Protocol-Version")
    call_sse = bool(r.events)
    primed = call_sse and bool(r.events[0].get("id")) and not r.events[0]["data"]
    check(not res.get("isError"), f"tools/call without MCP-Protocol-Version: isError: {res!r}")
    text = next((c.get("text") for c in res.get("content", []) if c.get("type") == "text"), None)
    check_structured(res.get("structuredContent"), text, args, "tools/call without MCP-Protocol-Version")

    # clean up: DELETE, then the session is gone (404)
    req = urllib.request.Request(url, headers={"Mcp-Session-Id": session}, method="DELETE")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            del_status = resp.status
    except urllib.error.HTTPError as e:
        del_status = e.code
    check(200 <= del_status < 300, f"DELETE session: HTTP {del_status}")
    r = plain_post(url, {"jsonrpc": "2.0", "id": 4, "method": "tools/list"}, session=session)
    check(r.status == 404, f"tools/list on a deleted session: HTTP {r.status}, want 404")
    return (f"negotiated={negotiated}; initialized/tools/list/tools/call without the header -> 202/200/200"
            f" (tools/call answered as {'SSE' if call_sse else 'JSON'}"
            f"{', with priming event' if primed else ', no priming event' if call_sse else ''})")


async def roots_modern_check(url: str) -> str:
    from mcp import types

    root = "file:///interop/python-modern-project"
    asked = 0

    async def list_roots(context: Any) -> Any:
        nonlocal asked
        asked += 1
        return types.ListRootsResult(roots=[types.Root(uri=root, name="python-modern-project")])

    sessions = []
    for n in (1, 2):
        args = dict(THOUGHT_ARGS, thoughtNumber=n)
        http = httpx2.AsyncClient(timeout=httpx2.Timeout(30, read=TIMEOUT_S), trust_env=False)
        with anyio.fail_after(TIMEOUT_S):
            async with http:
                transport = streamable_http_client(url, http_client=http)
                async with Client(transport, mode=MODERN_VERSION, list_roots_callback=list_roots) as client:
                    result = await client.call_tool("thought", args)
                    check(not result.is_error, f"thought {n}: is_error: {result!r}")
                    sc = result.structured_content or {}
                    sessions.append(((result.meta or {}).get(NOTEBOOK_SESSION_META), sc.get("thoughtHistoryLength")))
    check(asked == 2, f"the SDK's roots callback ran {asked} times, want once per sessionless call")
    check(sessions[0][0] and sessions[0][0] == sessions[1][0],
          f"the second client did not find the first one's notebook session by its root: {sessions}")
    check(sessions[1][1] == sessions[0][1] + 1, f"thoughtHistoryLength did not go on: {sessions}")
    return f"roots asked {asked} times through input_required; notebook session {sessions[0][0]} found again by root"


async def gw_roots_modern_check(url: str) -> str:
    from mcp import types

    root = "file:///interop/gateway-modern-project"
    asked = 0

    async def list_roots(context: Any) -> Any:
        nonlocal asked
        asked += 1
        return types.ListRootsResult(roots=[types.Root(uri=root, name="gateway-modern-project")])

    log = HttpLog()
    http = log.client()
    with anyio.fail_after(TIMEOUT_S):
        async with http:
            transport = streamable_http_client(url, http_client=http)
            async with Client(transport, mode=MODERN_VERSION, list_roots_callback=list_roots) as client:
                result = await client.call_tool("roots", {})
    check(not result.is_error, f"tools/call roots: is_error: {result!r}\nHTTP log:\n{log.render()}")
    text = next((c.text for c in result.content if getattr(c, "type", None) == "text"), "")
    check(json.loads(text).get("roots") == [root], f"the upstream did not get the SDK's root: {text!r}")
    check(asked == 1, f"the SDK's roots callback ran {asked} times, want once")
    rpcs = [e["rpc"] for e in log.entries if e["method"] == "POST"]
    check("initialize" not in rpcs, f"a sessionless client sent initialize: {rpcs}")
    check(rpcs.count("tools/call") == 2, f"want one input_required round and the repeated call: {rpcs}")
    return f"the upstream's roots/list went through one input_required round; requests={rpcs}"


async def gw_legacy_to_modern_check(url: str) -> str:
    http = httpx2.AsyncClient(timeout=httpx2.Timeout(30, read=TIMEOUT_S), trust_env=False)
    with anyio.fail_after(TIMEOUT_S):
        async with http:
            transport = streamable_http_client(url, http_client=http)
            async with Client(transport, mode="legacy") as client:
                version = client.protocol_version
                check(version in SUPPORTED_VERSIONS, f"negotiated {version!r}, want a session-era revision")
                names = [t.name for t in (await client.list_tools()).tools]
                check({"add", "slow"} <= set(names), f"the upstream's tools are not listed: {names}")
                added = await client.call_tool("add", {"a": 2, "b": 3})
                text = next((c.text for c in added.content if getattr(c, "type", None) == "text"), "")
                check(not added.is_error and json.loads(text).get("sum") == 5, f"tools/call add: {added!r}")
                slow = await client.call_tool("slow", {"ms": 300})
                text = next((c.text for c in slow.content if getattr(c, "type", None) == "text"), "")
                check(not slow.is_error and text == "slept 300 ms", f"tools/call slow: {slow!r}")
                failed = await client.call_tool("fail", {"message": "as asked"})
                check(failed.is_error, f"a tool error of the upstream must stay a tool error: {failed!r}")
    return f"protocol={version} tools={names} add=5, slow and fail as the upstream answered"


# --------------------------------------------------------------------------- main

def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    url = argv[1]
    checks = argv[2:] or ["legacy", "auto", "auto-notebook", "modern", "no-header", "roots", "roots-modern"]
    sdk_checks = {
        "legacy": ("legacy", "legacy"),
        "auto": ("auto", "modern"),
        "modern": (MODERN_VERSION, "modern"),
        "gw-auto": ("auto", "modern"),
    }
    failed = 0
    for name in checks:
        try:
            if name in sdk_checks:
                detail = anyio.run(sdk_check, url, *sdk_checks[name])
            elif name == "auto-notebook":
                detail = anyio.run(auto_notebook_check, url)
            elif name == "no-header":
                detail = no_header_check(url)
            elif name == "roots":
                detail = anyio.run(roots_check, url)
            elif name == "roots-modern":
                detail = anyio.run(roots_modern_check, url)
            elif name == "gw-legacy-to-modern":
                detail = anyio.run(gw_legacy_to_modern_check, url)
            elif name == "gw-roots-modern":
                detail = anyio.run(gw_roots_modern_check, url)
            else:
                print(f"unknown check {name!r}", file=sys.stderr)
                return 2
            print(f"PASS py:{name}: {detail}")
        except CheckFailed as e:
            failed += 1
            print(f"FAIL py:{name}: {e}")
        except Exception as e:  # noqa: BLE001
            failed += 1
            print(f"FAIL py:{name}: {type(e).__name__}: {e}\n{traceback.format_exc()}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
