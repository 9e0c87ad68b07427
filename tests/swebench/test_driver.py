"""The one driver of ``fak swebench run`` (``fak.swebench.driver``) on a job of its own, and the
free per-instance function (``fak.swebench.instance.run_instance``) on its own.

The fleet and the pipeline run through the driver end to end in ``test_run.py``,
``test_run_attempts.py``, ``test_run_ray.py`` and ``test_pipeline_run.py``; here the driver's
own promises: at most ``workers`` units at once, the job's order, a raising unit reported to
``failed``, one line per unit without the live table, ``Results``' order and files.

To add a case: give ``_Job`` the units (``Unit(key, fn, args)``) and check what it saw.
"""

from __future__ import annotations

import io
import json
import threading
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from fak.swebench.driver import Driver, Job, Results, ThreadPool, Unit
from fak.swebench.instance import FleetConfig, public_row, run_instance
from tiny import tools_script_fix_add


class _Job(Job):
    def __init__(self, out: Path, n: int, fail: set[int] = frozenset()):
        self.stop = threading.Event()
        self.results = Results(out, lambda final: {"final": final, "done": sorted(self.ended)},
                               order=[f"u{i}" for i in range(n)])
        self.n, self.fail = n, fail
        self.lock = threading.Lock()
        self.running = self.most = 0
        self.order: list[str] = []
        self.ended: list[str] = []
        self.errors: dict[str, str] = {}

    def _work(self, i: int) -> str:
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
            self.order.append(f"u{i}")
        time.sleep(0.05)
        with self.lock:
            self.running -= 1
        if i in self.fail:
            raise RuntimeError(f"unit {i} broke")
        return f"patch {i}"

    def units(self) -> list[Unit]:
        return [Unit(f"u{i}", self._work, (i,)) for i in range(self.n)]

    def done(self, key: str, result: str) -> None:
        self.ended.append(key)
        self.results.record(key, "m", result)

    def failed(self, key: str, exc: BaseException) -> None:
        self.errors[key] = str(exc)

    def table(self) -> Table:
        return Table(title="t")

    def line(self, key: str) -> str:
        return f"{key}: ended"


def test_the_driver_keeps_workers_and_order_and_reports_each_unit(tmp_path):
    job = _Job(tmp_path, 7, fail={3})
    buf = io.StringIO()
    summary = Driver(job, ThreadPool("t"), workers=2, console=Console(file=buf, width=120),
                     live=False, stopping="x").run()
    assert job.most <= 2 and set(job.order[:2]) == {"u0", "u1"} and len(job.order) == 7
    assert job.errors == {"u3": "unit 3 broke"}
    assert summary == {"final": True, "done": ["u0", "u1", "u2", "u4", "u5", "u6"]}
    assert sorted(buf.getvalue().splitlines()) == [f"u{i}: ended" for i in range(7)]
    preds = json.loads((tmp_path / "predictions.json").read_text())
    assert [p["instance_id"] for p in preds] == ["u0", "u1", "u2", "u4", "u5", "u6"]  # job's order
    assert json.loads((tmp_path / "summary.json").read_text())["final"] is True


def test_results_keep_earlier_entries_and_append_without_an_order(tmp_path):
    (tmp_path / "predictions.json").write_text(json.dumps(
        [{"instance_id": "b", "model_name_or_path": "m", "model_patch": "old"}]))
    res = Results(tmp_path, lambda final: {})
    res.record("a", "m", "pa")
    res.record("b", "m", "pb")
    assert [(p["instance_id"], p["model_patch"]) for p in res.predictions] == [("a", "pa"),
                                                                              ("b", "pb")]


def test_run_instance_alone_returns_the_patch_and_records_nothing(tiny, scripted, tmp_path):
    server = scripted({"fak-test__calc-1": tools_script_fix_add()})
    out = tmp_path / "out"
    cfg = FleetConfig(gateway=server.url, model="m", output=out, repos_dir=tiny["repos"])
    row = next(r for r in tiny["rows"] if r["instance_id"] == "fak-test__calc-1")
    state = run_instance(public_row(row), cfg)
    assert state.exit_reason == "submitted" and "+    return a + b" in state.patch
    assert state.patch_bytes == len(state.patch.encode())
    assert (out / "trajectories" / "fak-test__calc-1.traj.json").is_file()
    assert not (out / "predictions.json").exists() and not (out / "workspaces" / "fak-test__calc-1").exists()
    assert server.requests[0]["headers"]["x-fak-conversation"] == "out/fak-test__calc-1"
