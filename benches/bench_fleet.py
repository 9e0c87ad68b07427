"""Fleet throughput: instances per hour and tokens/s with 1, 4 and 8 workers on one server.

Peers (chosen by environment variables):

- default: the scripted OpenAI-compatible server (``fak.agent.scripted``) answering each turn after
  ``FAK_BENCH_TURN_S`` seconds (default 0.2 s, a stand-in for decode time), on 8 tiny SWE-bench-
  shaped instances (``tests/swebench/tiny.py``). This measures the fleet itself (workspaces,
  tools, HTTP, trajectory writes) and how it overlaps model time; it says nothing about an engine.
- ``FAK_BENCH_GGUF=MODEL.gguf``: the real engine. One ``fak serve`` (``fak.swebench.serve``: the
  coding-agent policy, ``--backend`` from ``FAK_BENCH_BACKEND``, default ``cpu``; n_ctx
  ``FAK_BENCH_N_CTX``, default 4096; KV cache n_ctx x 8) is started once and serves every worker
  count, on the same slice: ``FAK_BENCH_INSTANCES`` (default 8) copies of the tiny ``add`` bug, each
  bounded to ``FAK_BENCH_MAX_STEPS`` turns (default 4) of at most ``FAK_BENCH_MAX_TOKENS`` tokens
  (default 128). The agents send the same system prompt and tools (the shared prefix a prefix cache
  reuses) and differ from the first model turn on.
- ``FAK_BENCH_GATEWAY=HOST:PORT`` (with ``FAK_BENCH_MODEL``, ``FAK_BENCH_DATASET``,
  ``FAK_BENCH_FILTER``, ``FAK_BENCH_REPOS``): a server already running, on a real slice.

Run: ``PYTHONPATH=python python -m pytest benches/bench_fleet.py --benchmark-only -s``.
The numbers land in the benchmark's ``extra_info`` and on stdout as one JSON line per worker count
(MEASURED on the machine that ran them); ``benches/results/fleet.md`` records them.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "swebench"))

from tiny import make_instances, tools_script_fix_add  # noqa: E402

from fak.agent.scripted import ScriptedServer  # noqa: E402
from fak.swebench.dataset import select  # noqa: E402
from fak.swebench.fleet import Fleet  # noqa: E402
from fak.swebench.instance import FleetConfig  # noqa: E402

N_INSTANCES = int(os.environ.get("FAK_BENCH_INSTANCES", "8"))


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, str(default)))


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    if os.environ.get("FAK_BENCH_GATEWAY"):
        rows, _ = select(os.environ["FAK_BENCH_DATASET"], os.environ.get("FAK_BENCH_FILTER", "smoke"))
        yield {"gateway": os.environ["FAK_BENCH_GATEWAY"], "rows": rows,
               "model": os.environ.get("FAK_BENCH_MODEL", "default"), "peer": "external server",
               "repos": Path(os.environ["FAK_BENCH_REPOS"]) if os.environ.get("FAK_BENCH_REPOS") else None,
               "max_steps": _env_int("FAK_BENCH_MAX_STEPS", 30),
               "sampling": {"temperature": 0.0, "max_tokens": _env_int("FAK_BENCH_MAX_TOKENS", 1024)}}
        return
    tiny = make_instances(tmp_path_factory.mktemp("fleet"))
    base = tiny["rows"][0]
    rows = [dict(base, instance_id=f"fak-test__calc-{i}") for i in range(N_INSTANCES)]
    if os.environ.get("FAK_BENCH_GGUF"):
        from fak.swebench.serve import ManagedGateway

        gguf = Path(os.environ["FAK_BENCH_GGUF"])
        n_ctx = _env_int("FAK_BENCH_N_CTX", 4096)
        server = ManagedGateway(gguf, tmp_path_factory.mktemp("serve"),
                                backend=os.environ.get("FAK_BENCH_BACKEND", "cpu"), n_ctx=n_ctx,
                                kv_cache_tokens=n_ctx * 8).start()
        try:
            yield {"gateway": server.addr, "rows": rows, "model": server.model, "repos": tiny["repos"],
                   "peer": f"fak serve {gguf.name} ({server.backend}, n_ctx {n_ctx})",
                   "max_steps": _env_int("FAK_BENCH_MAX_STEPS", 4),
                   "sampling": {"temperature": 0.0, "max_tokens": _env_int("FAK_BENCH_MAX_TOKENS", 128)}}
        finally:
            server.stop()
        return
    delay = float(os.environ.get("FAK_BENCH_TURN_S", "0.2"))
    script = {"*": [dict(t, delay_s=delay) for t in tools_script_fix_add()]}
    server = ScriptedServer(script).start()
    yield {"gateway": server.url, "rows": rows, "model": "scripted", "repos": tiny["repos"],
           "peer": f"scripted server ({delay:g} s per turn)", "max_steps": 30,
           "sampling": {"temperature": 0.0, "max_tokens": 1024}}
    server.stop()


@pytest.mark.parametrize("workers", [1, 4, 8])
def test_fleet_throughput(benchmark, setup, workers, tmp_path):
    def run_once():
        out = tmp_path / f"out-{len(list(tmp_path.iterdir()))}"
        cfg = FleetConfig(gateway=setup["gateway"], model=setup["model"], output=out,
                          workers=workers, repos_dir=setup["repos"], live=False,
                          max_steps=setup["max_steps"], sampling=dict(setup["sampling"]))
        return Fleet(cfg, setup["rows"]).run()

    summary = benchmark.pedantic(run_once, rounds=1, iterations=1)
    assert summary["n_finished"] == len(setup["rows"])
    t = summary["totals"]
    benchmark.extra_info.update({
        "provenance": "MEASURED", "machine": f"{platform.node()} {os.cpu_count()} cpu",
        "peer": setup["peer"], "workers": workers, "instances": summary["n_finished"],
        "steps": t["steps"], "prompt_tokens": t["prompt_tokens"],
        "completion_tokens": t["completion_tokens"], "exit_reasons": summary["exit_reasons"],
        "instances_per_hour": summary["instances_per_hour"],
        "completion_tok_s": summary["completion_tok_per_wall_s"],  # fleet throughput (wall)
        "decode_tok_s": summary["completion_tok_s"],  # one sequence's decode speed (server timings)
        "prompt_tok_s": summary["prompt_tok_per_wall_s"],
        "wall_s": summary["wall_s"],
    })
    print(json.dumps(benchmark.extra_info))
