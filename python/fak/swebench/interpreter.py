"""Which Python the agent's ``bash`` runs, and what the model is told about it.

Old task repositories do not import on a new Python (sympy 1.1 imports ``collections.Mapping``,
gone in 3.10), and a bare interpreter lacks their dependencies (sympy needs ``mpmath``): in the
CPU runs of ``benches/results/swebench-cpu-1.5b.md`` the model ran its scripts and tests on such a
Python and read the import errors as the bug. Without ``--task-env`` the fleet therefore picks,
for each instance, the first of these that imports the repository's package from the workspace
root, checked by running ``python -c "import PKG"`` through the agent's own sandboxed ``bash``:

1. the task's environment for the instance's (repo, version) when one is already built in the env
   cache (``EnvBuilder.ready``: nothing is built, no network needed);
2. the interpreter the agent would get anyway (``python3`` on ``PATH``, resolved to its real
   executable, since a pyenv shim does not work with the sandbox's empty ``$HOME``);
3. the pyenv interpreter of the harness spec's Python version (``envs.find_python``).

When none imports it, the first candidate is used and the model is told that the package
does not import there (with the error's last line), so it fixes by reading rather than running.
The interpreter's ``bin`` folder goes first on bash's ``PATH``; the note goes into the first
user message (``python_note``).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fak.agent.context import package_dir
from fak.agent.exceptions import ToolError
from fak.agent.search import list_files
from fak.agent.tools import ToolBox
from fak.agent.workspace import Workspace
from fak.swebench.envs import EnvBuilder, EnvError, find_python, get_spec


@dataclass
class PythonChoice:
    """The interpreter picked: ``label`` (where it comes from), ``bin_dir``, ``version``
    (``"3.9.18"`` or ``""``), ``imports`` (the package imported with it; ``None``: not checked),
    ``env_overrides`` (for ``ToolBox``), ``note`` (for the prompt), ``tried`` (each candidate's
    probe: label, version, ok, last error line)."""

    label: str
    bin_dir: Path | None
    version: str = ""
    imports: bool | None = None
    package: str | None = None
    env_overrides: dict[str, str] = field(default_factory=dict)
    note: str = ""
    tried: list[dict[str, Any]] = field(default_factory=list)


def _host_python() -> Path | None:
    """The real executable behind ``python3`` (or ``python``) on ``PATH``."""
    exe = shutil.which("python3") or shutil.which("python")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "-c", "import sys; print(sys.executable)"], capture_output=True,
                             text=True, timeout=30, check=False).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return Path(out) if out else None


def candidates(repo: str, version: str, builder: EnvBuilder) -> list[tuple[str, Path, dict[str, str]]]:
    """(label, bin folder, extra environment) of each interpreter to try, in order."""
    out: list[tuple[str, Path, dict[str, str]]] = []
    env = builder.ready(repo, version)
    if env is not None:
        out.append((f"the task's environment ({env.key})", env.path / "bin",
                    {"VIRTUAL_ENV": str(env.path)}))
    host = _host_python()
    if host is not None:
        out.append(("the machine's python3", host.parent, {}))
    try:
        spec_py = str(get_spec(repo, version)["python"])
        py = find_python(spec_py)
        if all(py.parent != c[1] for c in out):
            out.append((f"Python {spec_py} (the version the task's tests use)", py.parent, {}))
    except (EnvError, KeyError):
        pass
    return out


def _import_probe(pkg: str | None) -> tuple[str | None, str]:
    """(module name, command) that prints the Python version, then imports ``pkg`` (a folder such
    as ``sympy`` or ``src/_pytest``; ``None``: nothing) from the repository root."""
    code = "import sys; print(sys.version.split()[0])"
    if pkg is None:
        return None, f"python -c {shlex.quote(code)}"
    parent, _, name = pkg.rpartition("/")
    code += f"; sys.path.insert(0, {parent or '.'!r}); import {name}"
    return name, f"python -c {shlex.quote(code)}"


def _path_for(bin_dir: Path, shim_dir: Path | None) -> str:
    """``PATH`` with ``bin_dir`` first; when it has ``python3`` but no ``python``, a ``python``
    link to it in ``shim_dir`` goes first (so the prompts' ``python ...`` commands work)."""
    rest = os.environ.get("PATH", "/usr/bin:/bin")
    if (bin_dir / "python").exists() or shim_dir is None or not (bin_dir / "python3").exists():
        return f"{bin_dir}:{rest}"
    shim_dir.mkdir(parents=True, exist_ok=True)
    link = shim_dir / "python"
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(bin_dir / "python3")
    return f"{shim_dir}:{bin_dir}:{rest}"


def choose_python(root: Path, repo: str, version: str, builder: EnvBuilder, *,
                  unsafe_no_sandbox: bool = False, timeout_s: float = 120.0,
                  shim_dir: Path | None = None) -> PythonChoice:
    """The interpreter for the agent's bash in the workspace ``root`` (see the module
    docstring); ``shim_dir``: where a ``python`` link may be made for an interpreter that has
    only ``python3``. Raises ``SandboxError`` when bash cannot be isolated (as ``ToolBox``)."""
    cands = candidates(repo, version, builder)
    pkg = package_dir(list_files(Path(root)), repo)
    if not cands:
        return PythonChoice("the machine's python", None)
    tried: list[dict[str, Any]] = []
    chosen: PythonChoice | None = None
    for label, bin_dir, extra in cands:
        overrides = {"PATH": _path_for(bin_dir, shim_dir), **extra}
        name, command = _import_probe(pkg)
        box = ToolBox(Workspace(root), allow_exec=True, unsafe_no_sandbox=unsafe_no_sandbox,
                      exec_timeout_s=timeout_s, env_overrides=overrides)
        try:
            result = box.execute("bash", {"command": command})
            lines = [ln for ln in result.output.strip().splitlines() if ln.strip()]
            ok = result.ok
        except ToolError as e:
            lines, ok = [str(e)], False
        ver = lines[0].strip() if lines and lines[0][:1].isdigit() else ""
        error = "" if ok else (lines[-1].strip() if lines else "no output")[:200]
        tried.append({"label": label, "version": ver, "ok": ok, "error": error})
        choice = PythonChoice(label, bin_dir, ver, ok if name else None, name, overrides)
        if ok:
            chosen = choice
            break
        if chosen is None:
            chosen = choice  # if none imports: the first (the task env, else the machine's)
    assert chosen is not None
    chosen.tried = tried
    chosen.note = python_note(chosen)
    return chosen


def python_note(choice: PythonChoice) -> str:
    """What the model is told about ``python`` in its shell."""
    ver = f"Python {choice.version}" if choice.version else "Python"
    text = f"In the shell, `python` is {ver} ({choice.label})."
    if choice.imports is True:
        text += (f" `import {choice.package}` works with it from the repository root, so you can "
                 "run scripts and tests.")
    elif choice.imports is False:
        err = next((t["error"] for t in choice.tried if t["label"] == choice.label), "")
        text += (f" `import {choice.package}` fails with it ({err}): scripts and tests that import "
                 f"{choice.package} cannot run here, so find and fix the code by reading it.")
    return text
