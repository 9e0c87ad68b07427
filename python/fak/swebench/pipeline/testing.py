"""Stage 4b/5a, ``test``: run the reproduction scripts and the regression tests, first on the
original code, then with each candidate applied; everything through ``execute.run_in_sandbox``.

The task's environment (``prepare``): a clone of the mirror at ``base_commit`` and, with
``task_env``, the (repo, version) venv of the harness spec with a per-instance overlay in which
the repository is installed (``fak.swebench.envs``, as ``fak swebench run --task-env`` does);
without it, the host's Python (``sys.executable``'s folder first on ``PATH``; its venv and base
interpreter bound read-only into the sandbox, which hides ``$HOME`` and ``/tmp``:
``fak.sandbox.interpreter_paths``), for repositories that need nothing installed.

Evidence only from runs that started (``evidence.py`` has the rule): a run that could not start
(exit 126/127, bwrap's own error such as ``bwrap: execvp python``, the harness module missing)
is an environment error — a script is then never kept as a reproduction, a regression base has
no passing tests, a candidate's script run is no result (``repro_env_error``) and its
regression run gives no ``regression_failures`` (``regression_env_error`` instead); the
``schedule`` record lists them all (``env_errors``).

- Reproduction scripts (``reproduce``) run on the original code as ``python .fak/repro_ID.py``
  with the repository on ``PYTHONPATH``; a script is *kept* when it fails there (non-zero exit,
  not killed) with an error that a source change can fix — not a ``SyntaxError`` of its own, not
  a module that cannot be imported (``evidence.UNFIXABLE``), not a ``NameError`` raised in the
  script's own code (a name the script never defined; ``evidence.SCRIPT_BUGS``).
- Candidates, most votes first, at most ``repro_candidates``: applied with ``git apply``; each
  kept script (the quickest on the original code first) passes (exit 0) or not
  (``repro_fixed`` counts those that pass).
- Regression tests, for the best ``candidates`` of those (most scripts fixed, then most votes):
  the existing test files of the modules the candidate touches (``find_test_files``), run with
  the spec's ``test_cmd`` (``pytest`` as ``python -m pytest`` of the overlay's interpreter; host:
  ``python -m pytest -rA``) and read with the repository's log parser from ``swebench``, on the
  original code and with the candidate; the tests that passed on the original code and no longer
  pass are its ``regression_failures``. Scripts are cheap (one interpreter start) and test files
  are not (a sympy module's tests take up to minutes), hence the two budgets.

Bounded and scheduled (issue 31; ``schedule.py``): the runs go to ``workers`` workers, each in its
own copy of the work tree (``TaskEnv.copy``), cheapest and most discriminating first — the
scripts before the test files, each test file on its own, the candidates' runs of a file ordered
by how long its base run took. A per-instance ``budget_s`` (wall seconds from the stage's start;
the clone and the environment's set-up before it are not counted) cuts what cannot start in it
and what it interrupts; a per-candidate limit bounds a candidate that makes the scripts or the
tests hang. What was cut, and why, is in the records (``cut``, ``regression_partial``, the
``schedule`` record); rank then works with less evidence for that instance.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from fak.gitsafe import git, patch_git_metadata
from fak.swebench.envs import SYSTEM_PATH, overlay_test_command
from fak.sandbox import interpreter_paths
from fak.swebench.pipeline.behaviour import outcome
from fak.swebench.pipeline.evidence import could_not_start, script_record, tail
from fak.swebench.pipeline.execute import RunResult, run_in_sandbox, sandbox_kind
from fak.swebench.pipeline.schedule import Budget, Cut, Pool, Slot, budget_killed, limit
from fak.swebench.pipeline.source import Repo, is_test_path, module_name

PASS = ("PASSED", "XFAIL")
HOST_TEST_CMD = "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 python -m pytest -rA -p no:cacheprovider"


#: at most this many test workers by default: round by round there are rarely more runs ready
#: (``max_scripts`` scripts; ``candidates`` x a module's ``regression_files``), and each worker
#: holds its own copy of the work tree and a test process
MAX_WORKERS = 8
#: a candidate's run of a test file may take this many times the file's base run (or the
#: candidate limit, whichever is larger) before it is killed as a timeout
SLOW_FACTOR = 4.0


def default_workers(instances: int = 1) -> int:
    """Test workers per instance when none are asked for: the cores this process may use
    (``os.sched_getaffinity``) shared by the ``instances`` run at once, at least 1, at most
    ``MAX_WORKERS``."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(MAX_WORKERS, cores // max(1, instances)))


@dataclass
class TestConfig:
    """``timeout_s`` per test-file run, ``script_timeout_s`` per script run (seconds);
    ``repro_candidates``: candidates the kept reproduction scripts run on (most votes first);
    ``candidates``: of those, the best by scripts fixed then votes, the ones whose regression
    tests run; ``regression_files`` test files per touched module.

    Bounds (issue 31): ``budget_s``, the instance's test budget (wall seconds from the stage's
    start; runs that cannot start in it are cut and recorded, one that it interrupts is cut
    too); ``candidate_limit_s``, what one candidate's kept scripts may take together (seconds),
    and the timeout of a candidate's run of one test file unless ``SLOW_FACTOR`` times the
    file's base run is longer (never over ``timeout_s``);
    ``workers``, runs at once, each in its own copy of the work tree (0: ``default_workers()``).
    The default budget, 600 s: the test stages of the 14 smoke instances recorded in
    ``benches/results/swebench-gpu-2026-12-02`` took 67-462 s each on one worker, and
    sympy-23534 1,463 s (a two-file module whose base run took 240 s and each candidate's ~250 s);
    600 s is 1.3x the slowest of the 13 others, so it cuts only such a suite. The candidate
    limit, 60 s: the kept scripts took at most 13.4 s on one candidate (of 332), and a hanging
    candidate cost 302 s (sympy-13372 c6, killed by the 300 s timeout) where its file's base run
    took 19 s."""

    timeout_s: float = 300.0
    script_timeout_s: float = 60.0
    candidates: int = 6
    repro_candidates: int = 32
    regression_files: int = 2
    max_scripts: int = 8
    budget_s: float = 600.0
    candidate_limit_s: float = 60.0
    workers: int = 0


@dataclass
class TaskEnv:
    """Where tests run: the clone ``root``, the command environment ``env``, the spec's
    ``test_cmd`` and ``exports`` (eval commands), ``pre`` (namespace set-up lines), ``info``."""

    root: Path
    env: dict[str, str]
    test_cmd: str
    exports: list[str] = field(default_factory=list)
    pre: list[str] = field(default_factory=list)
    unsafe_no_sandbox: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    readable: list[Path] = field(default_factory=list)

    def run(self, argv: list[str], timeout_s: float, extra_env: dict[str, str] | None = None) -> RunResult:
        return run_in_sandbox(argv, workspace=self.root, env={**self.env, **(extra_env or {})},
                              timeout_s=timeout_s, net_setup=self.pre, readable=self.readable,
                              unsafe_no_sandbox=self.unsafe_no_sandbox)

    def reset(self) -> None:
        """Back to the set-up commit: tracked files restored, untracked ones removed (ignored
        ones, ``.fak/`` with the scripts among them, kept)."""
        git(self.root, "reset", "--hard", "-q", "HEAD")
        git(self.root, "clean", "-fdq")

    def apply(self, patch: str) -> bool:
        """Apply ``patch`` to the work tree (``git apply`` through ``fak.gitsafe.git``); False
        when it does not apply or names git metadata (never applied)."""
        if patch_git_metadata(patch) is not None:
            return False
        proc = git(self.root, "apply", "--whitespace=nowarn", "-", check=False, text=False,
                   input=patch.encode("utf-8", "surrogateescape"))
        return proc.returncode == 0

    def copy(self, dest: Path) -> TaskEnv:
        """A second work tree for runs in parallel: ``dest`` (replaced if it exists) a file copy
        of ``root`` — its setup commit, build outputs and ignored files (``.fak/`` with the
        scripts) included; ``.git/objects`` hard-linked where the file system allows (git never
        rewrites an object file, and the sandbox mounts ``.git`` read-only), everything else
        copied; symlinks copied as links, never followed; what is not a regular file (a FIFO, a
        socket) left out. Its environment is this one with the paths under ``root`` moved to
        ``dest``. fak's git treats the copy as any workspace (``fak.gitsafe``, which never reads
        its configuration). Make it before anything ran in ``root`` since the set-up. Raises
        ``OSError`` (``shutil.Error``) when the copy fails.

        With ``--task-env`` the overlay's editable install of the repository points at ``root``
        (a ``.pth`` path, appended to ``sys.path``); a run in the copy still imports the copy's
        code: test commands run in the copy, whose folder comes first on ``sys.path``
        (``python -m pytest``, sympy's ``bin/test``), and scripts get ``PYTHONPATH`` = the copy,
        which comes before ``site-packages``."""
        src = str(self.root)
        objects = os.path.join(src, ".git", "objects") + os.sep
        if dest.exists():
            shutil.rmtree(dest)

        def copy_file(a: str, b: str) -> str:
            st = os.lstat(a)
            if not stat.S_ISREG(st.st_mode):
                return b
            if a.startswith(objects):
                try:
                    os.link(a, b)
                    return b
                except OSError:
                    pass
            return shutil.copy2(a, b)

        shutil.copytree(self.root, dest, symlinks=True, copy_function=copy_file)

        def moved(value: str) -> str:  # whole path components only (PATH lists too)
            return re.sub(re.escape(src) + r"(?=/|:|$)", lambda _: str(dest), value)

        return TaskEnv(dest, {k: moved(v) for k, v in self.env.items()}, self.test_cmd,
                       list(self.exports), list(self.pre), self.unsafe_no_sandbox, dict(self.info),
                       list(self.readable))


def prepare(task: dict[str, Any], mirror: Path, work_dir: Path, *, task_env: bool,
            env_builder: Any = None, unsafe_no_sandbox: bool = False) -> TaskEnv:
    """The ``TaskEnv`` of an instance under ``work_dir`` (``work_dir/repo``, ``work_dir/env``).

    Raises ``fak.swebench.repos.RepoError`` / ``fak.swebench.envs.EnvError`` when the clone or
    the environment cannot be made."""
    from fak.swebench.envs import SYSTEM_COMMAND, EnvBuilder, get_spec, make_overlay
    from fak.swebench.local import NETNS_SETUP
    from fak.swebench.repos import make_workspace

    ws = make_workspace(mirror, task["base_commit"], work_dir / "repo")
    root = ws.root
    home = root / ".fak" / "home"
    (root / ".fak" / "tmp").mkdir(parents=True, exist_ok=True)
    home.mkdir(parents=True, exist_ok=True)
    env = {"HOME": str(home), "TMPDIR": str(root / ".fak" / "tmp")}
    info: dict[str, Any] = {"mode": "task-env" if task_env else "host", "sandbox": sandbox_kind(unsafe_no_sandbox)}
    pre = list(NETNS_SETUP.get(task["repo"], []))
    readable: list[Path] = []
    if task_env:
        builder = env_builder or EnvBuilder()
        key = EnvBuilder.key(task["repo"], task["version"])
        with builder.lock(key):
            shared = builder.ensure(task["repo"], task["version"], mirror,
                                    task.get("environment_setup_commit") or task["base_commit"])
        overlay = make_overlay(shared, work_dir / "env", root, work_dir / "install.log",
                               unsafe_no_sandbox=unsafe_no_sandbox)
        git(root, "commit", "--quiet", "--allow-empty", "--no-verify", "-am", "fak: task setup")
        # the overlay's interpreter first, then the shared env's scripts; never the host's PATH
        env.update(PATH=f"{overlay.path / 'bin'}:{shared.path / 'bin'}:{SYSTEM_PATH}",
                   VIRTUAL_ENV=str(overlay.path))
        readable = overlay.sandbox_paths  # the overlay, its base Python, the shared env
        spec = get_spec(task["repo"], task["version"])
        cmd = spec["test_cmd"][-1] if isinstance(spec["test_cmd"], list) else spec["test_cmd"]
        # the overlay has no console scripts: run pytest with its interpreter, which sees the
        # shared env's packages and the repository installed in the overlay
        cmd = overlay_test_command(cmd)
        exports = [c for c in spec.get("eval_commands", []) if not SYSTEM_COMMAND.search(c)]
        info.update(env=shared.key, python=str(spec.get("python")),
                    unreproduced=overlay.unreproduced)
    else:
        env["PATH"] = f"{Path(sys.executable).parent}:{SYSTEM_PATH}"
        cmd, exports = HOST_TEST_CMD, []
        # the sandbox hides $HOME and /tmp: it must see the interpreter it is asked to run, its
        # venv and the base interpreter, wherever they live (/tmp, $HOME, pyenv, uv, conda)
        readable = interpreter_paths()
        info.update(python=sys.version.split()[0])
    return TaskEnv(root, env, cmd, exports, pre, unsafe_no_sandbox, info, readable)


def find_test_files(repo: Repo, path: str, limit: int = 2) -> list[str]:
    """Existing test files of the module at ``path``: ``test_STEM.py`` / ``STEM_test.py``
    nearest to it first; else test files that import the module (or name its file stem)."""
    files = repo.files
    tests = [f for f in files if is_test_path(f) and f.endswith(".py")
             and f.rsplit("/", 1)[-1] != "conftest.py" and not f.endswith("__init__.py")]
    stem = path.rsplit("/", 1)[-1].removesuffix(".py")
    if stem == "__init__":
        stem = path.rsplit("/", 2)[-2] if path.count("/") else stem
    pdir = path.rsplit("/", 1)[0] if "/" in path else ""

    def closeness(f: str) -> tuple[int, str]:
        common = 0
        for a, b in zip(f.split("/"), pdir.split("/")):
            if a != b:
                break
            common += 1
        return (-common, f)

    named = [f for f in tests if f.rsplit("/", 1)[-1] in (f"test_{stem}.py", f"{stem}_test.py",
                                                          f"tests_{stem}.py")]
    if named:
        return sorted(named, key=closeness)[:limit]
    mod = module_name(path)
    pats = [p for p in {mod, f"import {stem}", f"{stem}."} if p]
    rows = repo.grep(sorted(pats), words=False, paths=tests or None, max_lines=20_000)
    hits: dict[str, int] = {}
    for f, _, _ in rows:
        if f in tests:
            hits[f] = hits.get(f, 0) + 1
    return sorted(hits, key=lambda f: (-hits[f],) + closeness(f))[:limit]


def run_tests(tenv: TaskEnv, files: list[str], timeout_s: float) -> tuple[dict[str, str], RunResult, str]:
    """Run ``files`` with the test command; (test → status, the run, the command line). The log
    is read with the repository's harness parser in the task env, with pytest's on the host."""
    from swebench.harness.log_parsers import MAP_REPO_TO_PARSER
    from swebench.harness.log_parsers.python import parse_log_pytest

    command = " ".join([tenv.test_cmd, *files])
    script = "\n".join([*tenv.exports, command])
    res = tenv.run(["bash", "-c", script], timeout_s)
    # the repository's own log parser reads its harness command's log; the host mode runs
    # pytest whatever the harness runs (sympy's is bin/test): its log is pytest's
    parser = (MAP_REPO_TO_PARSER.get(tenv.info.get("repo", ""), parse_log_pytest)
              if tenv.info.get("mode") == "task-env" else parse_log_pytest)
    try:
        statuses = parser(res.output, None)
    except Exception:  # noqa: BLE001 - a parser that needs more than the log: pytest's
        statuses = parse_log_pytest(res.output, None)
    return dict(statuses), res, command


def _slots_dir(tenv: TaskEnv) -> Path:
    return tenv.root.parent / "slots"


def _slots(tenv: TaskEnv, n: int) -> tuple[list[Slot], list[str]]:
    """``n`` slots: ``tenv`` itself and ``n - 1`` copies of it (``TaskEnv.copy``, made at once,
    under ``root/../slots/K``); a copy that fails is left out (its error in the second list)."""
    slots, errors = [Slot(tenv, 0)], []
    if n > 1:
        where = _slots_dir(tenv)
        with ThreadPoolExecutor(max_workers=n - 1, thread_name_prefix="fak-test-copy") as ex:
            futs = [ex.submit(tenv.copy, where / str(k)) for k in range(1, n)]
        for f in futs:
            try:
                slots.append(Slot(f.result(), len(slots)))
            except OSError as e:
                errors.append(f"{type(e).__name__}: {str(e)[:300]}")
    return slots, errors


def _run(slot: Slot, budget: Budget, what: dict[str, Any], argv: list[str], timeout: float,
         extra_env: dict[str, str]) -> RunResult:
    t0 = time.monotonic()
    res = slot.tenv.run(argv, timeout, extra_env)
    budget.log(what, slot.index, t0, res.duration_s)
    return res


def _run_tests(slot: Slot, budget: Budget, what: dict[str, Any], files: list[str],
               timeout: float) -> tuple[dict[str, str], RunResult, str]:
    t0 = time.monotonic()
    statuses, res, command = run_tests(slot.tenv, files, timeout)
    budget.log(what, slot.index, t0, res.duration_s)
    return statuses, res, command


def test_stage(repo: Repo, task: dict[str, Any], candidates: list[dict[str, Any]],
               scripts: list[dict[str, Any]], tenv: TaskEnv, cfg: TestConfig) -> list[dict[str, Any]]:
    """The test stage's records: ``env``; ``script_base`` per script that ran on the original
    code (``kept``, ``why``, ``env_error``); ``regression_base`` per test file that ran on it
    (``files``, ``passing``, ``failing``, ``env_error``); ``candidate_test`` per candidate the
    kept scripts ran on (``applied``, ``repro`` {script: exit status}, ``repro_out`` {script:
    outcome class, ``behaviour.outcome``}, ``repro_fixed`` — no
    ``repro`` when none of its scripts could start, ``repro_env_error`` {script: why};
    ``regression_failures`` for those whose regression tests ran, ``regression_partial`` where
    some of their test files were cut, ``regression_env_error``; ``cut``: its runs that were
    cut); last ``schedule``: ``workers``, ``budget_s``, ``candidate_limit_s``, ``runs``
    (started), ``cut`` (every run that was cut: ``run``, the script/candidate/file, ``why`` one
    of ``schedule.CUT_REASONS``, ``detail``), ``env_errors`` (every run that could not start:
    ``env_errors()``), ``wall_s`` and ``timeline`` (each run started: what, worker,
    ``start_s``, ``seconds``).

    The runs go to ``cfg.workers`` workers, each with its own copy of the work tree, in three
    rounds, each cheapest and most discriminating first: the scripts on the original code; the
    kept scripts on the candidates (one job per candidate, most votes first; the scripts
    quickest on the original code first), as long as the candidate's limit lasts; the test files of the best candidates on the original code (the
    smallest file first) and, as each of these ends, the candidates' runs of that file (the
    file whose base run was quickest first, then the candidates' order). Whatever cannot start
    within ``cfg.budget_s`` is cut, as is a run the budget interrupts. A candidate whose kept
    scripts were all cut gets no ``candidate_test`` record (as one past ``repro_candidates``);
    a candidate with a test file cut gets no ``regression_failures`` (ranked as one whose
    regression tests did not run)."""
    try:
        return _scheduled(repo, task, candidates, scripts, tenv, cfg)
    finally:
        shutil.rmtree(_slots_dir(tenv), ignore_errors=True)


def _scheduled(repo: Repo, task: dict[str, Any], candidates: list[dict[str, Any]],
               scripts: list[dict[str, Any]], tenv: TaskEnv, cfg: TestConfig) -> list[dict[str, Any]]:
    tenv.info["repo"] = task["repo"]
    budget = Budget(cfg.budget_s)
    records: list[dict[str, Any]] = [{"kind": "env", **{k: v for k, v in tenv.info.items()
                                                        if k != "repo"}}]
    fak_dir = tenv.root / ".fak"
    fak_dir.mkdir(exist_ok=True)
    to_run = scripts[: cfg.max_scripts]
    for s in to_run:
        (fak_dir / f"repro_{s['id']}.py").write_text(s["code"])
    order = sorted(candidates, key=lambda c: (-c["votes"], c["diff_lines"], int(c["id"][1:])))
    to_try = order[: max(cfg.repro_candidates, cfg.candidates)]
    workers = cfg.workers or default_workers()
    slots, slot_errors = _slots(tenv, min(workers, max(1, len(to_run), len(to_try))))
    pool = Pool(slots)
    cuts: list[dict[str, Any]] = []

    def script_env(slot: Slot) -> dict[str, str]:
        return {"PYTHONPATH": str(slot.tenv.root)}

    # 1. each script on the original code: kept when it fails there
    def script_base(s: dict[str, Any], slot: Slot) -> RunResult | Cut:
        lim = limit(budget, cfg.script_timeout_s)
        if isinstance(lim, Cut):
            return lim
        slot.checkout("", None, fresh=False)
        res = _run(slot, budget, {"run": "script_base", "script": s["id"]},
                   ["python", f".fak/repro_{s['id']}.py"], lim[0], script_env(slot))
        return budget_killed(res.killed, res.duration_s, *lim) or res

    ran = pool.run(((i,), s["id"], partial(script_base, s)) for i, s in enumerate(to_run))
    kept: list[str] = []
    for s in to_run:
        r = ran[s["id"]]
        if isinstance(r, Cut):
            cuts.append(r.to_json(run="script_base", script=s["id"]))
            continue
        records.append(script_record(s["id"], r))
        if records[-1]["kept"]:
            kept.append(s["id"])
    # on each candidate the quickest first: the candidate's limit then cuts the slowest (by the
    # seconds the script_base record shows, ties in the scripts' order, so the record explains it)
    kept.sort(key=lambda sid: round(ran[sid].duration_s, 3))

    # 2. the kept scripts on many candidates (cheap: one interpreter start each)
    def scripts_on(c: dict[str, Any], slot: Slot) -> dict[str, Any] | Cut:
        t0 = time.perf_counter()
        lim = limit(budget, cfg.script_timeout_s)
        if isinstance(lim, Cut):
            return lim
        rec: dict[str, Any] = {"kind": "candidate_test", "id": c["id"],
                               "applied": slot.checkout(c["id"], c["diff"], fresh=True)}
        if rec["applied"]:
            repro: dict[str, int | None] = {}
            outs: dict[str, str] = {}
            not_started: dict[str, str] = {}
            cut: list[dict[str, Any]] = []
            spent = 0.0
            for sid in kept:
                lim = limit(budget, cfg.script_timeout_s, cfg.candidate_limit_s - spent)
                if isinstance(lim, Cut):
                    cut.append(lim.to_json(script=sid))
                    continue
                res = _run(slot, budget, {"run": "script", "candidate": c["id"], "script": sid},
                           ["python", f".fak/repro_{sid}.py"], lim[0], script_env(slot))
                spent += res.duration_s
                interrupted = budget_killed(res.killed, res.duration_s, *lim)
                if interrupted is not None:
                    cut.append(interrupted.to_json(script=sid))
                    continue
                env_error = could_not_start(res)
                if env_error is not None:  # no result for this candidate, either way
                    not_started[sid] = env_error
                    continue
                repro[sid] = res.returncode
                outs[sid] = outcome(res, slot.tenv.root)
            if kept and not repro and not not_started:  # nothing ran: no evidence about it
                return Cut(cut[0]["why"], cut[0]["detail"])
            if repro or not kept:  # without a result it ranks as a candidate not tested
                rec["repro"] = repro
                rec["repro_out"] = outs  # the outcome class of each run (behaviour.outcome)
                rec["repro_fixed"] = sum(1 for rc in repro.values() if rc == 0)
            if not_started:
                rec["repro_env_error"] = not_started
            if cut:
                rec["cut"] = cut
        rec["seconds"] = round(time.perf_counter() - t0, 3)
        return rec

    tried = pool.run(((i,), c["id"], partial(scripts_on, c)) for i, c in enumerate(to_try))
    results: dict[str, dict[str, Any]] = {}
    for c in to_try:
        r = tried[c["id"]]
        if isinstance(r, Cut):
            cuts.append(r.to_json(run="candidate", candidate=c["id"]))
            continue
        results[c["id"]] = r
        cuts += [{"run": "script", "candidate": c["id"], **x} for x in r.get("cut", [])]

    # 3. the regression tests of the best of them: most scripts fixed, then most votes; each
    # candidate against its own modules' test files, with the original code's results of the
    # same file (one base run per file: most candidates touch the same one)
    tested = [c for c in order if "repro" in results.get(c["id"], {})]
    best = sorted(tested, key=lambda c: -results[c["id"]]["repro_fixed"])[: cfg.candidates]
    own: dict[str, list[str]] = {}
    users: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for i, c in enumerate(best):
        files: list[str] = []
        for f in c["files"]:
            files += [t for t in find_test_files(repo, f, cfg.regression_files) if t not in files]
        own[c["id"]] = files
        for f in files:
            users.setdefault(f, []).append((i, c))
    test_files = list(users)

    def candidate_run(c: dict[str, Any], f: str, base_s: float, slot: Slot) -> Any:
        left = budget.left()
        if base_s > left:
            return Cut("budget", f"would not end within the test budget: the file's base run "
                                 f"took {base_s:.0f} s, {max(left, 0.0):.0f} s were left")
        lim = limit(budget, min(cfg.timeout_s, max(cfg.candidate_limit_s, SLOW_FACTOR * base_s)))
        if isinstance(lim, Cut):
            return lim
        slot.checkout(c["id"], c["diff"], fresh=True)
        statuses, res, _ = _run_tests(slot, budget, {"run": "regression", "candidate": c["id"],
                                                     "file": f}, [f], lim[0])
        return budget_killed(res.killed, res.duration_s, *lim) or (statuses, res)

    def base_run(f: str, slot: Slot) -> Any:
        lim = limit(budget, cfg.timeout_s)
        if isinstance(lim, Cut):
            return lim
        slot.checkout("", None, fresh=True)
        statuses, res, command = _run_tests(slot, budget, {"run": "regression_base", "file": f},
                                            [f], lim[0])
        interrupted = budget_killed(res.killed, res.duration_s, *lim)
        if interrupted is not None:
            return interrupted
        for i, c in users[f]:  # quickest file first, then the candidates' order
            pool.submit((1, res.duration_s, i, test_files.index(f)), ("regression", c["id"], f),
                        partial(candidate_run, c, f, res.duration_s))
        return statuses, res, command

    size = {f: len(repo.text(f) or "") for f in test_files}
    done = pool.run(((0, size[f], j), ("base", f), partial(base_run, f))
                    for j, f in enumerate(test_files))
    base: dict[str, list[str]] = {}
    for f in test_files:
        r = done[("base", f)]
        if isinstance(r, Cut):
            cuts.append(r.to_json(run="regression_base", file=f))
            continue
        statuses, res, command = r
        env_error = could_not_start(res)
        base[f] = sorted(t for t, st in statuses.items() if st in PASS) if env_error is None else []
        records.append({"kind": "regression_base", "files": [f], "command": command,
                        "returncode": res.returncode, "killed": res.killed, "env_error": env_error,
                        "passing": base[f], "failing": sorted(t for t, st in statuses.items()
                                                              if st not in PASS),
                        "seconds": round(res.duration_s, 3), "output_tail": tail(res.output)})
    for c in best:
        rec = results[c["id"]]
        if not own[c["id"]]:
            rec["regression_failures"] = []
            continue
        failures: list[str] = []
        cut: list[dict[str, Any]] = []
        ran_any = killed = False
        env_error = None
        seconds = 0.0
        for f in own[c["id"]]:
            r = done[("regression", c["id"], f)] if f in base else \
                Cut("no_base", "the file's run on the original code was cut")
            if isinstance(r, Cut):
                cut.append(r.to_json(file=f))
                continue
            statuses, res = r
            ran_any, killed, seconds = True, killed or res.killed, seconds + res.duration_s
            env_error = env_error or could_not_start(res)
            failures += [t for t in base[f] if statuses.get(t) not in PASS]
        if env_error is not None:  # no evidence either way: ranked as if its tests did not run
            rec["regression_env_error"] = env_error
        elif not cut:
            rec["regression_failures"] = failures
        elif ran_any:  # some of its files were cut: what the others showed, not ranked as a run
            rec["regression_partial"] = failures
        if ran_any:
            rec["regression_killed"] = killed
        if cut:
            rec["cut"] = rec.get("cut", []) + cut
            cuts += [{"run": "regression", "candidate": c["id"], **x} for x in cut]
        rec["seconds"] = round(rec["seconds"] + seconds, 3)
    records += [results[c["id"]] for c in order if c["id"] in results]
    records.append({"kind": "schedule", "workers": len(slots), "budget_s": cfg.budget_s,
                    "candidate_limit_s": cfg.candidate_limit_s, "runs": len(budget.timeline),
                    "cut": cuts, "env_errors": env_errors(records),
                    **({"slot_errors": slot_errors} if slot_errors else {}),
                    "wall_s": round(budget.elapsed(), 3),
                    "timeline": sorted(budget.timeline, key=lambda t: t["start_s"])})
    tenv.reset()
    return records


def env_errors(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The runs of the stage's ``records`` that could not start (``evidence.could_not_start``):
    ``run`` (``script_base``, ``script``, ``regression_base``, ``regression``), the
    script/candidate/file, ``detail``."""
    out: list[dict[str, Any]] = []
    for r in records:
        if r["kind"] == "script_base" and r.get("env_error"):
            out.append({"run": "script_base", "script": r["script"], "detail": r["env_error"]})
        elif r["kind"] == "regression_base" and r.get("env_error"):
            out.append({"run": "regression_base", "file": r["files"][0], "detail": r["env_error"]})
        elif r["kind"] == "candidate_test":
            out += [{"run": "script", "candidate": r["id"], "script": sid, "detail": why}
                    for sid, why in r.get("repro_env_error", {}).items()]
            if r.get("regression_env_error"):
                out.append({"run": "regression", "candidate": r["id"],
                            "detail": r["regression_env_error"]})
    return out


def cleanup(work_dir: Path) -> None:
    """Remove an instance's test clone and overlay env."""
    shutil.rmtree(work_dir, ignore_errors=True)
