"""A scripted OpenAI-compatible model server: canned replies, for tests and fleet benchmarks.

A script maps an instance id (the part after ``/`` in the ``X-Fak-Conversation`` header; ``"*"``
for any other) to a list of turns. The fleet's attempt k >= 1 of an instance (``ID.a{k}``) gets
its own key's turns when the script has that key, else the instance's. The reply to a request is
the turn whose index is the number of assistant messages already in the request (so the server
keeps no conversation state and a retried request gets the same turn). Past the end of its list,
a conversation gets a submit.

A turn (JSON object)::

    {"content": "text" | null,
     "tool_calls": [{"name": "edit", "arguments": {...}}],    # tool-call protocol
     "fak_policy": {"verdicts": [...]},                        # the gateway's extension object
     "fail": [429, 500],   # answer these statuses to the first attempts at this turn, then the turn
     "error_code": "context_length_exceeded",   # the ``error.code`` of those failures
     "delay_s": 0.5,       # wait before answering (simulates decode time)
     "resampled": [turn, ...],   # the turns given to requests for this turn that carry a
                                 # "seed" (the agent's resample of a repeated call), in order;
                                 # the last one repeats (with fleet attempts every request
                                 # carries a seed: such a turn is then always resampled)
     "usage": {"prompt_tokens": 10, "completion_tokens": 5}}   # default: rough counts

Run it: ``ScriptedServer(script).start()`` (a uvicorn thread on a free loopback port; ``.url``,
``.requests``, ``.stop()``), or ``python -m fak.agent.scripted SCRIPT.json --port N``.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from litestar import Litestar, Request, get, post
from litestar.response import Response

_ATTEMPT_SUFFIX = re.compile(r"\.a[0-9]+$")  # the fleet's attempt k >= 1 of an instance: ID.a{k}


def _submit_turn(text_protocol: bool) -> dict[str, Any]:
    if text_protocol:
        return {"content": "Done.\n\n```bash\nsubmit\n```"}
    return {"tool_calls": [{"name": "submit", "arguments": {}}]}


class ScriptedModel:
    """The script and the log of requests received (``requests``: dicts with ``headers`` (the
    ``x-fak-*`` ones), ``body``, ``status``, ``time``)."""

    def __init__(self, script: dict[str, list[dict[str, Any]]]):
        self.script = script
        self.requests: list[dict[str, Any]] = []
        self._failures: dict[tuple[str, int], int] = {}
        self._resamples: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()

    def turn_for(self, conversation: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        instance = conversation.split("/", 1)[-1]
        turns = self.script.get(instance)
        if turns is None:
            turns = self.script.get(_ATTEMPT_SUFFIX.sub("", instance), self.script.get("*", []))
        index = sum(1 for m in body.get("messages", []) if m.get("role") == "assistant")
        if index < len(turns):
            return index, turns[index]
        return index, _submit_turn(text_protocol=not body.get("tools"))

    def respond(self, headers: dict[str, str], body: dict[str, Any]) -> tuple[int, dict[str, Any], float]:
        """(status, JSON body, delay seconds) for one request."""
        conversation = headers.get("x-fak-conversation", "")
        index, turn = self.turn_for(conversation, body)
        if body.get("seed") is not None and turn.get("resampled"):
            with self._lock:
                n = self._resamples.get((conversation, index), 0)
                self._resamples[(conversation, index)] = n + 1
            alternatives = turn["resampled"]
            turn = alternatives[min(n, len(alternatives) - 1)]
        fails = list(turn.get("fail") or [])
        with self._lock:
            key = (conversation, index)
            n = self._failures.get(key, 0)
            status = 200
            if n < len(fails):
                self._failures[key] = n + 1
                status = int(fails[n])
            self.requests.append({"headers": headers, "body": body, "status": status,
                                  "turn": index, "time": time.time()})
        if status != 200:
            return status, {"error": {"message": f"scripted failure {status}", "type": "scripted",
                                      "code": turn.get("error_code")}}, 0.0
        message: dict[str, Any] = {"role": "assistant", "content": turn.get("content")}
        calls = turn.get("tool_calls") or []
        if calls:
            message["tool_calls"] = [
                {"id": c.get("id") or f"call_{uuid.uuid4().hex[:10]}", "type": "function",
                 "function": {"name": c["name"],
                              "arguments": c["arguments"] if isinstance(c.get("arguments"), str)
                              else json.dumps(c.get("arguments") or {})}}
                for c in calls]
        prompt_chars = sum(len(str(m.get("content") or "")) for m in body.get("messages", []))
        out_chars = len(json.dumps(message))
        usage = turn.get("usage") or {"prompt_tokens": prompt_chars // 4 + 1,
                                      "completion_tokens": out_chars // 4 + 1}
        usage = {**usage, "total_tokens": usage["prompt_tokens"] + usage["completion_tokens"]}
        data: dict[str, Any] = {
            "id": f"chatcmpl-{uuid.uuid4().hex[:12]}", "object": "chat.completion",
            "created": int(time.time()), "model": body.get("model", "scripted"),
            "choices": [{"index": 0, "message": message,
                         "finish_reason": "tool_calls" if calls else "stop"}],
            "usage": usage,
        }
        if turn.get("fak_policy") is not None:
            data["fak_policy"] = turn["fak_policy"]
        if turn.get("timings") is not None:  # what fak serve reports (llama.cpp's field names)
            data["timings"] = turn["timings"]
        return 200, data, float(turn.get("delay_s") or 0.0)


def make_app(model: ScriptedModel) -> Litestar:
    """The Litestar app serving ``POST /v1/chat/completions`` from ``model`` and
    ``GET /v1/models`` (one model, ``scripted``)."""

    @get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": "scripted", "object": "model", "created": 0,
                                            "owned_by": "fak"}]}

    @post("/v1/chat/completions", status_code=200)
    async def chat_completions(request: Request) -> Response:
        body = await request.json()
        headers = {k.lower(): v for k, v in request.headers.items() if k.lower().startswith("x-fak-")}
        status, data, delay = model.respond(headers, body)
        if delay:
            await asyncio.sleep(delay)
        return Response(content=data, status_code=status, media_type="application/json")

    return Litestar(route_handlers=[chat_completions, models], debug=False)


class ScriptedServer:
    """The scripted model behind uvicorn in a background thread on ``127.0.0.1``."""

    def __init__(self, script: dict[str, list[dict[str, Any]]], port: int = 0):
        import uvicorn

        self.model = ScriptedModel(script)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", port))
        self.port = self._sock.getsockname()[1]
        config = uvicorn.Config(make_app(self.model), log_level="warning", lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]},
                                        daemon=True, name="scripted-model")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def requests(self) -> list[dict[str, Any]]:
        return self.model.requests

    def start(self, timeout_s: float = 10.0) -> "ScriptedServer":
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the scripted model server did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()

    def __enter__(self) -> "ScriptedServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:  # pragma: no cover - manual use
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("script", type=Path)
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args(argv)
    server = ScriptedServer(json.loads(args.script.read_text()), port=args.port).start()
    print(f"scripted model on {server.url}", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.stop()


if __name__ == "__main__":  # pragma: no cover
    main()
