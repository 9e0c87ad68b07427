"""A scripted Anthropic Messages / OpenAI Responses server that records what real clients send.

Used once to capture the request bodies of Claude Code and Codex (``tests/data/clients/``), and by
``benches/bench_clients.py``. It answers like a cooperative model, by script, so that a client
goes through a whole agent turn:

- Claude Code (``POST /v1/messages``): the main agent's first turn (its tools include
  ``Task``/``Agent``; its billing block does not say ``cc_is_subagent=true``) is answered with
  two sub-agent calls (``Explore`` and ``general-purpose``); any other first turn with a ``Bash``
  tool (a sub-agent) with a ``Bash`` call of ``ls``; a turn holding a ``tool_result`` with text;
  anything else (title generation, quota probes) with text. Streams are Anthropic's event
  sequence; ``count_tokens`` answers a count.
- Codex (``POST /v1/responses``): a first turn with a shell call of ``ls`` in the form of the tool
  it offers (``exec_command``, ``shell`` or ``local_shell``); a turn holding a call's output
  with a message.

Every request is written to ``OUT/NNN-<path>.json`` (``{"path", "headers", "body"}``, headers
without credentials). Run inside the client's sandbox (the sandbox's loopback is its own):
``python recorder.py OUT --port 8765``. Stdlib only.
"""

from __future__ import annotations

import argparse
import itertools
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

__all__ = ["main", "reply_messages", "reply_responses"]

_SECRET_HEADERS = {"authorization", "x-api-key", "cookie"}
_ids = itertools.count(1)


def _tool_names(tools: Any) -> set[str]:
    return {str(t.get("name") or (t.get("function") or {}).get("name") or t.get("type")) for t in tools or []
            if isinstance(t, dict)}


def _has_tool_result(messages: list[Any]) -> bool:
    last = messages[-1] if messages else {}
    content = last.get("content") if isinstance(last, dict) else None
    return isinstance(content, list) and any(isinstance(b, dict) and b.get("type") == "tool_result" for b in content)


def reply_messages(body: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
    """The scripted answer to one Messages request: ``(content blocks, stop_reason)``."""
    names = _tool_names(body.get("tools"))
    messages = body.get("messages") or []
    if _has_tool_result(messages):
        return [{"type": "text", "text": "Done: the files are listed above."}], "end_turn"
    system = body.get("system")
    text = system if isinstance(system, str) else " ".join(str(b.get("text") or "") for b in system or []
                                                           if isinstance(b, dict))
    sub_agent = "cc_is_subagent=true" in text
    started = any(isinstance(m, dict) and m.get("role") == "assistant" for m in messages)
    task = next((n for n in ("Task", "Agent") if n in names), None)
    if task and not sub_agent and not started:
        calls = [
            {"type": "tool_use", "id": f"toolu_{next(_ids):04d}", "name": task,
             "input": {"description": "List the files", "prompt": "List the files of this repository with ls.",
                       "subagent_type": kind}}
            for kind in ("Explore", "general-purpose")]
        return calls, "tool_use"
    if "Bash" in names:
        return [{"type": "tool_use", "id": f"toolu_{next(_ids):04d}", "name": "Bash",
                 "input": {"command": "ls", "description": "List the files"}}], "tool_use"
    return [{"type": "text", "text": "OK"}], "end_turn"


def reply_responses(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The scripted output items of one Responses request."""
    items = body.get("input") if isinstance(body.get("input"), list) else []
    if any(isinstance(i, dict) and str(i.get("type", "")).endswith("_output") for i in items):
        return [{"type": "message", "id": f"msg_{next(_ids):04d}", "status": "completed", "role": "assistant",
                 "content": [{"type": "output_text", "text": "Done: the files are listed above.", "annotations": []}]}]
    names = _tool_names(body.get("tools"))
    call_id = f"call_{next(_ids):04d}"
    if "exec_command" in names:
        return [{"type": "function_call", "id": f"fc_{call_id}", "call_id": call_id, "name": "exec_command",
                 "arguments": json.dumps({"cmd": "ls"}), "status": "completed"}]
    if "shell" in names:
        return [{"type": "function_call", "id": f"fc_{call_id}", "call_id": call_id, "name": "shell",
                 "arguments": json.dumps({"command": ["bash", "-lc", "ls"]}), "status": "completed"}]
    if "local_shell" in names:
        return [{"type": "local_shell_call", "id": call_id, "call_id": call_id, "status": "completed",
                 "action": {"type": "exec", "command": ["bash", "-lc", "ls"], "env": {}}}]
    return [{"type": "message", "id": f"msg_{next(_ids):04d}", "status": "completed", "role": "assistant",
             "content": [{"type": "output_text", "text": "OK", "annotations": []}]}]


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


def _messages_stream(body: dict[str, Any], content: list[dict[str, Any]], stop: str) -> bytes:
    mid = f"msg_{next(_ids):06d}"
    out = [_sse("message_start", {"type": "message_start", "message": {
        "id": mid, "type": "message", "role": "assistant", "model": body.get("model"), "content": [],
        "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 100, "output_tokens": 0}}})]
    for i, block in enumerate(content):
        if block["type"] == "text":
            out.append(_sse("content_block_start", {"type": "content_block_start", "index": i,
                                                    "content_block": {"type": "text", "text": ""}}))
            out.append(_sse("content_block_delta", {"type": "content_block_delta", "index": i,
                                                    "delta": {"type": "text_delta", "text": block["text"]}}))
        else:
            out.append(_sse("content_block_start", {"type": "content_block_start", "index": i,
                                                    "content_block": {**block, "input": {}}}))
            out.append(_sse("content_block_delta", {"type": "content_block_delta", "index": i, "delta": {
                "type": "input_json_delta", "partial_json": json.dumps(block["input"])}}))
        out.append(_sse("content_block_stop", {"type": "content_block_stop", "index": i}))
    out.append(_sse("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                                      "usage": {"output_tokens": 10}}))
    out.append(_sse("message_stop", {"type": "message_stop"}))
    return b"".join(out)


def _responses_stream(body: dict[str, Any], output: list[dict[str, Any]]) -> bytes:
    rid = f"resp_{next(_ids):06d}"
    seq = itertools.count()
    base = {"id": rid, "object": "response", "created_at": 0, "model": body.get("model"), "output": [],
            "status": "in_progress", "tools": body.get("tools") or [], "parallel_tool_calls": True,
            "tool_choice": body.get("tool_choice") or "auto", "usage": None}

    def ev(kind: str, **data: Any) -> bytes:
        return _sse(kind, {"type": kind, **data, "sequence_number": next(seq)})

    out = [ev("response.created", response=base), ev("response.in_progress", response=base)]
    for i, item in enumerate(output):
        out.append(ev("response.output_item.added", output_index=i, item={**item, "status": "in_progress"}))
        if item["type"] == "message":
            text = item["content"][0]["text"]
            at = {"item_id": item["id"], "output_index": i, "content_index": 0}
            out.append(ev("response.content_part.added", **at, part={"type": "output_text", "text": "",
                                                                      "annotations": []}))
            out.append(ev("response.output_text.delta", **at, delta=text, logprobs=[]))
            out.append(ev("response.output_text.done", **at, text=text, logprobs=[]))
            out.append(ev("response.content_part.done", **at, part=item["content"][0]))
        elif item["type"] == "function_call":
            out.append(ev("response.function_call_arguments.delta", item_id=item["id"], output_index=i,
                          delta=item["arguments"]))
            out.append(ev("response.function_call_arguments.done", item_id=item["id"], output_index=i,
                          name=item["name"], arguments=item["arguments"]))
        out.append(ev("response.output_item.done", output_index=i, item=item))
    usage = {"input_tokens": 100, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 10,
             "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 110}
    out.append(ev("response.completed", response={**base, "status": "completed", "output": output, "usage": usage}))
    return b"".join(out)


class _Handler(BaseHTTPRequestHandler):
    out: Path
    counter = itertools.count(1)
    lock = threading.Lock()

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        return

    def _send(self, status: int, payload: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path.startswith("/v1/models"):
            self._send(200, json.dumps({"object": "list", "data": [{"id": "local", "object": "model"}]}).encode(),
                       "application/json")
        else:
            self._send(200, b'{"status": "ok"}', "application/json")

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {"_raw": raw.decode("utf-8", "replace")}
        path = self.path.split("?", 1)[0]
        with self.lock:
            n = next(self.counter)
        record = {"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()
                                                 if k.lower() not in _SECRET_HEADERS}, "body": body}
        name = path.strip("/").replace("/", "_")
        (self.out / f"{n:03d}-{name}.json").write_text(json.dumps(record, indent=1, ensure_ascii=False))
        if path.endswith("/messages/count_tokens"):
            self._send(200, b'{"input_tokens": 100}', "application/json")
        elif path.endswith("/messages"):
            content, stop = reply_messages(body)
            if body.get("stream"):
                self._send(200, _messages_stream(body, content, stop), "text/event-stream")
            else:
                msg = {"id": f"msg_{next(_ids):06d}", "type": "message", "role": "assistant",
                       "model": body.get("model"), "content": content, "stop_reason": stop, "stop_sequence": None,
                       "usage": {"input_tokens": 100, "output_tokens": 10}}
                self._send(200, json.dumps(msg).encode(), "application/json")
        elif path.endswith("/responses"):
            output = reply_responses(body)
            self._send(200, _responses_stream(body, output), "text/event-stream")
        else:
            self._send(404, json.dumps({"error": {"message": f"unknown path {path}", "type": "not_found"}}).encode(),
                       "application/json")


def main(argv: list[str] | None = None) -> None:
    """``recorder.py OUT [--port N]``: serve on 127.0.0.1 until killed."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--port", type=int, default=8765)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    _Handler.out = args.out
    ThreadingHTTPServer(("127.0.0.1", args.port), _Handler).serve_forever()


if __name__ == "__main__":
    main()
