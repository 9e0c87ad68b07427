"""Injection-quarantine cost: screening per tool message by size, and the gateway's latency with
quarantine on and off.

- Screening (``fak.quarantine.scan``, what a cache miss costs): texts of 1, 4, 16, 64 and 100 KB
  cut from the benign corpus (real source files, docs, pytest output of the task repositories;
  ``tests/data/quarantine_benign.jsonl``), and the same with an injection appended; each timed
  alone with ``perf_counter_ns``, ``REPEATS`` times; p50/p99 in µs, and the best of the repeats
  (the CPU cost without interference from the machine's other load). A digest-cache hit costs
  one SHA-256 of the text (``Screener.screen`` on a known text), reported too.
- Gateway (``fak serve`` app over ``gateway_fakes.FakeEngine``, which answers instantly, so the
  difference is the gateway's own work): one ``POST /v1/chat/completions`` with four 8 KB tool
  results, with no quarantine section, with quarantine and new results every request (every
  result scanned), and with quarantine and the same results (digest hits: an agent's history,
  sent again each turn). Client-side latency, p50/p99 over ``N_REQUESTS``.

Run: ``PYTHONPATH=python python benches/bench_quarantine.py [--repeats N] [--out FILE]``; writes
the markdown table to ``benches/results/quarantine.md`` (MEASURED, with date and CPU model).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(REPO / "tests" / "gateway"))

from fak.quarantine import Screener, scan

SIZES_KB = (1, 4, 16, 64, 100)
REPEATS = 30
N_REQUESTS = 60


def _cpu() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def _texts() -> tuple[str, str]:
    rows = [json.loads(x) for x in (REPO / "tests/data/quarantine_benign.jsonl").read_text().splitlines() if x]
    benign = "\n".join(r["content"] for r in rows if r["kind"] in ("source", "doc", "pytest"))
    inj = json.loads((REPO / "tests/data/quarantine_injected.jsonl").read_text().splitlines()[16])["content"]
    return benign, inj


def screening(repeats: int) -> list[dict]:
    benign, inj = _texts()
    out = []
    for kb in SIZES_KB:
        n = kb * 1024
        for kind, text in (("benign", benign[:n]), ("injected", benign[:n - len(inj)] + inj)):
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter_ns()
                r = scan(text)
                times.append((time.perf_counter_ns() - t0) / 1000)
            assert bool(r.fired) == (kind == "injected"), (kb, kind, r.fired)
            s = Screener()
            s.screen(text)
            hits = []
            for _ in range(repeats):
                t0 = time.perf_counter_ns()
                s.screen(text)
                hits.append((time.perf_counter_ns() - t0) / 1000)
            out.append({"kb": kb, "kind": kind, "p50": _pct(times, .5), "p99": _pct(times, .99), "best": min(times),
                        "hit_p50": _pct(hits, .5)})
            print(f"{kb:4d} KB {kind:8s} scan p50 {out[-1]['p50']:9.1f} µs p99 {out[-1]['p99']:9.1f} best "
                  f"{out[-1]['best']:9.1f}  cache hit p50 {out[-1]['hit_p50']:6.1f} µs", flush=True)
    return out


def gateway(n_requests: int) -> list[dict]:
    import httpx
    from fak.gateway import BackgroundServer, GatewayConfig, create_app
    from fak.policy import Policy
    from gateway_fakes import FakeEngine

    benign, _ = _texts()
    base = {"version": 1, "default": {"verdict": "allow", "reason": "ok"}}
    results = []
    for label, policy, fresh in (("quarantine off (policy without the section)", base, False),
                                 ("quarantine on, new results each request (scanned)", {**base, "quarantine": {}}, True),
                                 ("quarantine on, same results (digest hits)", {**base, "quarantine": {}}, False)):
        app = create_app(GatewayConfig(), engine=FakeEngine(script=[("<tool_response>", "ok")], n_ctx=1 << 20),
                         policy=Policy.from_dict(policy))
        times = []
        with BackgroundServer(app) as srv, httpx.Client(timeout=60) as http:
            for i in range(n_requests + 5):
                msgs = [{"role": "system", "content": "agent"}, {"role": "user", "content": "task"}]
                for k in range(4):
                    off = ((i * 4 + k) * 8192 if fresh else k * 8192) % (len(benign) - 8192)
                    msgs += [{"role": "assistant", "content": None, "tool_calls": [
                        {"id": f"c{k}", "type": "function", "function": {"name": "read", "arguments": "{}"}}]},
                        {"role": "tool", "tool_call_id": f"c{k}", "content": f"{i if fresh else 0}\n" + benign[off:off + 8192]}]
                t0 = time.perf_counter()
                r = http.post(srv.base_url + "/chat/completions", json={"model": "fake-qwen", "messages": msgs,
                                                                        "max_tokens": 2})
                dt = (time.perf_counter() - t0) * 1000
                assert r.status_code == 200, r.text
                if i >= 5:
                    times.append(dt)
        results.append({"label": label, "p50": _pct(times, .5), "p99": _pct(times, .99), "mean": statistics.mean(times)})
        print(f"{label:55s} p50 {results[-1]['p50']:7.2f} ms p99 {results[-1]['p99']:7.2f} ms", flush=True)
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=REPEATS)
    ap.add_argument("--requests", type=int, default=N_REQUESTS)
    ap.add_argument("--out", default=str(REPO / "benches/results/quarantine.md"))
    args = ap.parse_args()
    cpu, load0 = _cpu(), os.getloadavg()[0]
    scr = screening(args.repeats)
    gw = gateway(args.requests)
    load1 = os.getloadavg()[0]
    lines = [
        "# Injection quarantine: screening cost and gateway latency", "",
        "`benches/bench_quarantine.py` (see its docstring for what is timed). Texts are cut from the benign",
        "corpus (real files of the task repositories); \"injected\" appends an InjecAgent-style payload at the",
        "end (the scan reads everything). A scan is what a digest-cache miss costs; a hit costs one SHA-256.", "",
        f"## {date.today().isoformat()} — MEASURED", "",
        f"Machine: `lscpu` model **{cpu}**, {os.cpu_count()} cores, Python {platform.python_version()}; shared "
        f"with other engineers' builds and tests: load average {load0:.1f} → {load1:.1f} during the run, so",
        "p99 includes preemption; `best` is the fastest repeat (the CPU cost without interference).", "",
        f"Command: `PYTHONPATH=python python benches/bench_quarantine.py --repeats {args.repeats} --requests "
        f"{args.requests}`", "",
        "Screening one tool message (`fak.quarantine.scan`), µs:", "",
        "| size | content | p50 µs | p99 µs | best µs | digest hit p50 µs |", "|---:|---|---:|---:|---:|---:|",
    ]
    for r in scr:
        lines.append(f"| {r['kb']} KB | {r['kind']} | {r['p50']:.0f} | {r['p99']:.0f} | {r['best']:.0f} | "
                     f"{r['hit_p50']:.0f} |")
    lines += ["", "Gateway, one chat completion with four 8 KB tool results (fake engine: no model time), ms:",
              "", "| setting | p50 ms | p99 ms | mean ms |", "|---|---:|---:|---:|"]
    for r in gw:
        lines.append(f"| {r['label']} | {r['p50']:.2f} | {r['p99']:.2f} | {r['mean']:.2f} |")
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
