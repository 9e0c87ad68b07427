"""Local grading without Docker (``fak swebench eval --local``): the official harness's steps in a
virtual environment, its log parsers and its resolution rule.

Per prediction (the harness's ``run_instance`` + eval script, ``swebench`` 4.1.0):

1. empty ``model_patch`` → ``empty_patch_ids`` (not run, as the harness);
2. a clone of the repository at ``base_commit`` (local mirror, ``--repos``);
3. ``model_patch`` applied: ``git apply --verbose`` (``fak.gitsafe.git``: the clone's own
   configuration is never read), then ``patch --batch --fuzz=5 -p1`` in the sandbox (the
   harness's fallbacks); a patch that names git metadata (``.git``) is not applied; if neither
   applies → ``error_ids`` with status ``patch_apply_failed`` (the harness also counts it as an
   error);
4. the env of (repo, version) built or reused (``fak.swebench.envs``, on the host: no model code
   is involved), and a per-instance overlay venv over it (``make_overlay``, as ``run
   --task-env`` does); ``pre_install`` (minus machine-changing steps) and ``install`` run in the
   clone **in fak's sandbox** (``fak.sandbox``: the model's patch is in the clone, so
   ``setup.py`` is model code) with the host's network (pip) and only the clone and the overlay
   writable: the shared env, which fak's host-side steps run later, stays read-only;
5. in the sandbox with **no network** (loopback only, plus for ``psf/requests`` a tarpit for
   10.0.0.0/8 inside the sandbox's network namespace so that its connect-timeout tests time out
   as on the internet, ``NETNS_SETUP``; nothing leaves the machine), the clone the only writable
   tree (its ``.git`` read-only) and the env read-only: the test files reset to ``base_commit``
   and ``test_patch`` applied first, on the host through ``fak.gitsafe`` (the harness's eval
   script does both in the container), then the spec's ``test_cmd`` (``pytest`` as ``python -m pytest`` of the overlay,
   ``overlay_test_command``) on the test files of ``test_patch`` (``get_test_directives``)
   between the harness's ``>>>>> Start Test Output`` / ``>>>>> End Test Output`` markers;
6. the log graded by ``swebench.harness.grading.get_eval_report`` (the package's log parser for
   the repository; FAIL_TO_PASS and PASS_TO_PASS must all pass).

The report has the keys of the official run report (``make_run_report``) plus ``"grading":
"local"``, ``patch_apply_failed_ids``, per-instance details and what could not be reproduced.
"""

from __future__ import annotations

import concurrent.futures as cf
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fak.agent.trajectory import write_json_atomic
from fak.sandbox import Limits, MiB, Sandbox, probe, run_on_host, venv_paths
from fak.swebench.dataset import parse_test_list
from fak.swebench.envs import (
    SYSTEM_COMMAND,
    Env,
    EnvBuilder,
    EnvError,
    get_spec,
    make_overlay,
    overlay_environment,
    overlay_test_command,
)
from fak.gitsafe import git, patch_git_metadata
from fak.swebench.repos import RepoError, ensure_mirror, make_workspace

START = ">>>>> Start Test Output"
END = ">>>>> End Test Output"
APPLY_FAIL = ">>>>> Patch Apply Failed"

#: commands run inside the sandbox's network namespace before the tests, per repository (trusted:
#: run as root there, before the sandboxed command; ``Sandbox(net_setup=...)``)
NETNS_SETUP: dict[str, list[str]] = {
    "psf/requests": [
        # connect timeouts (its tests dial 10.255.255.1 expecting no answer): a veth pair inside
        # the namespace, a static neighbour entry, and frames that the peer drops (wrong MAC);
        # nothing leaves the namespace.
        "ip link add fak-tarpit type veth peer name fak-tarpit1 && "
        "ip addr add 10.255.255.254/8 dev fak-tarpit && ip link set fak-tarpit up && "
        "ip link set fak-tarpit1 up && "
        "ip neigh replace 10.255.255.1 lladdr 02:00:00:00:00:01 dev fak-tarpit nud permanent",
    ],
}


@dataclass
class LocalGrader:
    """Grades predictions against ``rows`` (dataset rows by id) into ``output``.

    ``repos_dir``: local mirrors (else GitHub clone cache); ``envs``: env cache root; ``workers``:
    instances at once (instances sharing an env run one after another); ``timeout_s``: test run
    limit per instance (seconds, the harness's default 1800; also the limit of each install
    step); ``unsafe_no_sandbox``: run installs and tests on the host, without ``fak.sandbox``
    (only when asked).
    """

    rows: dict[str, dict[str, Any]]
    output: Path
    repos_dir: Path | None = None
    envs: Path | None = None
    workers: int = 1
    timeout_s: float = 1800.0
    unsafe_no_sandbox: bool = False
    run_id: str = "local"
    keep_workspaces: bool = False

    def __post_init__(self) -> None:
        self.output = Path(self.output)
        self.builder = EnvBuilder(self.envs)

    # -- one instance --------------------------------------------------------------------------

    def grade(self, pred: dict[str, Any]) -> dict[str, Any]:
        """Grade one prediction; returns its detail dict (``status`` one of ``resolved``,
        ``unresolved``, ``empty_patch``, ``patch_apply_failed``, ``error``)."""
        iid = pred["instance_id"]
        row = self.rows[iid]
        t0 = time.time()
        detail: dict[str, Any] = {"instance_id": iid, "status": "error", "resolved": False}
        patch = pred.get("model_patch")
        if patch in ("", None):
            detail["status"] = "empty_patch"
            return detail
        log_dir = self.output / "logs" / iid
        log_dir.mkdir(parents=True, exist_ok=True)
        detail["log_dir"] = str(log_dir)
        try:
            detail.update(self._grade(row, pred, log_dir))
        except (RepoError, EnvError, OSError) as e:
            detail["status"], detail["error"] = "error", f"{type(e).__name__}: {e}"
        detail["wall_s"] = round(time.time() - t0, 3)
        return detail

    def _grade(self, row: dict[str, Any], pred: dict[str, Any], log_dir: Path) -> dict[str, Any]:
        from swebench.harness.grading import get_eval_report
        from swebench.harness.test_spec.python import get_test_directives
        from swebench.harness.test_spec.test_spec import TestSpec
        from swebench.harness.utils import get_modified_files

        iid, repo, version = row["instance_id"], row["repo"], str(row["version"])
        spec = get_spec(repo, version)
        mirror = ensure_mirror(repo, self.repos_dir, commit=row["base_commit"])
        key = EnvBuilder.key(repo, version)
        work_root = Path(tempfile.mkdtemp(prefix=f"fak-grade-{iid}-"))
        try:
            ws = make_workspace(mirror, row["base_commit"], work_root / "repo")
            apply_log = self._apply_model_patch(ws.root, pred["model_patch"], work_root)
            (log_dir / "patch.diff").write_text(pred["model_patch"])
            if apply_log is None:
                (log_dir / "test_output.txt").write_text(APPLY_FAIL + "\n")
                return {"status": "patch_apply_failed", "error": "model_patch does not apply"}
            with self.builder.lock(key):
                env = self.builder.ensure(repo, version, mirror,
                                          row.get("environment_setup_commit") or row["base_commit"])
            # the model's patch is in the clone (setup.py is model code): it is installed into
            # a per-instance overlay, in the sandbox; the shared env stays read-only
            skipped = [c for c in spec.get("pre_install", []) if SYSTEM_COMMAND.search(c)]
            overlay = make_overlay(env, work_root / "env", ws.root, log_dir / "install.log",
                                   unsafe_no_sandbox=self.unsafe_no_sandbox,
                                   timeout_s=self.timeout_s)
            test_files = get_modified_files(row["test_patch"])
            test_cmd = spec["test_cmd"][-1] if isinstance(spec["test_cmd"], list) else spec["test_cmd"]
            command = " ".join([overlay_test_command(test_cmd), *get_test_directives(row)])
            self._prepare_tests(ws.root, row, test_files, log_dir / "eval_setup.log")
            script = self._eval_script(spec, command)
            (log_dir / "eval.sh").write_text(script)
            rc, timed_out = self._run_tests(overlay, overlay_environment(overlay, env), ws.root,
                                            script, repo, log_dir / "test_output.txt")
            spec_obj = TestSpec(instance_id=iid, repo=repo, version=version, repo_script_list=[],
                                eval_script_list=[], env_script_list=[], arch="x86_64",
                                FAIL_TO_PASS=parse_test_list(row.get("FAIL_TO_PASS")),
                                PASS_TO_PASS=parse_test_list(row.get("PASS_TO_PASS")), language="py",
                                docker_specs={}, namespace=None)
            report = get_eval_report(spec_obj, pred, str(log_dir / "test_output.txt"),
                                     include_tests_status=True)
            write_json_atomic(log_dir / "report.json", report)
            entry = report[iid]
            out = {"status": "resolved" if entry["resolved"] else "unresolved",
                   "resolved": bool(entry["resolved"]), "tests_status": entry.get("tests_status"),
                   "patch_successfully_applied": entry["patch_successfully_applied"],
                   "test_exit_code": rc, "timed_out": timed_out, "env": env.key,
                   "unreproduced": overlay.unreproduced + [f"not run: {c}" for c in skipped]}
            if not entry["patch_successfully_applied"]:
                out["status"] = "error"
                out["error"] = "the test log has no test output (test patch failed or tests crashed)"
            return out
        finally:
            if self.keep_workspaces:
                shutil.move(str(work_root), str(log_dir / "workspace"))
            else:
                shutil.rmtree(work_root, ignore_errors=True)

    def _apply_model_patch(self, root: Path, patch: str, tmp: Path) -> str | None:
        """Apply the model's patch as the harness does (``git apply --verbose``, else GNU
        ``patch --batch --fuzz=5 -p1``); the apply log, or ``None`` when neither applies. A
        patch that names git metadata (``fak.gitsafe.patch_git_metadata``) is never applied.
        git runs on the host through ``fak.gitsafe.git`` (no repository configuration read);
        GNU ``patch``, a large parser of model-written input (ed scripts included), runs in the
        sandbox with the clone's ``.git`` read-only."""
        data = (patch if patch.endswith("\n") else patch + "\n").encode("utf-8", "surrogateescape")
        (tmp / "model.patch").write_bytes(data)
        if patch_git_metadata(patch) is not None:
            return None
        proc = git(root, "apply", "--verbose", "-", input=data, check=False, text=False)
        if proc.returncode == 0:
            return (proc.stdout + proc.stderr).decode("utf-8", "replace")
        argv = ["patch", "--batch", "--fuzz=5", "-p1"]
        if self.unsafe_no_sandbox:
            res = run_on_host(argv, cwd=root, env={"PATH": "/usr/bin:/bin", "LC_ALL": "C"},
                              timeout_s=300, stdin=data)
        else:
            res = Sandbox(root, readonly=[root / ".git"], timeout_s=300).run(argv, stdin=data)
        if res.returncode == 0:
            return res.output
        git(root, "checkout", "--", ".", check=False)  # undo a partial application
        return None

    @staticmethod
    def _limits() -> Limits:
        """Task suites' limits: more processes and output than the agent's commands get."""
        return Limits(processes=1024, output_bytes=256 * MiB)

    @staticmethod
    def _prepare_tests(root: Path, row: dict[str, Any], test_files: list[str],
                       log_path: Path) -> None:
        """The harness eval script's git steps, on the host through ``fak.gitsafe.git`` before
        the sandboxed test run (so that run needs no write to ``.git``, which stays read-only
        there as in every sandbox): the test files reset to ``base_commit``, then ``test_patch``
        applied (``git apply -v``; a failure is logged and the tests run anyway, as the
        harness's script does). Their output goes to ``log_path``."""
        out = []
        if test_files:
            proc = git(root, "checkout", "-q", row["base_commit"], "--", *test_files, check=False)
            out.append(f"$ git checkout -q {row['base_commit']} -- {' '.join(test_files)}\n"
                       f"{proc.stdout}{proc.stderr}[exit {proc.returncode}]\n")
        proc = git(root, "apply", "-v", "-", input=row["test_patch"], check=False)
        out.append(f"$ git apply -v - (test_patch)\n{proc.stdout}{proc.stderr}"
                   f"[exit {proc.returncode}]\n")
        log_path.write_text("".join(out))

    @staticmethod
    def _eval_script(spec: dict[str, Any], command: str) -> str:
        """What runs in the sandbox: the spec's eval exports (machine-changing ones left out),
        then ``command`` between the harness's start and end markers; its exit status."""
        exports = [c for c in spec.get("eval_commands", []) if not SYSTEM_COMMAND.search(c)]
        lines = ["set -uo pipefail", *exports, f"echo '{START}'", command, "rc=$?",
                 f"echo '{END}'", "exit $rc"]
        return "\n".join(lines) + "\n"

    def _run_tests(self, env: Env, variables: dict[str, str], root: Path, script: str,
                   repo: str, log_path: Path) -> tuple[int | None, bool]:
        """The eval script in the sandbox (no network, the clone the only writable tree and its
        ``.git`` read-only, the env's paths read-only as taken when fak made it); ``variables``: the env's ``PATH`` and
        ``VIRTUAL_ENV``. Returns (exit status, timed out)."""
        if self.unsafe_no_sandbox:
            res = run_on_host(["bash", "-c", script], cwd=root,
                              env={**env.environ(), **variables}, timeout_s=self.timeout_s,
                              limits=self._limits(), stdout_path=log_path)
        else:
            sandbox = Sandbox(root, readable=env.sandbox_paths or venv_paths(env.path),
                              readonly=[root / ".git"], env=variables, timeout_s=self.timeout_s,
                              net="none", limits=self._limits(),
                              net_setup=NETNS_SETUP.get(repo, ()))
            res = sandbox.run(["bash", "-c", script], stdout_path=log_path)
        if res.killed is not None:
            with log_path.open("a") as log:
                if res.killed == "timeout":
                    log.write(f"\n>>>>> Tests Timed Out after {self.timeout_s:g} s\n")
                else:
                    log.write(f"\n>>>>> fak sandbox: {res.note}\n")
        return res.returncode, res.killed == "timeout"

    # -- all predictions -----------------------------------------------------------------------

    def run(self, predictions: list[dict[str, Any]],
            on_done: Callable[[str, dict[str, Any]], None] | None = None) -> dict[str, Any]:
        """Grade every prediction whose instance is in the dataset; write and return the report.
        ``on_done(instance_id, detail)`` is called as each instance's grading ends (a progress
        bar)."""
        self.output.mkdir(parents=True, exist_ok=True)
        preds = {p["instance_id"]: p for p in predictions}
        known = [p for iid, p in preds.items() if iid in self.rows]
        details: dict[str, dict[str, Any]] = {}
        with cf.ThreadPoolExecutor(max_workers=max(1, self.workers)) as ex:
            futs = {ex.submit(self.grade, p): p["instance_id"] for p in known}
            for fut in cf.as_completed(futs):
                iid = futs[fut]
                try:
                    details[iid] = fut.result()
                except Exception as e:  # noqa: BLE001 - one bad instance must not sink the rest
                    details[iid] = {"instance_id": iid, "status": "error",
                                    "error": f"{type(e).__name__}: {e}"}
                if on_done is not None:
                    on_done(iid, details[iid])
        return self._report(preds, details)

    def _report(self, preds: dict[str, Any], details: dict[str, dict[str, Any]]) -> dict[str, Any]:
        def ids(*statuses: str) -> list[str]:
            return sorted(i for i, d in details.items() if d["status"] in statuses)

        resolved, unresolved = ids("resolved"), ids("unresolved")
        errors = ids("error", "patch_apply_failed")
        empty = ids("empty_patch")
        completed = sorted(resolved + unresolved)
        incomplete = sorted(set(self.rows) - set(preds))
        report = {
            "total_instances": len(self.rows),
            "submitted_instances": len(preds),
            "completed_instances": len(completed),
            "resolved_instances": len(resolved),
            "unresolved_instances": len(unresolved),
            "empty_patch_instances": len(empty),
            "error_instances": len(errors),
            "completed_ids": completed,
            "incomplete_ids": incomplete,
            "empty_patch_ids": empty,
            "submitted_ids": sorted(preds),
            "resolved_ids": resolved,
            "unresolved_ids": unresolved,
            "error_ids": errors,
            "schema_version": 2,
            "grading": "local",
            "run_id": self.run_id,
            "patch_apply_failed_ids": ids("patch_apply_failed"),
            "unknown_ids": sorted(set(preds) - set(self.rows)),
            "network": "host (unsafe, no sandbox)" if self.unsafe_no_sandbox
                       else "none (loopback only, fak sandbox)",
            "sandbox": {"unsafe_no_sandbox": self.unsafe_no_sandbox,
                        **({} if self.unsafe_no_sandbox else
                           {"method": probe().method, "detail": probe().detail})},
            "instances": dict(sorted(details.items())),
        }
        write_json_atomic(self.output / "report.json", report)
        return report
