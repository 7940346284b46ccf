#!/usr/bin/env python3
"""A stdio MCP server for the console's browser tests (standard library only).

Newline-delimited JSON-RPC on stdin/stdout. Every tool run is appended to
the file named by the first argument ("start <tool> <label>" and "end ..."),
so a test can count how many times a tool ran upstream.

Tools:
  slow   `steps` progress notifications (and a log message each), one every
         `ms` milliseconds, then the text "slow <label> done after N steps"
  greet  asks the client `elicitation/create` for a name and a mood, then
         answers "Hello, NAME! (MOOD)", or says what the client did instead
  echo   returns its arguments as text and structuredContent
  image  returns a 2x2 PNG
"""

import json
import sys
import threading
import time

RUNLOG = sys.argv[1] if len(sys.argv) > 1 else None
out_lock = threading.Lock()
asked = {}  # our request id -> the tools/call id waiting for its answer
asked_lock = threading.Lock()
cancelled = set()
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAIAAAD91JpzAAAAEklEQVR4nGM4IScnV3GCAUIBACBcBMVUBFiYAAAAAElFTkSuQmCC"

TOOLS = [
    {"name": "slow", "description": "Counts to `steps`, one progress notification every `ms` milliseconds.",
     "inputSchema": {"type": "object", "properties": {
         "steps": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 10},
         "ms": {"type": "integer", "minimum": 0, "maximum": 60000, "default": 300},
         "label": {"type": "string", "maxLength": 40, "description": "a name for this run"}},
         "required": ["steps"]}},
    {"name": "greet", "description": "Asks for your name (elicitation), then greets you.",
     "inputSchema": {"type": "object", "properties": {}}},
    {"name": "echo", "description": "Returns its arguments.",
     "inputSchema": {"type": "object", "properties": {
         "text": {"type": "string", "maxLength": 100},
         "count": {"type": "number"},
         "loud": {"type": "boolean"},
         "color": {"type": "string", "enum": ["red", "green", "blue"]},
         "tags": {"type": "array", "items": {"type": "string"}}},
         "required": ["text"]}},
    {"name": "image", "description": "Returns a tiny image.", "inputSchema": {"type": "object", "properties": {}}},
]


def send(message):
    line = json.dumps(message, separators=(",", ":"))
    with out_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def record(text):
    if RUNLOG:
        with open(RUNLOG, "a", encoding="utf-8") as f:
            f.write(text + "\n")


def text_result(text, structured=None):
    result = {"content": [{"type": "text", "text": text}]}
    if structured is not None:
        result["structuredContent"] = structured
    return result


def slow(id_, args, meta):
    steps = int(args.get("steps", 10))
    ms = int(args.get("ms", 300))
    label = str(args.get("label", ""))
    token = meta.get("progressToken")
    record("start slow %s" % label)
    for i in range(1, steps + 1):
        time.sleep(ms / 1000.0)
        if id_ in cancelled:
            record("cancelled slow %s" % label)
            return
        if token is not None:
            send({"jsonrpc": "2.0", "method": "notifications/progress",
                  "params": {"progressToken": token, "progress": i, "total": steps, "message": "step %d of %d" % (i, steps)}})
        send({"jsonrpc": "2.0", "method": "notifications/message",
              "params": {"level": "info", "logger": "slow", "data": "step %d" % i}})
    record("end slow %s" % label)
    send({"jsonrpc": "2.0", "id": id_, "result": text_result("slow %s done after %d steps" % (label, steps), {"steps": steps})})


def greet(id_):
    record("start greet")
    ask_id = "ask-%s" % id_
    with asked_lock:
        asked[ask_id] = id_
    send({"jsonrpc": "2.0", "id": ask_id, "method": "elicitation/create", "params": {
        "message": "Who is calling?",
        "requestedSchema": {"type": "object", "properties": {
            "name": {"type": "string", "title": "Your name", "maxLength": 60},
            "mood": {"type": "string", "title": "Mood", "enum": ["happy", "curious", "tired"]},
            "formal": {"type": "boolean", "title": "Formal greeting"}},
            "required": ["name"]}}})


def answered(message):
    with asked_lock:
        waiting = asked.pop(message.get("id"), None)
    if waiting is None:
        return
    result = message.get("result") or {}
    if result.get("action") == "accept":
        content = result.get("content") or {}
        greeting = "Good day" if content.get("formal") else "Hello"
        text = "%s, %s! (%s)" % (greeting, content.get("name", "?"), content.get("mood", "no mood"))
    elif "error" in message:
        text = "the client refused: %s" % json.dumps(message["error"])
    else:
        text = "the client chose %s" % result.get("action")
    record("end greet")
    send({"jsonrpc": "2.0", "id": waiting, "result": text_result(text)})


def call_tool(id_, params):
    name = params.get("name")
    args = params.get("arguments") or {}
    meta = params.get("_meta") or {}
    if name == "slow":
        threading.Thread(target=slow, args=(id_, args, meta), daemon=True).start()
    elif name == "greet":
        greet(id_)
    elif name == "echo":
        record("start echo")
        send({"jsonrpc": "2.0", "id": id_, "result": text_result(json.dumps(args), args)})
    elif name == "image":
        send({"jsonrpc": "2.0", "id": id_, "result": {"content": [{"type": "image", "mimeType": "image/png", "data": PNG}]}})
    else:
        send({"jsonrpc": "2.0", "id": id_, "error": {"code": -32602, "message": "unknown tool %r" % name}})


def handle(message):
    method = message.get("method")
    id_ = message.get("id")
    params = message.get("params") or {}
    if method is None:
        answered(message)
        return
    if id_ is None:
        if method == "notifications/cancelled":
            cancelled.add(params.get("requestId"))
        return
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": id_, "result": {
            "protocolVersion": params.get("protocolVersion", "2025-06-18"),
            "capabilities": {"tools": {}, "logging": {}},
            "serverInfo": {"name": "console-test-server", "version": "0"}}})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": id_, "result": {"tools": TOOLS}})
    elif method == "tools/call":
        call_tool(id_, params)
    elif method in ("ping", "logging/setLevel"):
        send({"jsonrpc": "2.0", "id": id_, "result": {}})
    else:
        send({"jsonrpc": "2.0", "id": id_, "error": {"code": -32601, "message": "method not found: %s" % method}})


def main():
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if isinstance(message, dict):
            handle(message)


if __name__ == "__main__":
    main()
