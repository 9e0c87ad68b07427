"""Fleet throughput: instances per hour and completion tokens/s with 1, 4 and 8 workers.

Default peer: the scripted OpenAI-compatible server (``fak.agent.scripted``) answering each turn
after ``FAK_BENCH_TURN_S`` seconds (default 0.2 s, a stand-in for decode time), on 8 tiny
SWE-bench-shaped instances (``tests/swebench/tiny.py``). This measures the fleet itself
(workspaces, tools, HTTP, trajectory writes) and how it overlaps model time; it says nothing about
an engine. With ``FAK_BENCH_GATEWAY=HOST:PORT`` (and ``FAK_BENCH_MODEL``, ``FAK_BENCH_DATASET``,
``FAK_BENCH_FILTER``, ``FAK_BENCH_REPOS``) the same bench drives a real ``fak serve``.

Run: ``PYTHONPATH=python python -m pytest benches/bench_fleet.py --benchmark-only -s``.
The numbers land in the benchmark's ``extra_info`` (MEASURED on the machine that ran them).
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
from fak.swebench.run import Fleet, FleetConfig  # noqa: E402

N_INSTANCES = 8


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    if os.environ.get("FAK_BENCH_GATEWAY"):
        rows, _ = select(os.environ["FAK_BENCH_DATASET"], os.environ.get("FAK_BENCH_FILTER", "smoke"))
        yield {"gateway": os.environ["FAK_BENCH_GATEWAY"], "rows": rows,
               "model": os.environ.get("FAK_BENCH_MODEL", "default"),
               "repos": Path(os.environ["FAK_BENCH_REPOS"]) if os.environ.get("FAK_BENCH_REPOS") else None}
        return
    tiny = make_instances(tmp_path_factory.mktemp("fleet"))
    base = tiny["rows"][0]
    rows = [dict(base, instance_id=f"fak-test__calc-{i}") for i in range(N_INSTANCES)]
    delay = float(os.environ.get("FAK_BENCH_TURN_S", "0.2"))
    script = {"*": [dict(t, delay_s=delay) for t in tools_script_fix_add()]}
    server = ScriptedServer(script).start()
    yield {"gateway": server.url, "rows": rows, "model": "scripted", "repos": tiny["repos"]}
    server.stop()


@pytest.mark.parametrize("workers", [1, 4, 8])
def test_fleet_throughput(benchmark, setup, workers, tmp_path):
    def run_once():
        out = tmp_path / f"out-{len(list(tmp_path.iterdir()))}"
        cfg = FleetConfig(gateway=setup["gateway"], model=setup["model"], output=out,
                          workers=workers, repos_dir=setup["repos"], live=False)
        return Fleet(cfg, setup["rows"]).run()

    summary = benchmark.pedantic(run_once, rounds=1, iterations=1)
    assert summary["n_finished"] == len(setup["rows"])
    benchmark.extra_info.update({
        "provenance": "MEASURED", "machine": f"{platform.node()} {os.cpu_count()} cpu",
        "peer": "scripted server" if not os.environ.get("FAK_BENCH_GATEWAY") else setup["gateway"],
        "workers": workers, "instances": summary["n_finished"],
        "instances_per_hour": summary["instances_per_hour"],
        "completion_tok_s": summary["completion_tok_s"], "wall_s": summary["wall_s"],
    })
    print(json.dumps(benchmark.extra_info))
