"""Sandbox overhead: start + ``true``, and a typical agent command (``grep -rn ... | head``) over a
real repository clone, p50/p99 in milliseconds, for:

- ``host``: ``bash -c`` with no isolation at all (the floor);
- ``unshare -n``: what the agent's bash ran before ``fak.sandbox`` (network namespace only);
- ``bwrap``: ``Sandbox(method="bwrap").run(...)`` — everything a real call does (pids cgroup made
  and removed, launcher with rlimits, bwrap, output collection);
- ``unshare``: the same through the ``unshare`` fallback (``_nsinit.py`` as PID 1).

Runs are interleaved (one of each peer per round), so machine load hits all peers alike. The
repository is a clone of ``psf/requests`` at the base commit of ``psf__requests-2931`` from the
local mirror (``~/.cache/fak/repos``); without it, the grep runs over this checkout.

Run: ``PYTHONPATH=python python benches/bench_sandbox.py [--rounds N] [--json FILE]`` or
``PYTHONPATH=python python -m pytest benches/bench_sandbox.py --benchmark-only -s``.
Results are recorded in ``benches/results/sandbox.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))

from fak.sandbox import Sandbox, probe  # noqa: E402
from fak.sandbox.config import build_env, host_home  # noqa: E402

GREP = "grep -rn 'def ' --include='*.py' . | head -20"


def machine() -> dict:
    """CPU model (``lscpu`` model name), cores, load, kernel, bwrap version."""
    cpu = platform.machine()
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        cpu = next(ln.split(":", 1)[1].strip() for ln in out.splitlines()
                   if ln.startswith("Model name"))
    except (OSError, StopIteration):
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2),
            "kernel": platform.release(), "python": platform.python_version(),
            "bwrap": probe().bwrap_version, "date": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                  time.gmtime())}


def workspace(tmp: Path) -> tuple[Path, str]:
    """A clone of psf/requests at a SWE-bench base commit (the local mirror), else this repo."""
    shared = Path("/work/shared/swebench/verified-smoke.jsonl")
    try:
        from fak.swebench.repos import ensure_mirror, make_workspace

        row = next(json.loads(ln) for ln in shared.read_text().splitlines()
                   if "psf__requests-2931" in ln)
        mirror = ensure_mirror(row["repo"], None, commit=row["base_commit"])
        ws = make_workspace(mirror, row["base_commit"], tmp / "requests")
        return Path(ws.root), f"psf/requests @ {row['base_commit'][:10]}"
    except Exception as e:  # noqa: BLE001 - the bench still runs, over this checkout
        return REPO, f"this checkout (no requests mirror: {type(e).__name__})"


def peers(ws: Path) -> dict:
    """name → callable(command) running ``bash -c command`` that way."""
    env = build_env({"LC_ALL": "C.UTF-8"}, home=host_home(), net="none")
    bw = Sandbox(ws, method="bwrap")
    us = Sandbox(ws, method="unshare")

    def host(cmd: str) -> None:
        subprocess.run(["bash", "-c", cmd], cwd=ws, env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, start_new_session=True)

    def unshare_n(cmd: str) -> None:  # the bash tool before fak.sandbox
        subprocess.run(["unshare", "-n", "bash", "-c", f"ip link set lo up 2>/dev/null\n{cmd}"],
                       cwd=ws, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       start_new_session=True)

    return {"host": host, "unshare -n": unshare_n,
            "bwrap": lambda cmd: bw.run(["bash", "-c", cmd]),
            "unshare": lambda cmd: us.run(["bash", "-c", cmd])}


def measure(rounds: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="fak-bench-sandbox-") as tmp:
        ws, ws_name = workspace(Path(tmp))
        runners = peers(ws)
        commands = {"true": "true", "grep | head": GREP}
        times: dict[str, dict[str, list[float]]] = {c: {p: [] for p in runners} for c in commands}
        for cmd_name, cmd in commands.items():
            for fn in runners.values():  # warm caches
                fn(cmd)
            for _ in range(rounds):
                for name, fn in runners.items():
                    t0 = time.perf_counter()
                    fn(cmd)
                    times[cmd_name][name].append((time.perf_counter() - t0) * 1000)
    out = {"machine": machine(), "workspace": ws_name, "rounds": rounds, "grep": GREP,
           "results": {}}
    for cmd_name, per in times.items():
        for name, ts in per.items():
            ts.sort()
            out["results"].setdefault(cmd_name, {})[name] = {
                "p50_ms": round(statistics.median(ts), 2),
                "p99_ms": round(ts[min(len(ts) - 1, int(len(ts) * 0.99))], 2),
                "min_ms": round(ts[0], 2)}
    return out


def table(res: dict) -> str:
    lines = ["| command | peer | p50 ms | p99 ms | min ms |", "|---|---|---|---|---|"]
    for cmd_name, per in res["results"].items():
        for name, r in per.items():
            lines.append(f"| `{cmd_name}` | {name} | {r['p50_ms']} | {r['p99_ms']} | "
                         f"{r['min_ms']} |")
    return "\n".join(lines)


def test_sandbox_start_overhead(benchmark):
    """pytest-benchmark: one bwrap sandbox start + ``true`` per round."""
    with tempfile.TemporaryDirectory() as tmp:
        sb = Sandbox(Path(tmp), method="bwrap")
        benchmark(lambda: sb.run(["true"]))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    result = measure(a.rounds)
    print(json.dumps(result["machine"]), result["workspace"])
    print(table(result))
    if a.json:
        a.json.write_text(json.dumps(result, indent=1))
