"""Stage 4b/5a, ``test``: run the reproduction scripts and the regression tests, first on the
original code, then with each candidate applied; everything through ``execute.run_in_sandbox``.

The task's environment (``prepare``): a clone of the mirror at ``base_commit`` and, with
``task_env``, the (repo, version) venv of the harness spec with a per-instance overlay in which
the repository is installed (``fak.swebench.envs``, as ``fak swebench run --task-env`` does);
without it, the host's Python (``sys.executable``'s folder first on ``PATH``; its venv and base
interpreter bound read-only into the sandbox, which hides ``$HOME`` and ``/tmp``), for
repositories that need nothing installed.

Evidence only from runs that started: a run that could not start (exit 126/127, ``execvp``
errors, the harness's interpreter without pytest: ``could_not_start``) is an environment error —
a script is then never kept as a reproduction, a regression base has no passing tests, and a
candidate's regression run gives no ``regression_failures`` (``regression_env_error`` instead).

- Reproduction scripts (``reproduce``) run on the original code as ``python .fak/repro_ID.py``
  with the repository on ``PYTHONPATH``; a script is *kept* when it fails there (non-zero exit,
  not killed) with an error that a source change can fix — not a ``SyntaxError`` of its own, not
  a module that cannot be imported (``UNFIXABLE``), not a ``NameError`` raised in the script's
  own code (a name the script never defined; ``SCRIPT_BUGS``).
- Candidates, most votes first, at most ``repro_candidates``: applied with ``git apply``; each
  kept script passes (exit 0) or not (``repro_fixed`` counts those that pass).
- Regression tests, for the best ``candidates`` of those (most scripts fixed, then most votes):
  the existing test files of the modules the candidate touches (``find_test_files``), run with
  the spec's ``test_cmd`` (``pytest`` as ``python -m pytest`` of the overlay's interpreter; host:
  ``python -m pytest -rA``) and read with the repository's log parser from ``swebench``, on the
  original code and with the candidate; the tests that passed on the original code and no longer
  pass are its ``regression_failures``. Scripts are cheap (one interpreter start) and test files
  are not (a sympy module's tests take up to minutes), hence the two budgets.
"""

from __future__ import annotations

import re
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fak.gitsafe import git, patch_git_metadata
from fak.swebench.envs import SYSTEM_PATH, overlay_test_command
from fak.swebench.pipeline.execute import RunResult, run_in_sandbox, sandbox_kind
from fak.swebench.pipeline.source import Repo, is_test_path, module_name

PASS = ("PASSED", "XFAIL")
UNFIXABLE = ("SyntaxError", "IndentationError", "TabError", "ModuleNotFoundError", "ImportError")
#: errors that are the script's own bug when its own frame raised them (the last frame of the
#: traceback is the script file): no change to the repository can fix them
SCRIPT_BUGS = ("NameError", "UnboundLocalError")
_FRAME = re.compile(r'^\s*File "([^"]+)", line \d+')
#: the test runner itself missing from the interpreter (``python -m pytest`` with no pytest)
_HARNESS_MISSING = re.compile(r"^(?:/\S+: )?No module named (pytest)\b", re.M)
_EXC = re.compile(r"^(?:[\w.]+\.)?([A-Z]\w*(?:Error|Exception|Exit|Failure|Warning))\b")
HOST_TEST_CMD = "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 python -m pytest -rA -p no:cacheprovider"


@dataclass
class TestConfig:
    """``timeout_s`` per test-file run, ``script_timeout_s`` per script run (seconds);
    ``repro_candidates``: candidates the kept reproduction scripts run on (most votes first);
    ``candidates``: of those, the best by scripts fixed then votes, the ones whose regression
    tests run; ``regression_files`` test files per touched module."""

    timeout_s: float = 300.0
    script_timeout_s: float = 60.0
    candidates: int = 6
    repro_candidates: int = 32
    regression_files: int = 2
    max_scripts: int = 8


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
        readable = host_interpreter_paths()
        info.update(python=sys.version.split()[0])
    return TaskEnv(root, env, cmd, exports, pre, unsafe_no_sandbox, info, readable)


def host_interpreter_paths() -> list[Path]:
    """The paths the host's interpreter needs inside the sandbox, bound read-only: its venv
    (``sys.prefix``) and what that venv was made from (``fak.sandbox.venv.venv_paths``), the base
    prefix, and the folder of the executable itself once links are resolved."""
    from fak.sandbox.venv import venv_paths

    paths = venv_paths(Path(sys.prefix))
    for extra in (Path(sys.base_prefix), Path(sys.executable).resolve().parent.parent):
        if extra.exists() and extra not in paths:
            paths.append(extra)
    return paths


def could_not_start(res: RunResult) -> str | None:
    """Why a run is no evidence about the code, or None: the command could not start (exit 126 or
    127: not executable, not found — the sandbox's ``bwrap: execvp`` among them) or the harness's
    own interpreter lacks a module it needs. Such a run is an environment error, never a
    reproduction or a regression result."""
    if res.killed:
        return None
    if res.returncode in (126, 127):
        return f"could not start (exit {res.returncode}): {_first_line(res.output)}"
    if res.returncode not in (0, None) and "execvp" in res.output:
        return f"could not start: {_first_line(res.output)}"
    m = _HARNESS_MISSING.search(res.output)
    if m and res.returncode not in (0, None):
        return f"the harness's interpreter has no module {m.group(1)!r}"
    return None


def _first_line(text: str) -> str:
    for ln in text.splitlines():
        if ln.strip():
            return ln.strip()[:200]
    return "no output"


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
    """Run ``files`` with the test command; (test → status, the run, the command line)."""
    from swebench.harness.log_parsers import MAP_REPO_TO_PARSER
    from swebench.harness.log_parsers.python import parse_log_pytest

    command = " ".join([tenv.test_cmd, *files])
    script = "\n".join([*tenv.exports, command])
    res = tenv.run(["bash", "-c", script], timeout_s)
    parser = MAP_REPO_TO_PARSER.get(tenv.info.get("repo", ""), parse_log_pytest)
    try:
        statuses = parser(res.output, None)
    except Exception:  # noqa: BLE001 - a parser that needs more than the log: pytest's
        statuses = parse_log_pytest(res.output, None)
    return dict(statuses), res, command


def failure_kind(output: str) -> str | None:
    """The exception class of the last traceback line of ``output`` (``AssertionError``, ...)."""
    kind = None
    for ln in output.splitlines():
        m = _EXC.match(ln.strip())
        if m:
            kind = m.group(1)
    return kind


def raised_in(output: str) -> str | None:
    """The file of the last traceback frame in ``output`` (where the error was raised)."""
    last = None
    for ln in output.splitlines():
        m = _FRAME.match(ln)
        if m:
            last = m.group(1)
    return last


def _tail(text: str, n: int = 1500) -> str:
    return text[-n:]


def test_stage(repo: Repo, task: dict[str, Any], candidates: list[dict[str, Any]],
               scripts: list[dict[str, Any]], tenv: TaskEnv, cfg: TestConfig) -> list[dict[str, Any]]:
    """The test stage's records: ``env``; ``script_base`` per script (``kept``, ``why``);
    ``regression_base`` per distinct set of test files (``files``, ``passing``, ``failing``);
    ``candidate_test`` per tested candidate (``applied``, ``repro`` {script: exit status},
    ``repro_fixed``; and ``regression_failures`` for those whose regression tests ran)."""
    tenv.info["repo"] = task["repo"]
    records: list[dict[str, Any]] = [{"kind": "env", **{k: v for k, v in tenv.info.items()
                                                        if k != "repo"}}]
    fak_dir = tenv.root / ".fak"
    fak_dir.mkdir(exist_ok=True)
    script_env = {"PYTHONPATH": str(tenv.root)}
    kept: list[str] = []
    for s in scripts[: cfg.max_scripts]:
        (fak_dir / f"repro_{s['id']}.py").write_text(s["code"])
        res = tenv.run(["python", f".fak/repro_{s['id']}.py"], cfg.script_timeout_s, script_env)
        kind = failure_kind(res.output) if res.returncode not in (0, None) else None
        env_error = could_not_start(res)
        if env_error is not None:
            why, keep = f"environment error: {env_error}", False
        elif res.killed:
            why, keep = "timeout", False
        elif res.returncode == 0:
            why, keep = "passes on the original code", False
        elif kind in UNFIXABLE:
            why, keep = f"fails with {kind}", False
        elif kind in SCRIPT_BUGS and (raised_in(res.output) or "").endswith(f"repro_{s['id']}.py"):
            why, keep = f"fails with {kind} in its own code", False
        else:
            why, keep = f"fails with {kind or f'exit status {res.returncode}'}", True
        if keep:
            kept.append(s["id"])
        records.append({"kind": "script_base", "script": s["id"], "returncode": res.returncode,
                        "killed": res.killed, "kept": keep, "why": why, "env_error": env_error is not None,
                        "seconds": round(res.duration_s, 3), "output_tail": _tail(res.output)})
    order = sorted(candidates, key=lambda c: (-c["votes"], c["diff_lines"], int(c["id"][1:])))
    # 1. the kept scripts on many candidates (cheap: one interpreter start each)
    results: dict[str, dict[str, Any]] = {}
    for c in order[: max(cfg.repro_candidates, cfg.candidates)]:
        t0 = time.perf_counter()
        tenv.reset()
        rec: dict[str, Any] = {"kind": "candidate_test", "id": c["id"], "applied": tenv.apply(c["diff"])}
        if rec["applied"]:
            repro = {}
            for sid in kept:
                res = tenv.run(["python", f".fak/repro_{sid}.py"], cfg.script_timeout_s, script_env)
                repro[sid] = res.returncode
            rec["repro"] = repro
            rec["repro_fixed"] = sum(1 for rc in repro.values() if rc == 0)
        rec["seconds"] = round(time.perf_counter() - t0, 3)
        results[c["id"]] = rec
    # 2. the regression tests of the best of them: most scripts fixed, then most votes
    applied = [c for c in order if results.get(c["id"], {}).get("applied")]
    best = sorted(applied, key=lambda c: -results[c["id"]]["repro_fixed"])[: cfg.candidates]
    # each candidate against its own modules' test files, with the original code's results of
    # the same files (one base run per distinct set: most candidates touch the same file)
    own: dict[str, tuple[str, ...]] = {}
    for c in best:
        files: list[str] = []
        for f in c["files"]:
            files += [t for t in find_test_files(repo, f, cfg.regression_files) if t not in files]
        own[c["id"]] = tuple(files)
    base: dict[tuple[str, ...], list[str]] = {}
    for files in dict.fromkeys(own.values()):
        if not files:
            continue
        tenv.reset()
        statuses, res, command = run_tests(tenv, list(files), cfg.timeout_s)
        env_error = could_not_start(res)
        base[files] = sorted(t for t, st in statuses.items() if st in PASS) if env_error is None else []
        records.append({"kind": "regression_base", "files": list(files), "command": command,
                        "returncode": res.returncode, "killed": res.killed, "env_error": env_error,
                        "passing": base[files], "failing": sorted(t for t, st in statuses.items()
                                                                  if st not in PASS),
                        "seconds": round(res.duration_s, 3), "output_tail": _tail(res.output)})
    for c in best:
        rec = results[c["id"]]
        t0 = time.perf_counter()
        files = own[c["id"]]
        if files:
            tenv.reset()
            tenv.apply(c["diff"])
            statuses, res, _ = run_tests(tenv, list(files), cfg.timeout_s)
            env_error = could_not_start(res)
            if env_error is None:
                rec["regression_failures"] = [t for t in base[files] if statuses.get(t) not in PASS]
            else:  # no evidence either way: ranked as a candidate whose tests did not run
                rec["regression_env_error"] = env_error
            rec["regression_killed"] = res.killed
        else:
            rec["regression_failures"] = []
        rec["seconds"] = round(rec["seconds"] + time.perf_counter() - t0, 3)
    records += [results[c["id"]] for c in order if c["id"] in results]
    tenv.reset()
    return records


def cleanup(work_dir: Path) -> None:
    """Remove an instance's test clone and overlay env."""
    shutil.rmtree(work_dir, ignore_errors=True)
