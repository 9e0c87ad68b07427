"""Per-(repo, version) virtual environments for local grading, built from the harness specs.

The specs come from the ``swebench`` package pinned at 4.1.0
(``swebench.harness.constants.MAP_REPO_VERSION_TO_SPECS``): its 4.x line carries, per repository
and version, the Python version, the conda/pip packages, the pre-install and install steps and the
test command. 5.x moved these specs into the dataset rows, which the rows in ``../shared/swebench``
do not carry, so 4.1.0 is pinned (pyproject extra ``swebench``).

What the official harness does in its conda images, and what is done here instead:

- ``conda create python=X.Y`` → ``python -m venv`` with an interpreter of that version found on
  this machine (``find_python``: pyenv, uv, conda, then ``pythonX.Y`` on ``PATH``).
- ``packages`` as conda packages (``"pytest"``, ``"mpmath flake8"``, ...) → ``pip install`` of the
  same names (``name=1.2`` → ``name==1.2.*``; a few renames, ``CONDA_TO_PIP``; conda-only build
  tools are dropped, ``CONDA_ONLY``).
- ``packages: requirements.txt`` / ``environment.yml`` → the file read from the local mirror at
  ``environment_setup_commit`` (the harness downloads it from GitHub), then pip as above.
- ``pip_packages`` → ``pip install`` as is.
- ``pre_install`` steps that change the machine (``apt-get``, ``wget``, ``locale-gen``, ...) are
  not run (``SYSTEM_COMMAND``): they are listed in the report as not reproduced.

A package that pip cannot install is recorded in ``unreproduced`` (the env is still used). An env is
rebuilt when the spec keys it is built from (``ENV_KEYS``) change (hash in ``.fak-env.json``).

Specs for repositories the package does not know (tests' tiny repositories) are added with
``register_specs({repo: {version: spec}})``; a spec may name its log parser (``"log_parser":
"parse_log_pytest"``) and may ask for ``"system_site_packages": true`` (fak's own extension).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fak.sandbox import Limits, MiB, Sandbox, SandboxUnavailable, venv_paths
from fak.sandbox.venv import SHARED_ENV_PTH
from fak.swebench.repos import read_file_at

DEFAULT_ENVS = Path(os.environ.get("FAK_SWEBENCH_ENVS", Path.home() / ".cache" / "fak" / "swebench-envs"))

CONDA_TO_PIP = {"pytorch": "torch", "pyqt": "PyQt5", "pytables": "tables",
                "matplotlib-base": "matplotlib", "msgpack-python": "msgpack",
                "pillow": "Pillow", "py-cpuinfo": "py-cpuinfo"}
CONDA_ONLY = {"python", "pip", "conda", "mkl", "mkl-service", "libgcc", "libgcc-ng", "compilers",
              "c-compiler", "cxx-compiler", "fortran-compiler", "gcc_linux-64", "gxx_linux-64",
              "make", "cmake", "pkg-config", "openblas", "blas", "libblas", "liblapack", "nodejs",
              "graphviz", "ffmpeg", "imagemagick", "texlive-core", "ghostscript", "sqlite", "tk",
              "zlib", "openssl", "ca-certificates", "certifi-conda", "llvm-openmp", "_openmp_mutex"}
SYSTEM_COMMAND = re.compile(r"^\s*(sudo\s+)?(apt-get|apt|yum|dnf|wget|curl|locale-gen|conda|"
                            r"QHULL_|mkdir -p \"\$QHULL|tar -xvzf \"\$QHULL)|/etc/|locale-gen")

#: the spec keys an env is built from (its cache key); pre_install/install run per instance
ENV_KEYS = ("python", "packages", "pip_packages", "system_site_packages")
#: the system folders after an overlay's and its shared env's ``bin`` on the test ``PATH``
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
_PYTEST_CMD = re.compile(r"^((?:\s*[A-Za-z_]\w*=\S+)*\s*)pytest\b")

_REGISTERED: dict[str, dict[str, dict[str, Any]]] = {}


class EnvError(RuntimeError):
    """An environment that cannot be built (no interpreter, venv failed); the message says why."""


def register_specs(specs: dict[str, dict[str, dict[str, Any]]]) -> None:
    """Add specs (``{repo: {version: spec}}``) to the harness tables, and their log parsers.

    Mutates ``swebench.harness.constants.MAP_REPO_VERSION_TO_SPECS`` and
    ``swebench.harness.log_parsers.MAP_REPO_TO_PARSER`` in this process, so the package's own
    grading code (``get_logs_eval``) finds them.
    """
    from swebench.harness import log_parsers
    from swebench.harness.constants import MAP_REPO_VERSION_TO_SPECS
    from swebench.harness.log_parsers import python as python_parsers

    for repo, versions in specs.items():
        MAP_REPO_VERSION_TO_SPECS.setdefault(repo, {}).update(versions)
        _REGISTERED.setdefault(repo, {}).update(versions)
        for spec in versions.values():
            parser = spec.get("log_parser")
            if parser:
                fn = getattr(python_parsers, parser, None)
                if fn is None:
                    raise EnvError(f"unknown log parser {parser!r} (see "
                                   "swebench.harness.log_parsers.python)")
                log_parsers.MAP_REPO_TO_PARSER[repo] = fn


def get_spec(repo: str, version: str) -> dict[str, Any]:
    """The harness spec for ``repo`` at ``version``. Raises ``EnvError`` when there is none, or
    when the ``swebench`` package (the ``swebench`` extra) is not installed."""
    if repo in _REGISTERED and str(version) in _REGISTERED[repo]:
        return dict(_REGISTERED[repo][str(version)])
    try:
        from swebench.harness.constants import MAP_REPO_VERSION_TO_SPECS
    except ImportError as e:
        raise EnvError(f"no harness spec for {repo} {version}: the swebench package is not "
                       f"installed ({e}); pip install 'fak[swebench]'") from None

    try:
        return dict(MAP_REPO_VERSION_TO_SPECS[repo][str(version)])
    except KeyError:
        raise EnvError(f"no harness spec for {repo} {version} in swebench "
                       "4.1.0; register one with --specs FILE") from None


def _version_of(name: str, version: str) -> tuple[int, ...] | None:
    """``(3, 9, 18)`` when the folder name ``name`` is a CPython ``version`` (``3.9``) release
    (``3.9``, ``3.9.18``, ``cpython-3.9.18-linux-x86_64-gnu``), else ``None``."""
    m = re.match(r"^(?:cpython-)?(\d+)\.(\d+)(?:\.(\d+))?(?:$|-)", name)
    if not m or f"{m.group(1)}.{m.group(2)}" != version:
        return None
    return tuple(int(g) for g in m.groups() if g is not None)


def _conda_roots() -> list[Path]:
    roots = [Path(p) for p in (os.environ.get("CONDA_PREFIX"), os.environ.get("CONDA_ROOT")) if p]
    home = Path.home()
    roots += [home / d for d in ("miniconda3", "anaconda3", "miniforge3", "mambaforge")]
    roots.append(Path("/opt/conda"))
    return roots


def python_search_places(version: str) -> list[tuple[str, list[Path]]]:
    """Where ``find_python`` looks for CPython ``version`` (``"3.9"``), in order: ``(label,
    candidate interpreters)``. The order: pyenv (``$FAK_PYENV_ROOT``, else ``$PYENV_ROOT``, else
    ``~/.pyenv``: ``versions/X.Y.*``), uv's managed Pythons (``$UV_PYTHON_INSTALL_DIR``, else
    ``~/.local/share/uv/python``: ``cpython-X.Y.*``), conda (``$CONDA_PREFIX``, ``~/miniconda3``,
    ``~/anaconda3``, ``~/miniforge3``, ``~/mambaforge``, ``/opt/conda``: the base and every
    ``envs/*`` holding ``bin/pythonX.Y``), then ``pythonX.Y`` on ``PATH``. Within a place the
    newest patch release comes first."""
    places: list[tuple[str, list[Path]]] = []

    def newest(root: Path, exe: str) -> list[Path]:
        found = []
        if root.is_dir():
            for d in root.iterdir():
                v = _version_of(d.name, version)
                if v is not None and (d / "bin" / exe).exists():
                    found.append((v, d / "bin" / exe))
        return [p for _, p in sorted(found, reverse=True)]

    pyenv = Path(os.environ.get("FAK_PYENV_ROOT") or os.environ.get("PYENV_ROOT")
                 or Path.home() / ".pyenv")
    places.append((f"pyenv {pyenv / 'versions'}", newest(pyenv / "versions", "python")))
    uv = Path(os.environ.get("UV_PYTHON_INSTALL_DIR")
              or Path.home() / ".local" / "share" / "uv" / "python")
    places.append((f"uv {uv}", newest(uv, f"python{version}")))
    conda: list[Path] = []
    roots = _conda_roots()
    for root in roots:
        for env in [root, *(sorted((root / "envs").iterdir()) if (root / "envs").is_dir() else [])]:
            exe = env / "bin" / f"python{version}"
            if exe.exists() and exe not in conda:
                conda.append(exe)
    places.append((f"conda {', '.join(str(r) for r in roots)}", conda))
    on_path = shutil.which(f"python{version}")
    places.append((f"PATH (python{version})", [Path(on_path)] if on_path else []))
    return places


def find_python(version: str) -> Path:
    """A CPython ``version`` (``"3.9"``) interpreter: the first of ``python_search_places``.

    Raises ``EnvError`` naming each place looked and the one command that installs it (``pyenv
    install``, ``uv python install``, or installing uv first)."""
    places = python_search_places(version)
    for _label, found in places:
        if found:
            return found[0]
    if shutil.which("pyenv"):
        fix = f"pyenv install {version}"
    elif shutil.which("uv"):
        fix = f"uv python install {version}"
    else:
        fix = f"pip install uv && uv python install {version}"
    looked = "; ".join(label for label, _ in places)
    raise EnvError(f"no Python {version} found (looked in: {looked}); install it with `{fix}`")


def conda_to_pip(spec: str) -> str | None:
    """A conda package spec as a pip requirement, or ``None`` for a conda-only package."""
    spec = spec.strip()
    m = re.match(r"^([A-Za-z0-9_.\-]+)\s*(.*)$", spec)
    if not m:
        return None
    name, ver = m.group(1), m.group(2).strip()
    if name.lower() in CONDA_ONLY:
        return None
    name = CONDA_TO_PIP.get(name.lower(), name)
    if ver.startswith("=") and not ver.startswith("=="):
        v = ver[1:].split("=")[0]  # drop a build string (name=1.2=py39_0)
        ver = f"=={v}" if v.count(".") >= 2 or "*" in v else f"=={v}.*"
    return f"{name}{ver}"


def requirements_from_mirror(repo: str, mirror: Path, commit: str) -> list[str]:
    """``requirements.txt`` of ``repo`` at ``commit`` (the paths the harness tries, ``-r``
    followed, ``-e .``/comments/``.[test`` dropped, yanked names replaced as the harness does)."""
    from swebench.harness.constants import MAP_REPO_TO_REQS_PATHS
    from swebench.harness.test_spec.python import clean_requirements

    for path in MAP_REPO_TO_REQS_PATHS.get(repo, []):
        text = read_file_at(mirror, commit, path)
        if text is None:
            continue
        base = path.rsplit("/", 1)[0] if "/" in path else ""
        out: list[str] = []
        for line in text.splitlines():
            s = line.strip()
            if s.startswith("-r"):
                sub = read_file_at(mirror, commit, f"{base}/{s[2:].strip()}".lstrip("/"))
                out.extend(x for x in (sub or "").splitlines()
                           if x.strip() and not x.strip().startswith(("-e .", "#", ".[test")))
            elif s and not s.startswith(("-e .", "#", ".[test")):
                out.append(s)
        return clean_requirements("\n".join(out)).splitlines()
    raise EnvError(f"no requirements file of {repo} at {commit} in the mirror")


def environment_yml_from_mirror(repo: str, mirror: Path, commit: str) -> list[str]:
    """Pip requirements made from ``environment.yml`` of ``repo`` at ``commit``: conda
    dependencies mapped with ``conda_to_pip`` plus the ``pip:`` section."""
    import yaml
    from swebench.harness.constants import MAP_REPO_TO_ENV_YML_PATHS

    for path in MAP_REPO_TO_ENV_YML_PATHS.get(repo, []):
        text = read_file_at(mirror, commit, path)
        if text is None:
            continue
        data = yaml.safe_load(text) or {}
        reqs: list[str] = []
        for dep in data.get("dependencies", []):
            if isinstance(dep, dict):
                reqs.extend(str(x) for x in dep.get("pip", []))
            else:
                req = conda_to_pip(str(dep))
                if req:
                    reqs.append(req)
        return reqs
    raise EnvError(f"no environment.yml of {repo} at {commit} in the mirror")


@dataclass
class Env:
    """A built environment: ``path`` (the venv), ``python`` (its interpreter), ``key``,
    ``unreproduced`` (requirements or steps that could not be reproduced), ``log`` (build log)."""

    key: str
    path: Path
    python: Path
    spec: dict[str, Any]
    unreproduced: list[str] = field(default_factory=list)
    log: Path | None = None
    #: what a sandbox running with this env must see (``fak.sandbox.venv_paths``, taken when
    #: fak made it); empty: compute it
    sandbox_paths: list[Path] = field(default_factory=list)

    def environ(self) -> dict[str, str]:
        """Process environment with the venv activated."""
        env = dict(os.environ)
        env.pop("PYTHONPATH", None)
        env.pop("PYTHONHOME", None)
        env["VIRTUAL_ENV"] = str(self.path)
        env["PATH"] = f"{self.path / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}"
        env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
        env["PIP_NO_INPUT"] = "1"
        return env

    def sandbox_env(self) -> dict[str, str]:
        """The venv's variables only, for ``fak.sandbox.Sandbox(env=...)`` (which adds its
        allow-listed host variables; ``environ()`` is the whole host environment, for fak's own
        env builds). The venv itself and its interpreter: ``fak.sandbox.venv_paths(self.path)``."""
        return {"VIRTUAL_ENV": str(self.path),
                "PATH": f"{self.path / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}",
                "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}


class EnvBuilder:
    """Builds and caches envs under ``root`` (``~/.cache/fak/swebench-envs``); thread-safe."""

    def __init__(self, root: Path | None = None):
        self.root = Path(root or DEFAULT_ENVS)
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def lock(self, key: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(key, threading.Lock())

    @staticmethod
    def key(repo: str, version: str) -> str:
        return f"{repo.replace('/', '__')}__{version}"

    def ready(self, repo: str, version: str) -> Env | None:
        """The env of ``repo`` ``version`` if it is already built and current (its stamp matches
        the spec), else ``None``; builds nothing, needs no network. ``None`` too when the
        harness has no spec for it."""
        try:
            spec = get_spec(repo, version)
        except EnvError:
            return None
        path = self.root / self.key(repo, version)
        stamp = path / ".fak-env.json"
        env_part = {k: spec.get(k) for k in ENV_KEYS}
        digest = hashlib.sha256(json.dumps(env_part, sort_keys=True).encode()).hexdigest()[:16]
        try:
            meta = json.loads(stamp.read_text())
        except (OSError, ValueError):
            return None
        if meta.get("spec_hash") != digest or not (path / "bin" / "python").exists():
            return None
        return Env(self.key(repo, version), path, path / "bin" / "python", spec,
                   meta.get("unreproduced", []), path / "build.log")

    def ensure(self, repo: str, version: str, mirror: Path, env_setup_commit: str) -> Env:
        """The env of ``repo`` ``version``, built now if missing or stale (caller holds
        ``lock(key)``). Raises ``EnvError`` when it cannot be built at all."""
        spec = get_spec(repo, version)
        key = self.key(repo, version)
        path = self.root / key
        stamp = path / ".fak-env.json"
        env_part = {k: spec.get(k) for k in ENV_KEYS}  # install steps run per instance, not here
        digest = hashlib.sha256(json.dumps(env_part, sort_keys=True).encode()).hexdigest()[:16]
        if stamp.exists():
            meta = json.loads(stamp.read_text())
            if meta.get("spec_hash") == digest:
                return Env(key, path, path / "bin" / "python", spec, meta.get("unreproduced", []),
                           path / "build.log")
        python = find_python(str(spec["python"]))
        shutil.rmtree(path, ignore_errors=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        venv_cmd = [str(python), "-m", "venv", str(path)]
        if spec.get("system_site_packages"):
            venv_cmd.insert(3, "--system-site-packages")
        proc = subprocess.run(venv_cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise EnvError(f"python -m venv failed for {key}: {proc.stderr.strip()[-800:]}")
        env = Env(key, path, path / "bin" / "python", spec, [], path / "build.log")
        with env.log.open("w") as log:
            self._pip(env, ["--upgrade", "pip"], log, required=False)
            reqs = self._requirements(repo, spec, mirror, env_setup_commit, env)
            if reqs:
                self._install_all(env, reqs, log)
            if spec.get("pip_packages"):
                self._install_all(env, list(spec["pip_packages"]), log)
        stamp.write_text(json.dumps({"spec_hash": digest, "spec": spec, "python": str(python),
                                     "unreproduced": env.unreproduced}, indent=1))
        return env

    def _requirements(self, repo: str, spec: dict[str, Any], mirror: Path, commit: str,
                      env: Env) -> list[str]:
        pkgs = spec.get("packages", "")
        if not pkgs:
            return []
        try:
            if pkgs == "requirements.txt":
                return requirements_from_mirror(repo, mirror, commit)
            if pkgs == "environment.yml":
                return environment_yml_from_mirror(repo, mirror, commit)
        except EnvError as e:
            env.unreproduced.append(str(e))
            return []
        out = []
        for token in shlex.split(pkgs):
            req = conda_to_pip(token)
            if req is None:
                env.unreproduced.append(f"conda-only package {token}")
            else:
                out.append(req)
        return out

    def _pip(self, env: Env, args: list[str], log: Any, required: bool = True) -> bool:
        cmd = [str(env.python), "-m", "pip", "install", *args]
        log.write(f"$ {shlex.join(cmd)}\n")
        log.flush()
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env.environ())
        return proc.returncode == 0

    def _install_all(self, env: Env, reqs: list[str], log: Any) -> None:
        reqs = [r for r in reqs if r.strip()]
        if self._pip(env, reqs, log):
            return
        for r in reqs:  # one at a time, to find what cannot be installed
            if not self._pip(env, [r], log):
                env.unreproduced.append(f"pip install {r} failed")


def _purelib(python: Path) -> Path:
    """The site-packages folder of the venv of ``python`` (``VENV/bin/python``). The interpreter
    runs on the host isolated (``-E -s``: no ``PYTHON*`` variables, no user site; ``-I`` is
    not in every Python a spec names) and without
    ``site`` (``-S``), so no ``.pth`` file, ``sitecustomize`` or ``usercustomize`` of the venv
    runs; without ``site`` it does not know it is in a venv, so the venv is given as the scheme's
    base (``sysconfig.get_paths(vars=...)``)."""
    venv = Path(python).parent.parent
    code = ("import sys, sysconfig; print(sysconfig.get_paths(vars={'base': sys.argv[1], "
            "'platbase': sys.argv[1]})['purelib'])")
    out = subprocess.run([str(python), "-E", "-s", "-S", "-c", code, str(venv)],
                         capture_output=True, text=True, check=True).stdout.strip()
    return Path(out)


def overlay_environment(overlay: Env, shared: Env) -> dict[str, str]:
    """The variables a command run with ``overlay`` needs: ``VIRTUAL_ENV`` and a ``PATH`` of the
    overlay's ``bin``, the shared env's ``bin``, then ``SYSTEM_PATH`` (never the host's)."""
    return {"VIRTUAL_ENV": str(overlay.path),
            "PATH": f"{overlay.path / 'bin'}:{shared.path / 'bin'}:{SYSTEM_PATH}",
            "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}


def overlay_test_command(cmd: str) -> str:
    """A spec's test command for an overlay: a leading ``pytest`` (after ``VAR=value``
    assignments) becomes ``python -m pytest``, so the overlay's interpreter runs it (an overlay
    has no console scripts; the shared env's ``pytest`` would not see the repository
    installed in the overlay)."""
    return _PYTEST_CMD.sub(r"\1python -m pytest", cmd)


def make_overlay(env: Env, dest: Path, workspace: Path, log_path: Path, *,
                 unsafe_no_sandbox: bool = False, timeout_s: float = 1800.0) -> Env:
    """A per-instance venv at ``dest`` layered over the shared ``env`` (a ``.pth`` file puts the
    shared site-packages on its path), with the task repository installed from ``workspace`` by
    the spec's ``pre_install`` (machine-changing steps skipped) and ``install`` steps.

    The steps run in ``fak.sandbox`` with the host's network (pip), the workspace (its ``.git``
    read-only) and ``dest`` the only writable trees: the shared env stays read-only, so nothing an install writes (a
    model's ``setup.py`` in ``eval --local``) lands where fak's own host-side steps run it
    later. ``unsafe_no_sandbox``: on the host instead. ``timeout_s`` bounds each step
    (seconds). The result's ``sandbox_paths`` are the paths its sandboxes must see, taken
    before any step ran. Several instances of one (repo, version) can run at once, each with
    its own editable install. Raises ``EnvError`` when the venv cannot be made or no sandbox
    can be made here.
    """
    shutil.rmtree(dest, ignore_errors=True)
    base_python = find_python(str(env.spec["python"]))
    cmd = [str(base_python), "-m", "venv", "--without-pip", str(dest)]
    if env.spec.get("system_site_packages"):
        cmd.insert(3, "--system-site-packages")
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise EnvError(f"python -m venv failed for {dest}: {proc.stderr.strip()[-800:]}")
    overlay = Env(env.key, dest, dest / "bin" / "python", env.spec, list(env.unreproduced), log_path)
    (_purelib(overlay.python) / SHARED_ENV_PTH).write_text(f"{_purelib(env.python)}\n")
    overlay.sandbox_paths = venv_paths(dest)  # before anything else can write the overlay
    steps = [c for c in env.spec.get("pre_install", []) if not SYSTEM_COMMAND.search(c)]
    if env.spec.get("install"):
        steps.append(env.spec["install"])
    box = None
    if steps and not unsafe_no_sandbox:
        git_dir = Path(workspace) / ".git"
        try:
            box = Sandbox(workspace, writable=[dest], readable=overlay.sandbox_paths,
                          readonly=[git_dir] if git_dir.is_dir() else [],
                          env={**overlay.sandbox_env(), "PIP_NO_CACHE_DIR": "1"},
                          timeout_s=timeout_s, net="host",
                          limits=Limits(processes=1024, output_bytes=256 * MiB))
        except SandboxUnavailable as e:
            raise EnvError(f"installing the task repository into {dest} runs in the sandbox, "
                           f"which cannot be made here: {e}; --unsafe-no-sandbox runs it on "
                           "the host") from None
    with log_path.open("w") as log:
        for cmd in steps:
            log.write(f"$ {cmd}\n")
            log.flush()
            if box is not None:
                res = box.run(["bash", "-c", cmd])
                log.write(res.output)
                rc = res.returncode
                note = f" [{res.note}]" if res.note else ""
            else:
                rc = subprocess.run(["bash", "-c", cmd], cwd=workspace, env=overlay.environ(),
                                    stdout=log, stderr=subprocess.STDOUT).returncode
                note = ""
            log.write(f"[exit {rc}]{note}\n")
            if rc != 0:
                overlay.unreproduced.append(f"step failed: {cmd}")
    return overlay
