"""The prompts are data (Jinja templates) with no placeholder a small model could copy: every
example is a real path or name of the task's repository (``fak.agent.context``).

To add a case: put a template in ``python/fak/agent/prompts`` and it is checked here; a new
placeholder to forbid goes in ``PLACEHOLDERS``.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from fak.agent.context import (
    PROMPT_DEFAULTS,
    normalize_seeds,
    package_dir,
    prompt_variables,
)
from fak.agent.prompts import PROMPTS_DIR, render
from fak.agent.protocols import get_protocol

#: what the CPU runs copied literally (benches/results/swebench-cpu-1.5b.md), and its kin
PLACEHOLDERS = ("src/package/module.py", "src/package", "NAME", "old text", "new text", "FILE",
                "PATH", "path/to/", "def name", "def parse", "module.py", "foo", "xxx")
TEMPLATES = sorted(PROMPTS_DIR.glob("*.j2"))


def test_templates_are_found():
    assert {"system_tools.j2", "system_text.j2", "instance.j2", "format_error_text.j2",
            "repeated.j2"} <= {t.name for t in TEMPLATES}


@pytest.mark.parametrize("template", TEMPLATES, ids=lambda p: p.name)
def test_no_placeholder_in_any_template(template: Path):
    text = template.read_text()
    for word in PLACEHOLDERS:
        pattern = r"\b" + re.escape(word) + r"\b" if word.isalnum() else re.escape(word)
        assert not re.search(pattern, text), f"{template.name} holds the placeholder {word!r}"


def _git_repo(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run(["git", "add", "-A"], cwd=root, check=True)
    return root


MODULE = "import os\n\n\ndef load(path):\n    return open(path).read()\n" + "# pad\n" * 400


def test_prompts_show_real_paths_of_the_workspace(tmp_path):
    root = _git_repo(tmp_path / "r", {
        "setup.py": "", "mypkg/__init__.py": "", "mypkg/io/__init__.py": "",
        "mypkg/io/files.py": MODULE, "mypkg/io/tests/test_files.py": "def test_load():\n    pass\n",
        "docs/conf.py": "def setup(app):\n    pass\n"})
    v = prompt_variables(root, "someone/mypkg")
    assert v["example_path"] == "mypkg/io/files.py" and v["example_symbol"] == "load"
    assert v["example_dir"] == "mypkg" and v["example_test"] == "mypkg/io/tests/test_files.py"
    assert v["example_old"] == "def load(path):\n    return open(path).read()"
    text = get_protocol("text", allow_exec=True)
    text.context = v
    system = text.system_prompt()
    assert 'p = pathlib.Path("mypkg/io/files.py")' in system
    assert "old = '''def load(path):\n    return open(path).read()'''" in system
    assert 'grep -rn "def load" mypkg/' in system
    assert "python -m pytest mypkg/io/tests/test_files.py -x -q" in system
    assert 'grep -rn "def load" mypkg/' in text.format_error("no ```bash block found")["content"]
    tools = get_protocol("tools", allow_exec=True)
    tools.context = v
    system = tools.system_prompt()
    assert "for example `mypkg/io/files.py`" in system and "`load`" in system
    # every path named in the prompts exists in the workspace
    for key in ("example_path", "example_test", "example_dir"):
        assert (root / v[key]).exists()


def test_seed_symbol_and_file_lead_the_examples(tmp_path):
    root = _git_repo(tmp_path / "r", {"mypkg/__init__.py": "", "mypkg/a.py": MODULE,
                                      "mypkg/b.py": "class Thing:\n    pass\n"})
    v = prompt_variables(root, "x/mypkg", [{"path": "mypkg/b.py", "symbol": "Thing", "line": 1}])
    assert v["example_path"] == "mypkg/b.py" and v["example_symbol"] == "Thing"
    assert v["seed_lines"] == ["mypkg/b.py line 1 (Thing)"]


def test_templates_render_with_the_defaults_only():
    """Nothing known about the task (no workspace): every template still renders."""
    for proto in (get_protocol("tools", allow_exec=True), get_protocol("text", allow_exec=True)):
        assert proto.system_prompt() and proto.instance_prompt()
        assert proto.format_error("x")["content"]
    out = render("repeated.j2", tool="search", step=3, ok=True)
    assert out.startswith("[not run] You already made this exact call at step 3")
    assert set(PROMPT_DEFAULTS) >= {"example_path", "seeds", "python_note", "listing"}


def test_package_dir_layouts():
    assert package_dir(["sympy/__init__.py", "sympy/core/basic.py", "doc/conf.py"],
                       "sympy/sympy") == "sympy"
    assert package_dir(["src/_pytest/__init__.py", "src/_pytest/a.py", "src/_pytest/b.py",
                        "src/pytest/__init__.py", "testing/__init__.py", "testing/x.py",
                        "testing/y.py", "testing/z.py"], "pytest-dev/pytest") == "src/_pytest"
    assert package_dir(["requests/__init__.py", "requests/api.py", "tests/__init__.py"],
                       "psf/requests") == "requests"
    assert package_dir(["calc.py"], "t/calc") is None


def test_normalize_seeds(tmp_path):
    root = _git_repo(tmp_path / "r", {"a.py": "x = 1\n", "d/b.py": "y = 2\n"})
    seeds = normalize_seeds(root, [{"path": "./a.py", "line": 0}, {"path": "d/b.py", "line": 2,
                                   "symbol": " y "}, {"path": "../escape.py"}, {"line": 3},
                                   {"path": "missing.py"}, "d/b.py", 42, {"path": "a.py"}])
    assert seeds == [{"path": "a.py"}, {"path": "d/b.py", "line": 2, "symbol": "y"},
                     {"path": "d/b.py"}]
    assert normalize_seeds(root, None) == []
