"""Gateway tax: generated tokens per second through ``fak serve`` vs the same engine called directly.

For one model and each concurrency ``c`` (default 1, 8, 64), ``c`` requests with distinct prompts
run at once, greedy, ``max_tokens`` each, ``rounds`` times:

- **direct**: ``fak.Engine.astream`` in this process (the engine's own continuous batching,
  consumed by ``c`` asyncio tasks);
- **gateway**: ``fak serve --gguf`` in a subprocess with the same engine settings, ``c`` streaming
  HTTP clients in this process (aiohttp, raw SSE; each counts its tokens from the final ``usage``
  chunk, so the client does as little work as possible; httpx's pool cost 11× more CPU per
  request at 64 streams and was measured as gateway tax until 2026-12-02).

tok/s = generated tokens / wall time of the round (first request sent → last token received);
the ratio is gateway tok/s / direct tok/s (aim ≥ 0.97). Greedy decoding makes both paths generate
the same tokens (the script reports rounds where the counts differ: an engine whose batched
decoding is not bit-exact can reach EOS at other points). Each engine and each server first
answers one short warm-up request (template compilation, first engine step, first HTTP
request), outside the timed round. Runs alternate direct/gateway per
round so load drift on a shared machine hits both; the table reports the median and the best
round of each.

Prompts: ``--prompt chat`` renders the chat template (a real chat request); ``--prompt text``
sends a few raw tokens through ``/v1/completions`` (short prefill, for slow CPU runs).

Run: ``PYTHONPATH=python python benches/bench_gateway.py --model tiny`` or
``--model /path/to/model.gguf``; ``--json FILE`` saves the numbers. ``pytest benches/bench_gateway.py
--benchmark-only`` runs a small tiny-model case under pytest-benchmark. Results are recorded in
``benches/results/gateway.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))

import aiohttp
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benches/machine.py, beside this script
from machine import cpu_name  # noqa: E402

TEXT_PROMPTS = ["def add(a, b):", "import numpy as", "for i in range(", "class Stack:", "# sort a list",
                "SELECT * FROM", "def fib(n):", "print('hello"]


def machine() -> dict[str, Any]:
    """CPU model, cores, load average and Python version of this run."""
    cpu = cpu_name(platform.machine())
    return {"cpu": cpu, "cores": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 1),
            "python": platform.python_version(), "platform": platform.platform()}


def prompts(kind: str, n: int) -> list[Any]:
    if kind == "text":
        return [f"{TEXT_PROMPTS[i % len(TEXT_PROMPTS)]} # {i}" for i in range(n)]
    return [[{"role": "user", "content": f"Request {i}: write one line about the number {i}."}] for i in range(n)]


# ------------------------------------------------------------------------------------- direct


async def _direct_round(engine: Any, items: list[Any], kind: str, max_tokens: int) -> tuple[int, float]:
    def ids_of(item: Any) -> list[int]:
        if kind == "text":
            return engine.tokenize(item, add_special=True)
        return engine.tokenize(engine.apply_chat_template(item), add_special=False, parse_special=True)

    async def one(item: Any) -> int:
        n = 0
        async with engine.astream(ids_of(item), max_tokens=max_tokens, temperature=0) as it:
            async for d in it:
                n += len(d.token_ids)
        return n

    t0 = time.perf_counter()  # the template and the tokenizer are timed too, as in the gateway
    counts = await asyncio.gather(*[one(item) for item in items])
    return sum(counts), time.perf_counter() - t0


# ------------------------------------------------------------------------------------ gateway


async def _gateway_round(base_url: str, items: list[Any], kind: str, max_tokens: int) -> tuple[int, float]:
    # aiohttp, not httpx: with 64 streams in one event loop, httpx's connection pool cost the client
    # 21 ms of CPU per streamed request against aiohttp's 1.9 (a local profile, 2026-12-02), so the
    # client, not the gateway, was a large part of the measured "tax" at high concurrency.
    connector = aiohttp.TCPConnector(limit=len(items) + 4)
    async with aiohttp.ClientSession(base_url=base_url.rstrip("/") + "/", connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=3600)) as client:
        async def one(item: Any) -> int:
            body: dict[str, Any] = {"model": "bench", "max_tokens": max_tokens, "temperature": 0, "stream": True,
                                    "stream_options": {"include_usage": True}}
            path = "completions" if kind == "text" else "chat/completions"
            body["prompt" if kind == "text" else "messages"] = item
            tail = b""
            async with client.post(path, json=body) as r:
                if r.status != 200:
                    raise RuntimeError(f"gateway answered {r.status}: {(await r.read())[:300]!r}")
                async for chunk in r.content.iter_any():
                    tail = (tail + chunk)[-4096:]
            usage_event = tail.rsplit(b"data: [DONE]", 1)[0].rstrip().rsplit(b"data: ", 1)[1]
            return int(json.loads(usage_event)["usage"]["completion_tokens"])

        t0 = time.perf_counter()
        counts = await asyncio.gather(*[one(item) for item in items])
        return sum(counts), time.perf_counter() - t0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """``fak serve`` in a subprocess on a free loopback port."""

    def __init__(self, model: Path, args: argparse.Namespace) -> None:
        self.port = _free_port()
        cmd = [sys.executable, "-m", "fak.cli", "serve", "--gguf", str(model), "--backend", args.backend,
               "--addr", f"127.0.0.1:{self.port}", "--n-ctx", str(args.n_ctx), "--model-name", "bench",
               "--max-concurrency", str(max(args.concurrency)), "--log-level", "warning",
               "--kv-cache-tokens", str(args.kv_cache_tokens)]
        if args.threads:
            cmd += ["--threads", str(args.threads)]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(REPO / "python")] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))}
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 600
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"fak serve exited: {self.proc.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("fak serve did not start")
            time.sleep(0.2)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


# -------------------------------------------------------------------------------------- runs


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Measure every concurrency; returns the results as a dict (also printed as a table)."""
    from fak.engine import Engine

    model = Path(args.model)
    if args.model == "tiny":
        from fak.synth import write_tiny_model

        model = write_tiny_model(Path(tempfile.mkdtemp()) / "tiny.gguf")
    results: dict[str, Any] = {"machine": machine(), "model": str(args.model), "backend": args.backend,
                               "prompt": args.prompt, "max_tokens": args.max_tokens, "rounds": args.rounds,
                               "warmup_rounds": args.warmup_rounds,
                               "n_ctx": args.n_ctx, "kv_cache_tokens": args.kv_cache_tokens, "rows": []}
    for c in args.concurrency:
        items = prompts(args.prompt, c)
        warm = prompts(args.prompt, 1)
        direct: list[tuple[int, float]] = []
        gateway: list[tuple[int, float]] = []
        mismatched = 0
        for r in range(1 - args.warmup_rounds, args.rounds + 1):  # rounds <= 0 are warm-ups, not counted
            with Engine(str(model), backend=args.backend, n_ctx=args.n_ctx, threads=args.threads,
                        max_batch=max(args.concurrency), kv_cache_tokens=args.kv_cache_tokens) as engine:
                asyncio.run(_direct_round(engine, warm, args.prompt, 2))  # template, tokenizer, first step
                d = asyncio.run(_direct_round(engine, items, args.prompt, args.max_tokens))
            server = Server(model, args)
            try:
                asyncio.run(_gateway_round(server.url + "/v1", warm, args.prompt, 2))
                g = asyncio.run(_gateway_round(server.url + "/v1", items, args.prompt, args.max_tokens))
            finally:
                server.stop()
            if d[0] != g[0]:  # batched greedy decoding is not bit-exact in every engine build
                print(f"  note: token counts differ at c={c}: direct {d[0]}, gateway {g[0]}", flush=True)
                mismatched += 1
            if r > 0:
                direct.append(d)
                gateway.append(g)
            print(f"  c={c} round {r}: direct {d[0] / d[1]:.1f} tok/s, gateway {g[0] / g[1]:.1f} tok/s"
                  + (" (warm-up)" if r <= 0 else ""), flush=True)
        d_rates = [n / t for n, t in direct]
        g_rates = [n / t for n, t in gateway]
        row = {"concurrency": c, "tokens_per_round": direct[0][0],
               "direct_tok_s_median": statistics.median(d_rates), "direct_tok_s_best": max(d_rates),
               "gateway_tok_s_median": statistics.median(g_rates), "gateway_tok_s_best": max(g_rates)}
        row["ratio_median"] = row["gateway_tok_s_median"] / row["direct_tok_s_median"]
        row["ratio_best"] = row["gateway_tok_s_best"] / row["direct_tok_s_best"]
        row["rounds_with_different_token_counts"] = mismatched
        results["rows"].append(row)
    results["machine"]["load_avg_1m_end"] = round(os.getloadavg()[0], 1)
    return results


def table(results: dict[str, Any]) -> str:
    lines = ["| concurrency | tokens/round | direct tok/s (median / best) | gateway tok/s (median / best) "
             "| ratio (median / best) |", "|---:|---:|---:|---:|---:|"]
    for r in results["rows"]:
        lines.append(f"| {r['concurrency']} | {r['tokens_per_round']} | {r['direct_tok_s_median']:.1f} / "
                     f"{r['direct_tok_s_best']:.1f} | {r['gateway_tok_s_median']:.1f} / {r['gateway_tok_s_best']:.1f} "
                     f"| {r['ratio_median']:.3f} / {r['ratio_best']:.3f} |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny", help="GGUF path, or 'tiny' for a synthetic tiny Qwen2 model")
    p.add_argument("--backend", default="cpu", choices=["cpu", "cuda", "auto"])
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 64])
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup-rounds", type=int, default=1, help="whole rounds run first and not counted")
    p.add_argument("--prompt", choices=["chat", "text"], default="chat")
    p.add_argument("--n-ctx", type=int, default=512)
    p.add_argument("--kv-cache-tokens", type=int, default=64 * 512)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", type=Path, default=None)
    return p.parse_args(argv)


def test_gateway_tax_tiny(benchmark: Any) -> None:
    """pytest-benchmark: one gateway round of 8 streams of 32 tokens on the tiny model."""
    from fak.synth import write_tiny_model

    args = parse_args(["--concurrency", "8", "--max-tokens", "32"])
    model = write_tiny_model(Path(tempfile.mkdtemp()) / "tiny.gguf")
    server = Server(model, args)
    try:
        items = prompts("chat", 8)
        n, _ = benchmark(lambda: asyncio.run(_gateway_round(server.url + "/v1", items, "chat", 32)))
        assert n > 0
    finally:
        server.stop()


if __name__ == "__main__":
    arguments = parse_args()
    res = run(arguments)
    print(json.dumps(res["machine"]))
    print(table(res))
    if arguments.json:
        arguments.json.write_text(json.dumps(res, indent=2))
