#!/usr/bin/env python3
"""Interop checks: MCP Inspector's CLI (``inspector --cli``, @modelcontextprotocol/inspector).

Each step is one run of the CLI, as a user types it:
    inspector --cli URL [--transport http] [--protocol-era legacy|modern]
              --method tools/list | --method tools/call --tool-name NAME --tool-arg K=V ...
with --format json (one JSON object on stdout). The CLI's default era for a URL is
legacy (initialize, a session per run); --protocol-era modern is sessionless
(2026-07-28). A URL that does not end in /mcp (a gateway endpoint, /mcp/NAME)
needs --transport http: the CLI guesses the transport from the URL's end.

usage: inspector_cli.py INSPECTOR URL CHECK     (INSPECTOR: the path of the inspector binary)

  notebook-legacy  /mcp in the CLI's default era: tools/list names thought, init and
                   session; a `thought` (a unique text); session search finds it and names
                   its notebook session; session export (markdown) of that session holds
                   it; init load_context with that sessionId loads it (1 thought); session
                   list names it.
  notebook-modern  /mcp with --protocol-era modern: tools/list; a `thought` whose result
                   names its notebook session in _meta; a second one sent with
                   --tool-metadata dev.tether/notebookSession=ID goes on in it; session
                   search, get and export of it.
  gateway-legacy   /mcp/NAME (the Python SDK stdio fixture) with --transport http:
                   tools/list names greet; greet answers.
  gateway-modern   the same with --protocol-era modern.
 And the sessionless notebook:
  notebook-modern-init  --protocol-era modern: init list_sessions, and init load_context
                   with a sessionId, answer (no session needed).
  export-100k      a notebook session of 26 thoughts of 4,000 characters (~104 KB) written
                   with --protocol-era modern; session export in each era answers it
                   whole (every thought), not cut at 64 KiB.

Prints one PASS/FAIL line and exits non-zero if the check failed.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import traceback
import uuid
from typing import Any

NOTEBOOK_TOOLS = {"thought", "init", "session"}
NOTEBOOK_SESSION_META = "dev.tether/notebookSession"
BIG_THOUGHTS = 26
BIG_THOUGHT_CHARS = 4000


class CheckFailed(Exception):
    pass


def check(cond: object, msg: str) -> None:
    if not cond:
        raise CheckFailed(msg)


class Inspector:
    def __init__(self, binary: str, url: str, era: str | None, transport: str | None) -> None:
        self.binary, self.url, self.era, self.transport = binary, url, era, transport
        # The CLI keeps a catalog and client config under ~/.mcp-inspector: a
        # HOME of its own, so the checks neither read nor write the user's.
        self.home = tempfile.mkdtemp(prefix="interop-inspector-")
        atexit.register(shutil.rmtree, self.home, True)
        self.runs = 0

    def run(self, *args: str) -> dict[str, Any]:
        argv = [self.binary, "--cli", self.url]
        if self.transport:
            argv += ["--transport", self.transport]
        if self.era:
            argv += ["--protocol-era", self.era]
        argv += [*args, "--format", "json"]
        env = {**os.environ, "HOME": self.home}
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
        self.runs += 1
        try:
            out = json.loads(proc.stdout)
        except json.JSONDecodeError:
            raise CheckFailed(f"{' '.join(argv[1:])}: exit {proc.returncode}, not JSON on stdout:\n"
                              f"{proc.stdout[:800]}\nstderr: {proc.stderr[:800]}") from None
        check(proc.returncode == 0 and "result" in out,
              f"{' '.join(argv[1:])}: exit {proc.returncode}: {json.dumps(out)[:800]}\nstderr: {proc.stderr[:400]}")
        return out["result"]

    def tools(self) -> list[str]:
        return [t["name"] for t in self.run("--method", "tools/list")["tools"]]

    def call(self, tool: str, *kv: str, meta: dict[str, str] | None = None) -> dict[str, Any]:
        args = ["--method", "tools/call", "--tool-name", tool]
        if kv:
            args += ["--tool-arg", *kv]
        if meta:
            args += ["--tool-metadata", *(f"{k}={v}" for k, v in meta.items())]
        result = self.run(*args)
        check(not result.get("isError"), f"{tool} {kv}: isError: {json.dumps(result)[:600]}")
        return result


def text_of(result: dict[str, Any]) -> str:
    return "".join(b.get("text", "") for b in result.get("content", []))


def thought(ins: Inspector, text: str, n: int, total: int, meta: dict[str, str] | None = None) -> dict[str, Any]:
    r = ins.call("thought", f"thought={text}", f"thoughtNumber={n}", f"totalThoughts={total}",
                 f"nextThoughtNeeded={'true' if n < total else 'false'}", meta=meta)
    sc = r.get("structuredContent") or {}
    check(sc.get("thoughtNumber") == n and sc.get("totalThoughts") == total
          and sc.get("nextThoughtNeeded") == (n < total),
          f"thought {n}/{total}: structuredContent {sc!r}")
    return r


def notebook_legacy(ins: Inspector) -> str:
    names = ins.tools()
    check(set(names) == NOTEBOOK_TOOLS, f"tools/list names {names}")
    marker = f"inspector legacy marker {uuid.uuid4().hex[:8]}"
    r = thought(ins, marker, 1, 1)
    check(r["structuredContent"].get("thoughtHistoryLength") == 1, f"thought: {r['structuredContent']}")
    hits = ins.call("session", "operation=search", f"query={marker}")["structuredContent"]["hits"]
    check(len(hits) == 1 and hits[0]["thought"] == marker, f"session search {marker!r}: {hits!r}")
    sid = hits[0]["sessionId"]
    export = text_of(ins.call("session", "operation=export", f"sessionId={sid}"))
    check(export.startswith("# Session") and marker in export, f"session export {sid}: {export[:300]!r}")
    loaded = ins.call("init", "operation=load_context", f"sessionId={sid}")["structuredContent"]
    check(loaded.get("success") is True and loaded.get("sessionId") == sid and loaded.get("thoughtCount") == 1,
          f"init load_context sessionId={sid}: {loaded!r}")
    listed = ins.call("session", "operation=list")["structuredContent"]["sessions"]
    check(any(s["sessionId"] == sid for s in listed), f"session list does not name {sid}")
    return f"tools {names}; thought; session search/export/list and init load_context of {sid} ({ins.runs} runs)"


def notebook_modern(ins: Inspector) -> str:
    names = ins.tools()
    check(set(names) == NOTEBOOK_TOOLS, f"tools/list names {names}")
    marker = f"inspector modern marker {uuid.uuid4().hex[:8]}"
    first = thought(ins, marker, 1, 2)
    sid = first.get("_meta", {}).get(NOTEBOOK_SESSION_META)
    check(isinstance(sid, str) and sid, f"thought: no _meta[{NOTEBOOK_SESSION_META!r}]: {first.get('_meta')!r}")
    second = thought(ins, "second step", 2, 2, meta={NOTEBOOK_SESSION_META: sid})
    check(second["structuredContent"].get("thoughtHistoryLength") == 2
          and second.get("_meta", {}).get(NOTEBOOK_SESSION_META) == sid,
          f"the second thought did not go on in {sid}: {second!r}")
    hits = ins.call("session", "operation=search", f"query={marker}")["structuredContent"]["hits"]
    check([h["sessionId"] for h in hits] == [sid], f"session search {marker!r}: {hits!r}")
    got = ins.call("session", "operation=get", f"sessionId={sid}")["structuredContent"]
    check([t["thought"] for t in got["thoughts"]] == [marker, "second step"], f"session get: {got!r}")
    export = text_of(ins.call("session", "operation=export", f"sessionId={sid}"))
    check(marker in export and "second step" in export, f"session export: {export[:300]!r}")
    return f"tools {names}; two thoughts in {sid}; session search/get/export ({ins.runs} runs)"


def notebook_modern_init(ins: Inspector) -> str:
    marker = f"inspector modern init {uuid.uuid4().hex[:8]}"
    sid = thought(ins, marker, 1, 1)["_meta"][NOTEBOOK_SESSION_META]
    listed = ins.call("init", "operation=list_sessions")["structuredContent"]
    check(any(s.get("sessionId") == sid for s in listed.get("sessions", [])), f"init list_sessions: {listed!r}")
    loaded = ins.call("init", "operation=load_context", f"sessionId={sid}")["structuredContent"]
    check(loaded.get("success") is True and loaded.get("sessionId") == sid, f"init load_context: {loaded!r}")
    return f"init list_sessions and load_context of {sid}"


def gateway(ins: Inspector) -> str:
    names = ins.tools()
    check("greet" in names, f"tools/list does not name greet: {names}")
    text = text_of(ins.call("greet", "name=tether"))
    check(text == "Hello, tether! (from py-stdio-fixture)", f"greet answered {text!r}")
    return f"{len(names)} tools; greet: {text!r}"


def big_thought(i: int) -> str:
    head = f"big thought {i:02d} "
    return head + "x" * (BIG_THOUGHT_CHARS - len(head))


def export_100k(binary: str, url: str) -> str:
    writer = Inspector(binary, url, "modern", None)
    sid = None
    for i in range(1, BIG_THOUGHTS + 1):
        r = thought(writer, big_thought(i), i, BIG_THOUGHTS, meta={NOTEBOOK_SESSION_META: sid} if sid else None)
        sid = sid or r["_meta"][NOTEBOOK_SESSION_META]
    sizes = []
    for era in ("legacy", "modern"):
        result = Inspector(binary, url, era, None).call("session", "operation=export", f"sessionId={sid}")
        export = text_of(result)
        size = len(export.encode())
        check("nextResumeToken" not in result.get("_meta", {}),
              f"{era}: the export came with _meta.nextResumeToken after {size} bytes: paged, not whole")
        missing = [i for i in range(1, BIG_THOUGHTS + 1) if big_thought(i) not in export]
        check(not missing, f"{era}: the export ({size} bytes) lacks thoughts {missing} (cut?)")
        sizes.append(f"{era} {size} B")
    return f"export of {sid} whole: {', '.join(sizes)}"


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    binary, url, name = argv[1:]
    runs = {
        "notebook-legacy": lambda: notebook_legacy(Inspector(binary, url, None, None)),
        "notebook-modern": lambda: notebook_modern(Inspector(binary, url, "modern", None)),
        "gateway-legacy": lambda: gateway(Inspector(binary, url, None, "http")),
        "gateway-modern": lambda: gateway(Inspector(binary, url, "modern", "http")),
        "notebook-modern-init": lambda: notebook_modern_init(Inspector(binary, url, "modern", None)),
        "export-100k": lambda: export_100k(binary, url),
    }
    if name not in runs:
        print(f"unknown check {name!r}", file=sys.stderr)
        return 2
    try:
        detail = runs[name]()
    except CheckFailed as e:
        print(f"FAIL inspector:{name}: {e}")
        return 1
    except Exception as e:  # noqa: BLE001
        print(f"FAIL inspector:{name}: {type(e).__name__}: {e}\n{traceback.format_exc()}")
        return 1
    print(f"PASS inspector:{name}: {detail}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
