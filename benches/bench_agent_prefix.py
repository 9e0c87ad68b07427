"""Claude Code's request pattern through ``fak serve``: prefix-cache hit rate and time to first
token, before and after the billing-header normalisation, with and without resident prefixes;
and the gateway's overhead per protocol against chat completions.

**Replay.** The request bodies Claude Code 2.1.337 sent for one task (``tests/data/clients/
claude-code-2.1.337/``: a main agent that starts two sub-agents, ``Explore`` and
``general-purpose``, whose turns interleave with the main agent's: 11 requests) are sent again,
in the captured order, to ``/v1/messages?beta=true`` of an in-process gateway over ``fak.Engine``
(stream, ``max_tokens`` cut to ``--max-tokens``, greedy). Claude Code's interactive entrypoint
puts a per-request ``cch=<hex>`` value in its ``x-anthropic-billing-header`` system block
(llama.cpp #20623); the SDK entrypoint captured here sends the block without it, so the replay
adds a fresh ``cch=`` to every request, as the interactive CLI does. Conditions:

- ``before``: the gateway without the normalisation (the billing block stays in the system prompt,
  so every request's prompt differs from its first block on);
- ``after``: the gateway as it is (the block left out);
- ``after, tight KV``: ``after`` with a KV cache of ``--tight-kv`` tokens (room for about one
  main-agent prompt and a sub-agent's), ``--sessions`` sessions of the task back to back (each its
  own conversation, ``as_session``), without (``resident off``) and with (``resident on``) the
  agents' system turns sent as resident prefixes (the gateway sends one once a second
  conversation uses it).

Per request: the prompt tokens, the tokens the prefix cache held (``cache_read_input_tokens``),
and the time to the first content event of the stream (TTFT as the client sees it: the gateway
sends its opening events at once). Hit rate = Σ cached / Σ prompt tokens.

**Overhead.** The same short conversation through ``/v1/chat/completions``, ``/v1/messages`` and
``/v1/responses`` (non-streamed and streamed) over the fake engine of the tests (no compute: what
is left is the gateway), ``--overhead-rounds`` requests each; reported as the median latency and
its difference from chat completions.

**Hybrid models** (qwen35 / qwen35moe: docs/hybrid.md): a prompt resumes from the prefix cache
only up to a block with a checkpoint of the recurrent state. ``--state-checkpoints 0,1,2,4,8``
replays ``after`` once per checkpoint count (the engine's ``state_checkpoints``), each on a fresh
engine, and reports the state memory beside the hit rate; with ``--sessions N`` each replays N
sessions of the task back to back (``as_session``: they share each agent's system turn and tools,
so a later session's agents resume where an earlier session's prompts branched). ``--agent
sub:general-purpose --limit 1 --sessions 3``: three sub-agents of one kind (same system prompt and
tools, their own tasks) started one after another, the case a branch checkpoint is for.

Run: ``PYTHONPATH=python python benches/bench_agent_prefix.py --model PATH.gguf --json out.json``
(``--model tiny`` writes the tiny synthetic qwen2 model, ``--model tiny-ARCH`` the tiny synthetic
model of ``ARCH``: ``tiny-qwen35``, ``tiny-qwen35moe``, ``tiny-qwen3``, with ``--tiny-layers`` /
``--tiny-embd``). Results: ``benches/results/agent-prefix.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(REPO / "tests" / "gateway"))
from machine import machine  # noqa: E402  (benches/machine.py, beside this script)

import httpx

FIXTURES = REPO / "tests" / "data" / "clients" / "claude-code-2.1.337"




def fixtures() -> list[dict[str, Any]]:
    """The captured requests, in order (``{"path", "headers", "body"}``)."""
    return [json.loads(p.read_text()) for p in sorted(FIXTURES.glob("*.json"))]


def with_cch(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` with a fresh ``cch=<hex>;`` in its billing block (Claude Code's interactive CLI)."""
    body = json.loads(json.dumps(body))
    for block in body.get("system") or []:
        if isinstance(block, dict) and str(block.get("text", "")).startswith("x-anthropic-billing-header:"):
            block["text"] = block["text"].rstrip() + f" cch={secrets.token_hex(3)};"
    return body


def who(body: dict[str, Any]) -> str:
    """``main``, or the sub-agent's kind (the system prompt's second block names it)."""
    blocks = [str(b.get("text", "")) for b in body.get("system") or [] if isinstance(b, dict)]
    if not any("cc_is_subagent=true" in b for b in blocks):
        return "main"
    text = " ".join(blocks)
    return "sub:Explore" if "file search specialist" in text else "sub:general-purpose"


@contextmanager
def serving(engine: Any, *, normalise: bool, resident: bool) -> Any:
    """An in-process gateway over ``engine``, optionally without the billing-block normalisation
    or without resident prefixes (the code before those changes)."""
    from fak.gateway import BackgroundServer, GatewayConfig, create_app
    from fak.gateway.messages import serving as messages_serving
    from fak.gateway.serving import EngineServing

    saved_header, saved_resident = messages_serving.BILLING_HEADER, EngineServing.resident_prefix
    try:
        if not normalise:
            messages_serving.BILLING_HEADER = "\0never"
        if not resident:
            EngineServing.resident_prefix = lambda self, *a, **k: 0  # type: ignore[method-assign]
        with BackgroundServer(create_app(GatewayConfig(model_aliases=("*",)), engine=engine)) as srv:
            yield srv
    finally:
        messages_serving.BILLING_HEADER = saved_header
        EngineServing.resident_prefix = saved_resident  # type: ignore[method-assign]


def as_session(body: dict[str, Any], session: int) -> dict[str, Any]:
    """``body`` as the same request of another session of the same task: its own session id in
    ``metadata.user_id`` (the conversation key) and its first user turn marked with the session,
    so sessions share their agents' system turns and nothing after them."""
    if session == 0:
        return body
    body = json.loads(json.dumps(body))
    meta = body.get("metadata") or {}
    meta["user_id"] = f"{meta.get('user_id', '')}#session-{session}"
    body["metadata"] = meta
    first = (body.get("messages") or [{}])[0]
    content = first.get("content")
    if isinstance(content, str):
        first["content"] = f"(session {session}) {content}"
    elif isinstance(content, list):
        block = next((b for b in content if isinstance(b, dict) and b.get("type") == "text"), None)
        if block is not None:
            block["text"] = f"(session {session}) {block['text']}"
    return body


def replay(srv: Any, max_tokens: int, limit: int | None = None, sessions: int = 1,
           agent: str | None = None) -> list[dict[str, Any]]:
    """Send every fixture (the first ``limit``; only ``agent``'s, ``who``, when given), each with a
    fresh ``cch``, ``sessions`` times (``as_session``), and measure each (see the module doc)."""
    rows = []
    chosen = [fx for fx in fixtures() if agent is None or who(fx["body"]) == agent][:limit]
    with httpx.Client(timeout=3600) as http:
        for session, fx in ((k, fx) for k in range(sessions) for fx in chosen):
            body = with_cch(as_session(fx["body"], session))
            body.update(stream=True, max_tokens=max_tokens, temperature=0)
            headers = {k: v for k, v in fx["headers"].items() if k.startswith("anthropic-")}
            t0 = time.perf_counter()
            ttft = None
            usage: dict[str, Any] = {}
            with http.stream("POST", srv.url + "/v1/messages?beta=true", json=body, headers=headers) as r:
                assert r.status_code == 200, r.read()
                for line in r.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    ev = json.loads(line[6:])
                    if ttft is None and ev["type"] in ("content_block_start", "message_delta"):
                        ttft = time.perf_counter() - t0
                    if ev["type"] == "message_delta":
                        usage = ev.get("usage") or {}
            prompt = int(usage.get("input_tokens", 0)) + int(usage.get("cache_read_input_tokens") or 0)
            rows.append({"who": who(fx["body"]), "session": session, "prompt_tokens": prompt,
                         "cached_tokens": int(usage.get("cache_read_input_tokens") or 0),
                         "ttft_s": round(ttft or 0.0, 4), "total_s": round(time.perf_counter() - t0, 4)})
    return rows


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Hit rate and TTFT of a replay, in total and per agent."""
    def agg(rs: list[dict[str, Any]]) -> dict[str, Any]:
        p = sum(r["prompt_tokens"] for r in rs)
        c = sum(r["cached_tokens"] for r in rs)
        return {"requests": len(rs), "prompt_tokens": p, "cached_tokens": c, "hit_rate": round(c / p, 4) if p else 0,
                "ttft_median_s": round(statistics.median(r["ttft_s"] for r in rs), 3),
                "ttft_total_s": round(sum(r["ttft_s"] for r in rs), 3)}
    out = {"all": agg(rows)}
    for name in sorted({r["who"] for r in rows}):
        out[name] = agg([r for r in rows if r["who"] == name])
    for k in sorted({r["session"] for r in rows}):
        if k:
            out[f"session {k}"] = agg([r for r in rows if r["session"] == k])
    return out


def overhead(rounds: int) -> dict[str, Any]:
    """Median latency per protocol over the fake engine (see the module doc)."""
    from fak.gateway import BackgroundServer, GatewayConfig, create_app
    from gateway_fakes import FakeEngine

    system, user = "You are a coding agent.", "List the files."
    requests = {
        "chat": ("/v1/chat/completions", {"model": "m", "messages": [{"role": "system", "content": system},
                                                                      {"role": "user", "content": user}]}),
        "messages": ("/v1/messages", {"model": "m", "max_tokens": 64, "system": system,
                                      "messages": [{"role": "user", "content": user}]}),
        "responses": ("/v1/responses", {"model": "m", "instructions": system, "input": user, "store": False}),
    }
    out: dict[str, Any] = {}
    with BackgroundServer(create_app(GatewayConfig(model_aliases=("*",)), engine=FakeEngine(chunk=8))) as srv, \
            httpx.Client(timeout=60) as http:
        for stream in (False, True):
            for name, (path, body) in requests.items():
                times = []
                for i in range(rounds + 5):
                    t0 = time.perf_counter()
                    if stream:
                        with http.stream("POST", srv.url + path, json={**body, "stream": True}) as r:
                            for _ in r.iter_raw():
                                pass
                    else:
                        r = http.post(srv.url + path, json=body)
                        assert r.status_code == 200, r.text
                    if i >= 5:  # warm-up left out
                        times.append(time.perf_counter() - t0)
                out[f"{name}{' stream' if stream else ''}"] = round(statistics.median(times) * 1e3, 3)
    base = {False: out["chat"], True: out["chat stream"]}
    return {key: {"median_ms": ms, "vs_chat_ms": round(ms - base[key.endswith("stream")], 3)}
            for key, ms in out.items()}


def main() -> None:
    """See the module doc."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny",
                    help="GGUF path, 'tiny' (the synthetic tiny qwen2) or 'tiny-ARCH' (e.g. tiny-qwen35)")
    ap.add_argument("--tiny-layers", type=int, default=None, help="n_layer of a tiny-ARCH model")
    ap.add_argument("--tiny-embd", type=int, default=64, help="n_embd of a tiny-ARCH model")
    ap.add_argument("--state-checkpoints", default=None,
                    help="comma-separated checkpoint counts: replay 'after' once per count (hybrid models)")
    ap.add_argument("--max-tokens", type=int, default=4)
    ap.add_argument("--n-ctx", type=int, default=32768)
    ap.add_argument("--tight-kv", type=int, default=None,
                    help="KV tokens of the tight-cache conditions [default: skip them]")
    ap.add_argument("--overhead-rounds", type=int, default=200)
    ap.add_argument("--skip-replay", action="store_true")
    ap.add_argument("--limit", type=int, default=None, help="replay the first N requests only")
    ap.add_argument("--agent", default=None,
                    help="replay only this agent's requests (main, sub:Explore, sub:general-purpose); with "
                         "--limit 1 --sessions N: N sub-agents of one kind started one after another")
    ap.add_argument("--sessions", type=int, default=1,
                    help="sessions of the task replayed back to back in the tight-KV conditions, with --agent, and the "
                         "--state-checkpoints replays")
    ap.add_argument("--conditions", default="before,after,tight",
                    help="which replays: before, after, tight (the two tight-KV ones, with --tight-kv)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    from fak.engine import Engine

    result: dict[str, Any] = {"machine": machine(), "model": args.model, "fixtures": str(FIXTURES.relative_to(REPO)),
                              "max_tokens": args.max_tokens, "limit": args.limit, "agent": args.agent, "sessions": args.sessions, "n_ctx": args.n_ctx,
                              "date": time.strftime("%Y-%m-%d %H:%M")}
    model = args.model
    if model == "tiny":
        from fak.synth import write_tiny_model

        model = str(Path(tempfile.mkdtemp()) / "tiny.gguf")
        write_tiny_model(model)
    elif model.startswith("tiny-"):
        from fak.synth import write_tiny_model

        arch = model.removeprefix("tiny-")
        model = str(Path(tempfile.mkdtemp()) / f"{model}.gguf")
        write_tiny_model(model, arch, n_layer=args.tiny_layers, n_embd=args.tiny_embd, ctx=max(args.n_ctx, 2048))
        result["tiny"] = {"arch": arch, "n_layer": args.tiny_layers, "n_embd": args.tiny_embd}
    if not args.skip_replay:
        wanted = set(args.conditions.split(","))
        conditions = [c for c in [("before", True, False, True, None), ("after", True, True, True, None)]
                      if c[0] in wanted]
        if args.tight_kv and "tight" in wanted:
            conditions += [("after, tight KV, resident off", True, True, False, args.tight_kv),
                           ("after, tight KV, resident on", True, True, True, args.tight_kv)]
        counts: list[int | None] = [None]
        if args.state_checkpoints:
            counts = [int(n) for n in args.state_checkpoints.split(",")]
            conditions = [c for c in conditions if c[0] == "after"] or [("after", True, True, True, None)]
        result["replay"] = {}
        for count in counts:
            extra = {} if count is None else {"state_checkpoints": count}
            for name, _, normalise, resident, kv in conditions:
                if count is not None:
                    name = f"{name}, {count} state checkpoints"
                t0 = time.perf_counter()
                with Engine(model, backend="cpu", n_ctx=args.n_ctx, kv_cache_tokens=kv, max_batch=4, **extra) as eng:
                    config = dict(eng._loop.model.config)  # the native config (state memory)
                    with serving(eng, normalise=normalise, resident=resident) as srv:
                        rows = replay(srv, args.max_tokens, args.limit, args.sessions if kv or count is not None or args.agent else 1,
                                      args.agent)
                state = {k: config.get(k) for k in ("state_checkpoints", "state_slot_bytes", "state_bytes")}
                result["replay"][name] = {"kv_cache_tokens": kv, **extra, "state": state, "rows": rows,
                                          "summary": summarize(rows), "wall_s": round(time.perf_counter() - t0, 1),
                                          "loadavg": list(os.getloadavg())}
                print(name, json.dumps(result["replay"][name]["summary"]["all"]), json.dumps(state), flush=True)
    result["overhead"] = overhead(args.overhead_rounds)
    print(json.dumps(result["overhead"], indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
