"""Which Python the agent's bash gets without ``--task-env``: a task env already built wins, an
interpreter that cannot import the package is reported as such, and the fleet hands the choice,
the note and a localizer's seed locations to the agent (the localizer never sees the answer).

To add a case: make a small git repo with ``_repo``, call ``choose_python`` and check the choice.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from fak.agent.tools import check_network_isolation
from fak.swebench.envs import ENV_KEYS, EnvBuilder, register_specs
from fak.swebench.interpreter import choose_python

needs_netns = pytest.mark.skipif(check_network_isolation() is not None,
                                 reason="unshare -n not permitted here")
PY = f"{sys.version_info.major}.{sys.version_info.minor}"


def _repo(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run(["git", "add", "-A"], cwd=root, check=True)
    return root


def _fake_ready_env(builder: EnvBuilder, repo: str, version: str, spec: dict) -> Path:
    """A venv in the cache with the stamp ``EnvBuilder.ensure`` writes: 'already built'."""
    path = builder.root / EnvBuilder.key(repo, version)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages",
                    str(path)], check=True)
    digest = hashlib.sha256(json.dumps({k: spec.get(k) for k in ENV_KEYS},
                                       sort_keys=True).encode()).hexdigest()[:16]
    (path / ".fak-env.json").write_text(json.dumps({"spec_hash": digest, "unreproduced": []}))
    return path


@needs_netns
def test_a_built_task_env_is_preferred(tmp_path):
    spec = {"python": PY, "system_site_packages": True, "install": "", "test_cmd": "pytest"}
    register_specs({"fak-test/goodpkg": {"1.0": spec}})
    root = _repo(tmp_path / "ws", {"goodpkg/__init__.py": "X = 1\n", "goodpkg/core.py": "Y = 2\n"})
    builder = EnvBuilder(tmp_path / "envs")
    assert builder.ready("fak-test/goodpkg", "1.0") is None
    env = _fake_ready_env(builder, "fak-test/goodpkg", "1.0", spec)
    assert builder.ready("fak-test/goodpkg", "1.0").path == env
    choice = choose_python(root, "fak-test/goodpkg", "1.0", builder)
    assert choice.label.startswith("the task's environment") and choice.imports is True
    assert choice.env_overrides["PATH"].startswith(f"{env / 'bin'}:")
    assert choice.env_overrides["VIRTUAL_ENV"] == str(env)
    assert choice.version == ".".join(map(str, sys.version_info[:3]))
    assert "`import goodpkg` works" in choice.note and f"Python {choice.version}" in choice.note
    assert len(choice.tried) == 1


@needs_netns
def test_a_package_that_imports_nowhere_is_reported(tmp_path):
    root = _repo(tmp_path / "ws", {"badpkg/__init__.py": "import fak_no_such_module\n"})
    choice = choose_python(root, "fak-test/badpkg", "9.9", EnvBuilder(tmp_path / "envs"))
    assert choice.imports is False and choice.label == "the machine's python3"
    assert all(not t["ok"] for t in choice.tried)
    assert ("`import badpkg` fails with it (ModuleNotFoundError: No module named "
            "'fak_no_such_module')") in choice.note
    assert "find and fix the code by reading it" in choice.note


@needs_netns
def test_fleet_gives_seed_locations_and_python_note_to_the_agent(tiny, scripted, tmp_path):
    from fak.swebench.fleet import Fleet
    from fak.swebench.instance import HIDDEN_FIELDS, FleetConfig
    from tiny import tools_script_fix_add

    seen: list[dict] = []

    def localizer(row: dict, root: Path) -> list[dict]:
        seen.append(row)
        assert (root / "calc.py").is_file()
        return [{"path": "calc.py", "line": 1, "symbol": "add"}]

    server = scripted({"fak-test__calc-1": tools_script_fix_add()})
    cfg = FleetConfig(gateway=server.url, model="scripted", output=tmp_path / "out",
                      repos_dir=tiny["repos"], allow_exec=True, localizer=localizer,
                      on_repeat="tell", live=False)
    rows = [r for r in tiny["rows"] if r["instance_id"] == "fak-test__calc-1"]
    Fleet(cfg, rows).run()
    assert not set(HIDDEN_FIELDS) & set(seen[0]) and seen[0]["problem_statement"]
    traj = json.loads((tmp_path / "out" / "trajectories" / "fak-test__calc-1.traj.json").read_text())
    assert traj["exit_reason"] == "submitted"
    first = traj["messages"][1]["content"]
    assert "Likely relevant" in first and "- calc.py line 1 (add)" in first
    assert "In the shell, `python` is Python" in first
    assert traj["info"]["python"]["tried"] and traj["config"]["on_repeat"] == "tell"
