#!/usr/bin/env python3
"""Virtual server interop check: the official MCP Python SDK client (``mcp`` 2.x,
``mode="legacy"``: an MCP session) against /mcp/team, a tether virtual server
(``[servers.team]``, ``names = "prefix"``) over three third-party upstreams at once:
``everything`` (@modelcontextprotocol/server-everything, npm, stdio), ``pystdio``
(interop/servers/py_stdio_server.py, Python SDK, stdio) and ``tsfixture``
(interop/servers/ts_server.mjs, TypeScript SDK, a URL upstream).

usage: gw_virtual.py http://127.0.0.1:PORT/mcp/team

initialize answers the virtual server's serverInfo ("team"); tools/list and
prompts/list (every page, following next_cursor) merge the members' lists under
MEMBER__NAME (every name carries a member's prefix, none twice; pystdio's and
tsfixture's tools exactly, server-everything's echo, get-sum and its sampling tool;
the prompts pystdio__review and everything__simple-prompt), resources/list lists
``pystdio://fixture/info`` (URIs unchanged) and server-everything's documents;
tools/call reaches each member (everything__echo, pystdio__greet, tsfixture__add);
prompts/get pystdio__review; resources/read of ``pystdio://fixture/info`` and of a
server-everything document (routed by URI); server-everything's sampling tool
raises sampling/createMessage, answered by this client's ``sampling_callback``, and
the answer comes back in the tool's result; a long pystdio__slow call is cancelled
after its third progress notification (leaving an anyio cancel scope makes the SDK
send notifications/cancelled), and pystdio's own ``cancellations`` tool must then
report that its handler was interrupted for that call (its label) and that a
notifications/cancelled named the request ID pystdio ran it under (tether maps IDs,
so pystdio's own ID is compared with pystdio's own record). A pystdio__slow call
after that still finishes; leaving the client DELETEs the session. Prints what it saw
and OK, or FAIL and why.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
import uuid
from typing import Any

import anyio
import httpx2
from mcp import types
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client

TIMEOUT_S = 90
SEP = "__"
MEMBERS = ("everything", "pystdio", "tsfixture")
FIXTURE = "py-stdio-fixture"
RESOURCE_URI = "pystdio://fixture/info"
SAMPLED_TEXT = "a sampled answer from the Python interop client (virtual server)"
SAMPLED_MODEL = "interop-virtual-py-model"


class CheckFailed(Exception):
    pass


def check(cond: object, msg: str) -> None:
    if not cond:
        raise CheckFailed(msg)


def texts_of(result: types.CallToolResult) -> list[str]:
    return [c.text for c in result.content if getattr(c, "type", None) == "text"]


def by_member(names: list[str], label: str) -> dict[str, list[str]]:
    """A merged list's names grouped by member; every name must carry a member's prefix, once."""
    check(len(set(names)) == len(names), f"{label}: a name is listed twice: {names}")
    groups: dict[str, list[str]] = {m: [] for m in MEMBERS}
    for n in names:
        member = next((m for m in MEMBERS if n.startswith(m + SEP)), None)
        check(member is not None, f"{label}: {n!r} carries no member's prefix ({', '.join(m + SEP for m in MEMBERS)})")
        groups[member].append(n[len(member) + len(SEP):])
    return groups


async def all_pages(label: str, list_page: Any, key: str) -> tuple[list[Any], int]:
    """Every item of a paginated list, following next_cursor to the end."""
    items: list[Any] = []
    seen: set[str] = set()
    cursor: str | None = None
    pages = 0
    while True:
        page = await list_page(cursor=cursor)
        items.extend(getattr(page, key))
        pages += 1
        cursor = page.next_cursor
        if cursor is None:
            return items, pages
        check(cursor not in seen, f"{label}: next_cursor {cursor!r} came twice")
        seen.add(cursor)
        check(pages <= 100, f"{label}: more than 100 pages")


async def run(url: str) -> None:
    posts: list[tuple[str, int | None]] = []

    async def on_response(response: httpx2.Response) -> None:
        req = response.request
        if req.method == "POST":
            try:
                body = json.loads(req.content)
                method = (body.get("method") or "response") if isinstance(body, dict) else "batch"
            except ValueError:
                method = "(not JSON)"
            posts.append((method, response.status_code))

    sampling_requests: list[types.CreateMessageRequestParams] = []

    async def on_sampling(context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        sampling_requests.append(params)
        return types.CreateMessageResult(
            role="assistant",
            content=types.TextContent(type="text", text=SAMPLED_TEXT),
            model=SAMPLED_MODEL,
            stop_reason="endTurn",
        )

    http = httpx2.AsyncClient(timeout=httpx2.Timeout(30, read=TIMEOUT_S), trust_env=False,
                              event_hooks={"response": [on_response]})
    with anyio.fail_after(TIMEOUT_S):
        async with http:
            async with Client(streamable_http_client(url, http_client=http), mode="legacy",
                              sampling_callback=on_sampling) as client:
                info = client.server_info
                check(info is not None and info.name == "team", f"serverInfo is not the virtual server's: {info!r}")
                print(f"connected: protocol {client.protocol_version}, server {info.name} {info.version}")

                # ---------------------------------------------------------- lists
                tools, pages = await all_pages("tools/list", client.list_tools, "tools")
                tool_names = [t.name for t in tools]
                tools_by = by_member(tool_names, "tools/list")
                for n in ("echo", "get-sum", "trigger-sampling-request"):
                    check(n in tools_by["everything"], f"tools/list lacks {'everything' + SEP + n!r}: {tool_names}")
                check(sorted(tools_by["pystdio"]) == ["cancellations", "greet", "roots", "slow"],
                      f"pystdio's tools in the merged list: {tools_by['pystdio']}")
                check(sorted(tools_by["tsfixture"]) == ["add", "echo", "fail", "roots"],
                      f"tsfixture's tools in the merged list: {tools_by['tsfixture']}")
                greet_tool = next(t for t in tools if t.name == f"pystdio{SEP}greet")
                check("name" in (greet_tool.input_schema or {}).get("properties", {}),
                      f"pystdio__greet lost its input schema: {greet_tool.input_schema!r}")
                print(f"tools/list: {len(tool_names)} tools over {pages} page(s): "
                      + ", ".join(f"{m} {len(tools_by[m])}" for m in MEMBERS))

                prompts, pages = await all_pages("prompts/list", client.list_prompts, "prompts")
                prompt_names = [p.name for p in prompts]
                prompts_by = by_member(prompt_names, "prompts/list")
                check(prompts_by["pystdio"] == ["review"], f"pystdio's prompts in the merged list: {prompt_names}")
                for n in ("simple-prompt", "args-prompt"):
                    check(n in prompts_by["everything"], f"prompts/list lacks {'everything' + SEP + n!r}: {prompt_names}")
                check(prompts_by["tsfixture"] == [], f"tsfixture offers no prompts: {prompt_names}")
                print(f"prompts/list: {len(prompt_names)} prompts over {pages} page(s), e.g. {prompt_names[:4]}")

                resources, pages = await all_pages("resources/list", client.list_resources, "resources")
                uris = [str(r.uri) for r in resources]
                check(uris.count(RESOURCE_URI) == 1, f"resources/list does not list {RESOURCE_URI} once: {uris}")
                doc = next((u for u in uris if u.startswith("demo://resource/static/document/")), None)
                check(doc is not None, f"resources/list lacks server-everything's documents (URIs unchanged): {uris}")
                print(f"resources/list: {len(uris)} resources over {pages} page(s), {RESOURCE_URI} among them")

                # ---------------------------------------------------------- one call per member
                echo = await client.call_tool(f"everything{SEP}echo", {"message": "hello team"})
                check(not echo.is_error and texts_of(echo) == ["Echo: hello team"], f"everything__echo: {echo!r}")
                greet = await client.call_tool(f"pystdio{SEP}greet", {"name": "Ada"})
                want = f"Hello, Ada! (from {FIXTURE})"
                check(not greet.is_error and texts_of(greet) == [want], f"pystdio__greet: want [{want!r}], got {greet!r}")
                add = await client.call_tool(f"tsfixture{SEP}add", {"a": 2, "b": 40})
                check(not add.is_error and add.structured_content == {"sum": 42},
                      f"tsfixture__add: want structuredContent {{'sum': 42}}, got {add!r}")
                print(f"calls: everything__echo {texts_of(echo)[0]!r}, pystdio__greet {texts_of(greet)[0]!r}, "
                      f"tsfixture__add {add.structured_content}")

                prompt = await client.get_prompt(f"pystdio{SEP}review", {"code": "print(1)"})
                check(len(prompt.messages) == 1 and prompt.messages[0].role == "user"
                      and getattr(prompt.messages[0].content, "text", None) == "Please review this code:\nprint(1)",
                      f"prompts/get pystdio__review: {prompt!r}")

                # ---------------------------------------------------------- resources, routed by URI
                read = await client.read_resource(RESOURCE_URI)
                check(len(read.contents) == 1, f"resources/read: want one content, got {read.contents!r}")
                content = read.contents[0]
                check(str(content.uri) == RESOURCE_URI and content.mime_type == "text/plain"
                      and getattr(content, "text", None) == f"{FIXTURE}: a resource read over stdio",
                      f"resources/read {RESOURCE_URI}: unexpected content {content!r}")
                doc_read = await client.read_resource(doc)
                check(doc_read.contents and str(doc_read.contents[0].uri) == doc
                      and getattr(doc_read.contents[0], "text", ""), f"resources/read {doc}: {doc_read!r}")
                print(f"resources/read: {RESOURCE_URI} -> {content.text!r}; {doc} -> "
                      f"{len(doc_read.contents[0].text)} chars")

                # ---------------------------------------------------------- sampling (raised by everything)
                sampling_tool = next((n for n in tool_names
                                      if n.startswith(f"everything{SEP}") and "sampl" in n.lower()), None)
                check(sampling_tool is not None, f"no sampling tool of server-everything's in tools/list: {tool_names}")
                sampled = await client.call_tool(sampling_tool, {"prompt": "virtual-py", "maxTokens": 20})
                check(len(sampling_requests) == 1, f"want 1 sampling request, got {sampling_requests!r}")
                sr = sampling_requests[0]
                asked = getattr(sr.messages[0].content, "text", "") if sr.messages else ""
                check(sr.max_tokens == 20 and "virtual-py" in asked, f"odd sampling request: {sr!r}")
                st = "\n".join(texts_of(sampled))
                check(not sampled.is_error and SAMPLED_TEXT in st and SAMPLED_MODEL in st,
                      f"{sampling_tool}'s result does not carry the client's sampling answer: {sampled!r}")
                print(f"sampling: {sampling_tool} asked {asked!r}; the answer came back in its result")

                # ---------------------------------------------------------- cancel (pystdio)
                await check_cancel(client)
    print("POSTs: " + ", ".join(f"{m} -> {st}" for m, st in posts))
    rejected = [p for p in posts if p[1] is None or p[1] >= 400]
    check(not rejected, f"POSTs refused: {rejected}")


async def check_cancel(client: Client) -> None:
    """Cancel a long pystdio__slow call; pystdio must see its own notifications/cancelled."""
    label = f"py-virtual-{uuid.uuid4().hex[:8]}"
    progress: list[float] = []
    finished = None
    started = time.monotonic()
    with anyio.CancelScope() as scope:

        async def on_progress(p: float, total: float | None, message: str | None) -> None:
            progress.append(p)
            if len(progress) == 3:
                scope.cancel()

        # 100 steps of 0.1 s: 10 s if nothing cancels it.
        finished = await client.call_tool(f"pystdio{SEP}slow", {"label": label, "steps": 100},
                                          progress_callback=on_progress)
    took = time.monotonic() - started
    check(scope.cancelled_caught and finished is None, f"the cancelled pystdio__slow call finished: {finished!r}")
    check(len(progress) >= 3, f"the slow call was cancelled before its third progress: {progress}")
    check(took < 5, f"cancelling the slow call took {took:.1f} s")
    print(f"cancel: pystdio__slow {label} cancelled by the client after progress {progress} ({took:.1f} s)")

    # The notification is one-way: poll pystdio's own record of it.
    report: dict = {}
    mine: list[dict] = []
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        result = await client.call_tool(f"pystdio{SEP}cancellations", {})
        check(not result.is_error, f"pystdio__cancellations returned is_error: {result!r}")
        texts = texts_of(result)
        check(len(texts) == 1, f"pystdio__cancellations: want one text, got {result.content!r}")
        report = json.loads(texts[0])
        mine = [r for r in report["cancelled"] if r["label"] == label]
        if mine and mine[0]["request_id"] in report["notifications"]:
            break
        await anyio.sleep(0.1)
    check(len(mine) == 1, f"pystdio's slow handler was not cancelled for {label} (pystdio's report: {report})")
    rec = mine[0]
    check(rec["request_id"] in report["notifications"],
          f"pystdio received no notifications/cancelled for its request {rec['request_id']!r} "
          f"(pystdio's report: {report})")
    check(3 <= rec["steps_done"] < 100, f"odd steps_done in pystdio's record: {rec}")
    print(f"cancel: pystdio got notifications/cancelled for its request {rec['request_id']} "
          f"(slow {label} interrupted after {rec['steps_done']} of 100 steps)")

    again = await client.call_tool(f"pystdio{SEP}slow", {"label": "after-cancel", "steps": 3})
    check(texts_of(again) == ["slow after-cancel finished"], f"pystdio__slow after the cancel: {again!r}")
    print(f"tools/call pystdio__slow after the cancel: {texts_of(again)[0]!r}")


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        anyio.run(run, sys.argv[1])
    except CheckFailed as e:
        print(f"FAIL: {e}")
        return 1
    except BaseException as e:  # noqa: BLE001 - any failure of the check is reported whole
        print(f"FAIL: {type(e).__name__}: {e}\n{traceback.format_exc()}")
        return 1
    print("OK gw_virtual.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
