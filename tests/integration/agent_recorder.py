"""A recording model endpoint that answers every model route with a fixed short reply, for watching what a
real agent sends in interactive use without a clawray (how docs/agents.md "Side requests" was recorded:
the agent in tmux, in a private network namespace with this endpoint on its loopback).

    python agent_recorder.py PORT LOG [REPLY] [TOOL_JSON] [PROMPT_TOKENS]

Answers Anthropic `POST /v1/messages`, OpenAI `POST /v1/chat/completions` and `POST /v1/responses`,
streaming or not, in each API's own format, with REPLY as the assistant's text (default "ok"). TOOL_JSON,
`{"tool name": {arguments}, ...}`: a request that offers one of these tools is answered with a call of it
instead, once per step (not again after its result), so the agent runs a tool as it would in real use and
sends what it sends around a tool call. PROMPT_TOKENS (default 10) is the prompt size every usage
reports: a large one makes an agent that budgets its context by the reported usage compact. `GET
/v1/models` lists the model the agent asked for last; any other path is a 404 (agents' probes of other
servers' routes). Each request is one JSON line in LOG: method, path, headers, the parsed body. Unlike
tests/integration/agent_stub.py (which refuses every request so that the agent stops at once), an agent
here carries on as with a model that answers, so it sends its auxiliary requests (titles, suggestions,
summaries) too.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def _sse(event: str | None, data: Any) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data)}\n\n".encode()


Call = tuple[str, dict[str, Any]] | None  # (tool name, arguments) to call instead of answering with text


def anthropic(body: dict[str, Any], text: str, call: Call, n: int = 10) -> tuple[dict[str, Any] | None, list[bytes]]:
    mid, model = f"msg_{uuid.uuid4().hex[:24]}", body.get("model", "m")
    usage = {"input_tokens": n, "output_tokens": 1}
    stop = "tool_use" if call else "end_turn"
    block = ({"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:20]}", "name": call[0], "input": call[1]}
             if call else {"type": "text", "text": text})
    message = {"id": mid, "type": "message", "role": "assistant", "model": model, "stop_reason": stop,
               "stop_sequence": None, "usage": usage, "content": [block]}
    if not body.get("stream"):
        return message, []
    start = {**message, "content": [], "stop_reason": None}
    empty = {**block, "input": {}} if call else {**block, "text": ""}
    delta = ({"type": "input_json_delta", "partial_json": json.dumps(call[1])} if call
             else {"type": "text_delta", "text": text})
    return None, [
        _sse("message_start", {"type": "message_start", "message": start}),
        _sse("content_block_start", {"type": "content_block_start", "index": 0, "content_block": empty}),
        _sse("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
        _sse("content_block_stop", {"type": "content_block_stop", "index": 0}),
        _sse("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                               "usage": {"output_tokens": 1}}),
        _sse("message_stop", {"type": "message_stop"}),
    ]


def chat(body: dict[str, Any], text: str, call: Call, n: int = 10) -> tuple[dict[str, Any] | None, list[bytes]]:
    cid, model, now = f"chatcmpl-{uuid.uuid4().hex[:24]}", body.get("model", "m"), int(time.time())
    usage = {"prompt_tokens": n, "completion_tokens": 1, "total_tokens": n + 1}
    finish = "tool_calls" if call else "stop"
    calls = [{"index": 0, "id": f"call_{uuid.uuid4().hex[:20]}", "type": "function",
              "function": {"name": call[0], "arguments": json.dumps(call[1])}}] if call else None
    if not body.get("stream"):
        message = {"role": "assistant", "content": None if call else text}
        if calls:
            message["tool_calls"] = [{k: v for k, v in c.items() if k != "index"} for c in calls]
        return {"id": cid, "object": "chat.completion", "created": now, "model": model, "usage": usage,
                "choices": [{"index": 0, "finish_reason": finish, "message": message}]}, []

    def chunk(delta: dict[str, Any], why: str | None) -> bytes:
        return _sse(None, {"id": cid, "object": "chat.completion.chunk", "created": now, "model": model,
                           "choices": [{"index": 0, "delta": delta, "finish_reason": why}]})
    content = {"tool_calls": calls} if calls else {"content": text}
    events = [chunk({"role": "assistant", "content": ""}, None), chunk(content, None), chunk({}, finish)]
    if (body.get("stream_options") or {}).get("include_usage"):
        events.append(_sse(None, {"id": cid, "object": "chat.completion.chunk", "created": now, "model": model,
                                  "choices": [], "usage": usage}))
    return None, [*events, b"data: [DONE]\n\n"]


def responses(body: dict[str, Any], text: str, call: Call, n: int = 10) -> tuple[dict[str, Any] | None, list[bytes]]:
    rid, iid = f"resp_{uuid.uuid4().hex[:24]}", f"item_{uuid.uuid4().hex[:24]}"
    part = {"type": "output_text", "text": text, "annotations": []}
    if call:
        item = {"id": iid, "type": "function_call", "status": "completed", "name": call[0],
                "call_id": f"call_{uuid.uuid4().hex[:20]}", "arguments": json.dumps(call[1])}
    else:
        item = {"id": iid, "type": "message", "role": "assistant", "status": "completed", "content": [part]}
    usage = {"input_tokens": n, "output_tokens": 1, "total_tokens": n + 1,
             "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}}
    done = {"id": rid, "object": "response", "created_at": int(time.time()), "status": "completed",
            "model": body.get("model", "m"), "output": [item], "usage": usage}
    if not body.get("stream"):
        return done, []
    created = {**done, "status": "in_progress", "output": [], "usage": None}
    where = {"item_id": iid, "output_index": 0}
    if call:
        middle = [("response.function_call_arguments.delta", {**where, "delta": item["arguments"]}),
                  ("response.function_call_arguments.done", {**where, "arguments": item["arguments"]})]
        added = {**item, "status": "in_progress", "arguments": ""}
    else:
        at = {**where, "content_index": 0}
        middle = [("response.content_part.added", {**at, "part": {**part, "text": ""}}),
                  ("response.output_text.delta", {**at, "delta": text}),
                  ("response.output_text.done", {**at, "text": text}),
                  ("response.content_part.done", {**at, "part": part})]
        added = {**item, "status": "in_progress", "content": []}
    steps = [("response.created", {"response": created}), ("response.output_item.added", {"output_index": 0, "item": added}),
             *middle, ("response.output_item.done", {"output_index": 0, "item": item}),
             ("response.completed", {"response": done})]
    return None, [_sse(name, {"type": name, "sequence_number": i, **data}) for i, (name, data) in enumerate(steps)]


def _offered(body: dict[str, Any]) -> set[str]:
    """The names of the tools a request offers, in any of the three APIs."""
    out = set()
    for t in body.get("tools") or []:
        if isinstance(t, dict):
            out.add(t.get("name") or (t.get("function") or {}).get("name") or t.get("type") or "")
    return out


def _is_tool_result(item: Any) -> bool:
    """A chat tool message, a Responses `*_output` item, an Anthropic user message with a tool_result."""
    if not isinstance(item, dict):
        return False
    if item.get("role") == "tool" or str(item.get("type", "")).endswith("_output"):
        return True
    content = item.get("content")
    return isinstance(content, list) and any(isinstance(b, dict) and b.get("type") == "tool_result" for b in content)


def _answered_a_tool(body: dict[str, Any]) -> bool:
    """A tool result came after the assistant's last text reply: this step already ran its tool (agents
    add messages of their own after a tool result, e.g. OpenClaw's internal-context user message)."""
    items = body.get("messages") or body.get("input") or []
    for item in reversed(items if isinstance(items, list) else []):
        if _is_tool_result(item):
            return True
        if isinstance(item, dict) and item.get("role") == "assistant" and _has_text(item.get("content")):
            return False
    return False


def _has_text(content: Any) -> bool:
    if isinstance(content, str):
        return bool(content.strip())
    return isinstance(content, list) and any(
        isinstance(b, dict) and b.get("type") in ("text", "output_text") and (b.get("text") or "").strip()
        for b in content)


def tool_call(body: dict[str, Any], tools: dict[str, dict[str, Any]]) -> Call:
    """The configured tool call for this request, if it offers one of those tools and is not answering one."""
    if _answered_a_tool(body):
        return None
    name = next((n for n in tools if n in _offered(body)), None)
    return (name, tools[name]) if name else None


ROUTES = {"/v1/messages": anthropic, "/v1/chat/completions": chat, "/v1/responses": responses}


def serve(port: int, log: str, text: str = "ok", tools: dict[str, dict[str, Any]] | None = None,
          prompt_tokens: int = 10) -> ThreadingHTTPServer:
    """Start the endpoint on 127.0.0.1:PORT in a thread; returns the server (`shutdown()` stops it)."""
    lock = threading.Lock()
    last_model = ["clawray-policy"]

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _record(self, body: Any) -> None:
            row = {"t": time.time(), "method": self.command, "path": self.path, "body": body,
                   "headers": {k.lower(): v for k, v in self.headers.items()}}
            with lock, open(log, "a") as fh:
                fh.write(json.dumps(row) + "\n")

        def _send(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            raw = self.rfile.read(int(self.headers.get("content-length") or 0))
            try:
                body = json.loads(raw) if raw else {}
            except ValueError:
                body = None
            self._record(body)
            answer = ROUTES.get(self.path.split("?")[0])
            if answer is None or not isinstance(body, dict):
                return self._send(404, {"error": {"type": "not_found", "message": "agent_recorder: no such route"}})
            last_model[0] = body.get("model") or last_model[0]
            whole, events = answer(body, text, tool_call(body, tools or {}), prompt_tokens)
            if whole is not None:
                return self._send(200, whole)
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            for e in events:
                self.wfile.write(f"{len(e):x}\r\n".encode() + e + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")

        def do_GET(self) -> None:  # noqa: N802
            self._record(None)
            if self.path.split("?")[0] == "/v1/models":
                return self._send(200, {"object": "list", "data": [
                    {"id": last_model[0], "object": "model", "created": 0, "owned_by": "clawray"}]})
            self._send(404, {"error": {"type": "not_found", "message": "agent_recorder: no such route"}})

        def do_HEAD(self) -> None:  # noqa: N802 (connectivity probes: a status, no body)
            self._record(None)
            self.send_response(404)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


if __name__ == "__main__":
    srv = serve(int(sys.argv[1]), sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "ok",
                json.loads(sys.argv[4]) if len(sys.argv) > 4 else None, int(sys.argv[5]) if len(sys.argv) > 5 else 10)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        srv.shutdown()
