"""Decode speed of fak against llama.cpp on the real models, same process, same 2 threads,
alternating rounds: the measured half of issue 3's "decode ≥ 1.0× llama.cpp".

Three figures per model, each per decoded token:

- ``llama.cpp``: llama-cpp-python ``Llama(path, n_threads=2)``, a 32-token prompt evaluated once,
  then ``eval([token])`` one token at a time (the whole llama.cpp decode step: every matmul with its
  repacked Q4_K, attention, norms; no sampling).
- ``fak step``: ``fak._native.EngineCore.step()`` decoding one greedy sequence (the whole fak step:
  forward, LM head, argmax sampling).
- ``fak matmuls``: every weight matrix of the model once as a GEMV (``fak._native.matmul``,
  ``n_rows = 1``; ``token_embd`` excluded, a row gather): the quantized-matmul share of a step,
  the kernels this bench exists to compare. Each Python call costs a fixed overhead (argument
  conversion, a hand-off to the rayon pool) that the engine does not pay; it is measured in the
  same run on a one-block matmul and reported, and ``net`` subtracts it.

With ``--prefill N`` (default 512; 0 skips it) each round also times a prefill of N random prompt
tokens (pp512): llama.cpp ``reset()`` + ``eval(prompt)`` with ``n_batch`` = ``n_ubatch`` = 512,
fak ``add_sequence`` + one ``step()`` (prefix cache off, ``max_tokens_per_step`` 512) + remove,
both giving the last position's logits.

With ``--llama-bench PATH`` llama.cpp's own ``llama-bench`` binary (built by
``scripts/build-llama-bench``: DESIGN.md's explicit x86 flags, AMX off) is a peer too: each round
runs ``llama-bench -m MODEL -t T -p N -n TOKENS -r 1 -o json`` (its own warm-up, then one pp and
one tg run) between fak's rounds, and the ratios are taken against it (decode ``tgTOKENS`` and
``ppN`` as llama-bench reports them, wall clock; its CPU time is not measured: "–"). The
llama-cpp-python peer runs only where ``llama_cpp`` imports (``--no-llama-cpp-python`` drops it).

Each engine runs in its own child process (so neither one's idle worker threads share a process
with the other's), driven round by round from the parent: rounds alternate llama.cpp / fak so both
see the same machine load. Time is taken two ways, both reported: wall clock (what a user sees; on
the shared 2-core machine it is depressed and noisy, so the load average is recorded) and the
child's process CPU time (all its threads; llama.cpp's workers busy-wait at every op barrier, which
this counts). The table gives medians over rounds.

``FAK_CPU_SIMD=avx2`` in the environment (inherited by the children) runs fak's AVX2 paths on an
AVX-512 machine; pair it with a llama-bench built for AVX2 only (``scripts/build-llama-bench``
with ``FAK_LLAMA_AVX2_ONLY=1``) to compare the code paths an AVX2-only CPU runs.

Run:  PYTHONPATH=python python -m pytest benches/bench_cpu_decode.py --benchmark-only -s
      PYTHONPATH=python python benches/bench_cpu_decode.py [--rounds N] [--tokens N] [--threads N]
          [--prefill N] [--llama-bench PATH] [--no-llama-cpp-python] [--untiled] [--baseline SO]
          [--neighbours N]   # table only; N busy-loop processes beside both engines
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "benches"))  # machine.py
from conftest import MODEL_05B, MODEL_15B, real_model  # noqa: E402
from machine import cpu_name  # noqa: E402

from fak import _native  # noqa: E402
from fak.gguf import GGUFFile  # noqa: E402

THREADS = 2
TOKENS = 32  # decoded tokens per round
ROUNDS = 8
PROMPT = [int(t) for t in np.random.default_rng(0).integers(1000, 30_000, size=32)]  # mod n_vocab for small vocabularies
PREFILL = 512  # prompt tokens of the prefill (pp512) figure
PREFILL_PROMPT = [int(t) for t in np.random.default_rng(2).integers(1000, 30_000, size=4096)]


@dataclass
class Series:
    """Per-token seconds of each round, wall and process-CPU."""

    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)

    def add(self, wall: float, cpu: float, tokens: int) -> None:
        self.wall.append(wall / tokens)
        self.cpu.append(cpu / tokens)

    def tok_s(self) -> float:
        return 1.0 / statistics.median(self.wall)

    def tok_cpu_s(self) -> float:
        """Tokens per CPU-second (NaN where the CPU time is not measured: llama-bench)."""
        return 1.0 / statistics.median(self.cpu)

    def best_tok_s(self) -> float:
        return 1.0 / min(self.wall)


def timed(f, tokens: int, series: Series) -> None:
    """Runs ``f()`` (which decodes ``tokens`` tokens) and records its wall and CPU time."""
    c0, w0 = time.process_time(), time.perf_counter()
    f()
    series.add(time.perf_counter() - w0, time.process_time() - c0, tokens)


class LlamaDecode:
    """llama.cpp through llama-cpp-python: the prompt once, then one token per ``eval``."""

    def __init__(self, path: Path, threads: int) -> None:
        from llama_cpp import Llama

        self.llm = Llama(model_path=str(path), n_threads=threads, n_threads_batch=threads, n_ctx=2048,
                         n_batch=512, n_ubatch=512, verbose=False)
        self.reset()

    def prefill(self, tokens: int) -> None:
        self.llm.reset()
        self.llm.eval(PREFILL_PROMPT[:tokens])
        self.dirty = True  # the next decode round starts from the 32-token prompt again

    def reset(self) -> None:
        self.llm.reset()
        self.llm.eval(PROMPT)
        self.dirty = False

    def round(self, tokens: int) -> None:
        if self.dirty or self.llm.n_tokens + tokens >= self.llm.n_ctx():
            self.reset()
        for i in range(tokens):
            self.llm.eval([PROMPT[i % len(PROMPT)]])


class FakStep:
    """fak's engine: one greedy sequence, ``step()`` per token (prefill outside the timing)."""

    def __init__(self, path: Path, threads: int) -> None:
        self.model = _native.EngineCore(str(path), n_ctx=2048, threads=threads)
        # The prefill figure on a second engine (same mapped weights), so that no decode rides
        # along in its step; prefix cache off so every round computes the whole prompt.
        self.pre = _native.EngineCore(str(path), n_ctx=2048, threads=threads, prefix_cache=False,
                                 max_tokens_per_step=512)
        self.sid = 0
        self.used = 0
        self.reset()

    def reset(self) -> None:
        if self.sid:
            self.model.remove_sequence(self.sid)
        self.sid += 1
        self.model.add_sequence(self.sid, [t % self.model.n_vocab for t in PROMPT], {"temperature": 0.0})
        self.model.step()  # prefill
        self.used = len(PROMPT) + 1

    def round(self, tokens: int) -> None:
        if self.used + tokens >= 2048:
            self.reset()
        for _ in range(tokens):
            self.model.step()
        self.used += tokens

    def prefill(self, tokens: int) -> None:
        self.pre.add_sequence(1, [t % self.pre.n_vocab for t in PREFILL_PROMPT[:tokens]], {"temperature": 0.0})
        self.pre.step()
        self.pre.remove_sequence(1)


class FakMatmuls:
    """Every weight matrix of the model once as a GEMV: fak's quantized-matmul time per token."""

    def __init__(self, path: Path, threads: int) -> None:
        self.threads = threads
        self.file = GGUFFile(path)
        self.mats = [(t.dtype, self.file.raw(t.name), t.shape[0], t.shape[1])
                     for t in self.file.tensors if len(t.shape) == 2 and t.name != "token_embd.weight"]
        rng = np.random.default_rng(1)
        self.x = {k: rng.standard_normal((1, k)).astype(np.float32) for k in {m[3] for m in self.mats}}
        self.bytes = sum(m[1].nbytes for m in self.mats)

    def round(self, tokens: int) -> None:
        for _ in range(tokens):
            for dtype, w, n_out, k in self.mats:
                _native.matmul(dtype, w, n_out, k, self.x[k], threads=self.threads)

    def call_overhead(self) -> tuple[float, float]:
        """(wall, CPU) seconds of one ``_native.matmul`` call on a one-block Q4_K matrix: the
        fixed cost of a call, paid ``len(self.mats)`` times per token here and not in the engine."""
        w, x = np.zeros(144, np.uint8), np.ones((1, 256), np.float32)
        s = Series()
        for _ in range(5):
            timed(lambda: [_native.matmul("Q4_K", w, 1, 256, x, threads=self.threads) for _ in range(400)], 400, s)
        return statistics.median(s.wall), statistics.median(s.cpu)


RUNNERS = {"llama.cpp": LlamaDecode, "fak step": FakStep, "fak matmuls": FakMatmuls}
# ``--untiled``: fak's step once more with the register-tiled Q4_K/Q6_K prefill kernels off
# (``FAK_CPU_TILED=0``: the one-row kernels they replaced, same results), in the same rounds.
UNTILED = "fak step FAK_CPU_TILED=0"
# ``--baseline SO``: fak's step once more with another build's extension module (e.g. the commit
# before a change, built by ``scripts/dev-build`` in another checkout), in the same rounds.
BASELINE = "fak step baseline"


class LlamaBench:
    """llama.cpp's ``llama-bench`` binary as a peer: one invocation per round (model load and its
    warm-up run outside its timing), one pp and one tg run; figures as it reports them (wall)."""

    def __init__(self, exe: str, path: Path, threads: int, prefill: int, tokens: int) -> None:
        self.cmd = [exe, "-m", str(path), "-t", str(threads), "-p", str(prefill), "-n", str(tokens),
                    "-r", "1", "-o", "json"]
        self.info: dict = {}

    def round(self, dec: Series, pre: Series) -> None:
        out = subprocess.run(self.cmd, check=True, capture_output=True, text=True).stdout
        for e in json.loads(out):
            self.info = {k: e.get(k) for k in ("cpu_info", "build_commit", "n_threads", "n_batch", "n_ubatch")}
            series, n = (dec, e["n_gen"]) if e["n_gen"] else (pre, e["n_prompt"])
            series.add(n / e["avg_ts"], math.nan, n)


def _load_native(so: str):
    """The extension module at ``so`` (another build of ``fak._native``), loaded beside this one."""
    import importlib.machinery
    import importlib.util

    spec = importlib.util.spec_from_file_location("fak_baseline._native", so,
                                                  loader=importlib.machinery.ExtensionFileLoader("fak_baseline._native", so))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _serve(kind: str, path: str, threads: int, conn, baseline: str | None = None) -> None:
    """Child process: builds one runner, then answers ``("round", n)`` with (wall, CPU) seconds,
    ``"info"`` with what the parent reports, ``None`` by exiting."""
    global _native
    if kind == UNTILED:
        os.environ["FAK_CPU_TILED"] = "0"  # read at the first matmul, after this
    if kind == BASELINE:
        _native = _load_native(baseline)  # FakStep's engine from the other build
    runner = (FakStep if kind in (UNTILED, BASELINE) else RUNNERS[kind])(Path(path), threads)
    runner.round(2)  # warm-up: page the weights in, start the thread pools
    conn.send("ready")
    while (msg := conn.recv()) is not None:
        if msg == "info":
            info = {}
            if isinstance(runner, FakMatmuls):
                info = {"bytes": runner.bytes, "calls": len(runner.mats), "overhead": runner.call_overhead()}
            conn.send(info)
            continue
        s = Series()
        f = runner.prefill if msg[0] == "prefill" else runner.round
        timed(lambda: f(msg[1]), 1, s)
        conn.send((s.wall[0], s.cpu[0]))


class Child:
    """A runner in its own (spawned) process."""

    def __init__(self, kind: str, path: Path, threads: int, baseline: str | None = None) -> None:
        self.conn, theirs = mp.get_context("spawn").Pipe()
        self.proc = mp.get_context("spawn").Process(target=_serve, args=(kind, str(path), threads, theirs, baseline), daemon=True)
        self.proc.start()
        if self.conn.recv() != "ready":
            raise RuntimeError(f"{kind} did not start")

    def round(self, tokens: int, series: Series, what: str = "round") -> None:
        self.conn.send((what, tokens))
        wall, cpu = self.conn.recv()
        series.add(wall, cpu, tokens)

    def info(self) -> dict:
        self.conn.send("info")
        return self.conn.recv()

    def close(self) -> None:
        self.conn.send(None)
        self.proc.join(timeout=60)


def compare(name: str, rounds: int = ROUNDS, tokens: int = TOKENS, threads: int = THREADS,
            prefill: int = PREFILL, llama_bench: str | None = None, llama_cpp_python: bool = True,
            untiled: bool = False, baseline: str | None = None) -> dict:
    """Alternating rounds of llama.cpp (llama-cpp-python where it imports and
    ``llama_cpp_python``; the ``llama_bench`` binary where given), fak step and fak matmuls on
    model ``name``, each engine in its own process, then (``prefill`` > 0) one prefill of
    ``prefill`` tokens by each peer and fak in the same round; medians over rounds."""
    path = Path(name) if name.endswith(".gguf") else real_model(name)
    name = path.stem if name.endswith(".gguf") else name
    load = [os.getloadavg()[0]]
    kinds = [k for k in RUNNERS if k != "llama.cpp"
             or (llama_cpp_python and importlib.util.find_spec("llama_cpp") is not None)]
    kinds += [UNTILED] if untiled else []
    kinds += [BASELINE] if baseline else []
    if not llama_bench and "llama.cpp" not in kinds:
        raise RuntimeError("no llama.cpp peer: llama_cpp does not import and no --llama-bench given")
    children = {kind: Child(kind, path, threads, baseline) for kind in kinds}
    bench = LlamaBench(llama_bench, path, threads, prefill or 1, tokens) if llama_bench else None
    peers = ["llama-bench"] if bench else []
    series = {kind: Series() for kind in peers + kinds}
    pre = {kind: Series() for kind in peers + ["llama.cpp", "fak step", UNTILED, BASELINE] if kind in kinds or kind in peers}
    try:
        if prefill:  # warm-up: the prefill's activation buffers, llama.cpp's compute graph
            for kind in pre:
                if kind != "llama-bench":
                    children[kind].round(prefill, Series(), "prefill")
        for _ in range(rounds):
            if bench:
                bench.round(series["llama-bench"], pre["llama-bench"] if prefill else Series())
            for kind, child in children.items():
                child.round(tokens, series[kind])
            for kind in pre if prefill else ():
                if kind != "llama-bench":
                    children[kind].round(prefill, pre[kind], "prefill")
            load.append(os.getloadavg()[0])
        info = children["fak matmuls"].info()
    finally:
        for child in children.values():
            child.close()
    (ov_wall, ov_cpu), calls = info["overhead"], info["calls"]
    series["fak matmuls net"] = Series(wall=[w - calls * ov_wall for w in series["fak matmuls"].wall],
                                       cpu=[c - calls * ov_cpu for c in series["fak matmuls"].cpu])
    return {
        "model": name, "cpu": cpu_name(), "threads": threads, "prefill_tokens": prefill,
        "prefill_tok_s": {k: s.tok_s() for k, s in pre.items()} if prefill else {},
        "prefill_best_tok_s": {k: s.best_tok_s() for k, s in pre.items()} if prefill else {},
        "prefill_tok_cpu_s": {k: s.tok_cpu_s() for k, s in pre.items()} if prefill else {}, "rounds": rounds, "tokens_per_round": tokens,
        "weights_gb_per_token": info["bytes"] / 1e9, "matmul_calls": calls,
        "call_overhead_us": (ov_wall * 1e6, ov_cpu * 1e6),
        "loadavg_1m": (min(load), max(load)), "simd": _native.simd_level(),
        "tok_s": {k: s.tok_s() for k, s in series.items()},
        "tok_cpu_s": {k: s.tok_cpu_s() for k, s in series.items()},
        "best_tok_s": {k: s.best_tok_s() for k, s in series.items()},
        "peer": "llama-bench" if bench else "llama.cpp", "llama_bench": bench.info if bench else None,
    }


def _cell(v: float, base: float) -> str:
    if math.isnan(v) or math.isnan(base):
        return f"{v:.1f} | –" if not math.isnan(v) else "– | –"
    return f"{v:.1f} | {v / base:.2f}×"


def table(results: list[dict]) -> str:
    """Markdown: tok/s (wall: median and best round) and tok/CPU-s per engine, and fak ÷ the peer
    (llama-bench where it ran, else llama-cpp-python)."""
    peer = results[0].get("peer", "llama.cpp") if results else "llama.cpp"
    out = [f"| model | figure | wall tok/s (median) | ÷ {peer} | wall tok/s (best round) | ÷ {peer} "
           f"| tok/CPU-s | ÷ {peer} |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        p = r.get("peer", "llama.cpp")
        base = {m: r[m][p] for m in ("tok_s", "best_tok_s", "tok_cpu_s")}
        for k in [k for k in ("llama-bench", "llama.cpp", "fak step", UNTILED, BASELINE, "fak matmuls", "fak matmuls net") if k in r["tok_s"]]:
            cells = [_cell(r[m][k], base[m]) for m in ("tok_s", "best_tok_s", "tok_cpu_s")]
            out.append(f"| {r['model']} | {k} | " + " | ".join(cells) + " |")
        if r.get("prefill_tok_s"):
            pw, pc, pb = r["prefill_tok_s"], r["prefill_tok_cpu_s"], r.get("prefill_best_tok_s", {})
            for k in pw:
                best = _cell(pb[k], pb[p]) if k in pb else "– | –"
                out.append(f"| {r['model']} | pp{r['prefill_tokens']} {k} | {_cell(pw[k], pw[p])} | {best} | "
                           f"{_cell(pc[k], pc[p])} |")
    notes = [f"- {r['model']} on {r['cpu']}: {r['rounds']} rounds × {r['tokens_per_round']} tokens, {r['threads']} threads, "
             f"load average {r['loadavg_1m'][0]:.1f}–{r['loadavg_1m'][1]:.1f}, simd {r['simd']}, "
             f"{r['weights_gb_per_token']:.2f} GB of weights per token in {r['matmul_calls']} matmuls, "
             f"call overhead {r['call_overhead_us'][0]:.1f} µs wall / {r['call_overhead_us'][1]:.1f} µs CPU"
             + (f"; llama-bench {r['llama_bench']}" if r.get("llama_bench") else "")
             for r in results]
    return "\n".join(out + [""] + notes)


@pytest.mark.parametrize("name", [MODEL_05B, MODEL_15B])
def test_decode_vs_llamacpp(benchmark, name: str) -> None:
    """One comparison per model; the benchmark's own timing is the fak step rounds. The peer:
    ``FAK_LLAMA_BENCH`` (a llama-bench binary) where set, llama-cpp-python where it imports."""
    exe = os.environ.get("FAK_LLAMA_BENCH")
    if not exe and importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("no llama.cpp peer: set FAK_LLAMA_BENCH or install llama-cpp-python")
    result = benchmark.pedantic(compare, args=(name,), kwargs={"llama_bench": exe}, rounds=1, iterations=1)
    benchmark.extra_info.update(result)
    print("\n" + table([result]))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=ROUNDS)
    ap.add_argument("--tokens", type=int, default=TOKENS)
    ap.add_argument("--threads", type=int, default=THREADS)
    ap.add_argument("--prefill", type=int, default=PREFILL, help="prompt tokens of the prefill figure (0: none)")
    ap.add_argument("--models", nargs="*", default=[MODEL_05B, MODEL_15B],
                    help="real model names (../shared/models), or paths of GGUF files (e.g. a `fak synth` twin)")
    ap.add_argument("--llama-bench", help="path of a llama-bench binary (scripts/build-llama-bench): a peer")
    ap.add_argument("--no-llama-cpp-python", action="store_true", help="leave out the llama-cpp-python peer")
    ap.add_argument("--untiled", action="store_true", help=f"add {UNTILED!r} (the kernels before the tiled prefill)")
    ap.add_argument("--baseline", help=f"path of another build's _native.abi3.so: adds {BASELINE!r} (before / after in the same rounds)")
    ap.add_argument("--neighbours", type=int, default=0,
                    help="busy-loop processes running beside both engines for the whole run (issue 16's busy "
                         "neighbour: more than the cores is the load that collapsed llama.cpp's spinning workers)")
    args = ap.parse_args()
    # Busy neighbours: plain Python loops at the same priority, started here and ended here by PID.
    neighbours = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.neighbours)]
    try:
        if neighbours:
            time.sleep(5)  # let the load average see them
            print(f"# {len(neighbours)} busy neighbours (pids {[n.pid for n in neighbours]}), "
                  f"load average {os.getloadavg()[0]:.1f} before the rounds")
        print(table([compare(m, args.rounds, args.tokens, args.threads, args.prefill, args.llama_bench,
                             not args.no_llama_cpp_python, args.untiled, args.baseline) for m in args.models]))
        if neighbours:
            print(f"# load average {os.getloadavg()[0]:.1f} after the rounds")
    finally:
        for n in neighbours:
            n.terminate()
        for n in neighbours:
            n.wait()
