"""The quarantine detectors on real files nobody wrote for fak: source, docs, READMEs and test
fixtures of the packages installed in this environment, read at test time (nothing is copied into
the repository, nothing read is executed).

For each package of :data:`PACKAGES` that is installed, :data:`PER_PACKAGE` of its ``.py``,
``.md``, ``.rst`` and ``.txt`` files are taken at even strides through the sorted list, plus its
``*.dist-info/METADATA`` (the project's README as published). Chat-heavy packages (``openai``,
``huggingface_hub``, ``anthropic``, ``swebench``'s prompts) are in the list on purpose: their docs
show ``User:``/``Assistant:`` turns, prompt templates and notes to models. The false-positive rate
per file must stay under 1% (issue 26's bar); the withheld files print with ``-s``. The whole of
``site-packages`` and the task repositories are measured by ``benches/bench_quarantine_recall.py``.
"""

from __future__ import annotations

import importlib.util
from importlib import metadata
from pathlib import Path

import pytest
from fak.quarantine import scan

PACKAGES = ("_pytest", "pytest", "hypothesis", "litestar", "numpy", "jinja2", "openai", "rich", "httpx", "pydantic",
            "click", "requests", "urllib3", "yaml", "markdown_it", "pygments", "tokenizers", "huggingface_hub",
            "anthropic", "swebench", "datasets", "mypy", "msgspec", "anyio", "uvicorn", "prometheus_client",
            "polyfactory", "schemathesis", "faker", "git", "tqdm", "pandas", "pip", "setuptools")
DISTRIBUTIONS = ("pytest", "hypothesis", "litestar", "numpy", "Jinja2", "openai", "rich", "httpx", "pydantic", "click",
                 "requests", "urllib3", "PyYAML", "markdown-it-py", "Pygments", "tokenizers", "huggingface-hub",
                 "anthropic", "swebench", "datasets", "mypy", "msgspec", "anyio", "uvicorn", "Faker", "GitPython",
                 "tqdm", "pandas", "polyfactory", "schemathesis")
PER_PACKAGE = 12
EXTS = (".py", ".md", ".rst", ".txt")
MAX_BYTES = 2 << 20


def _package_files(name: str) -> list[Path]:
    spec = importlib.util.find_spec(name) if name.isidentifier() else None
    if spec is None or not spec.submodule_search_locations:
        return []
    root = Path(next(iter(spec.submodule_search_locations)))
    files = sorted(p for p in root.rglob("*") if p.suffix in EXTS and p.is_file() and 0 < p.stat().st_size <= MAX_BYTES
                   and "__pycache__" not in p.parts)
    if len(files) <= PER_PACKAGE:
        return files
    step = len(files) / PER_PACKAGE
    return [files[int(i * step)] for i in range(PER_PACKAGE)]


def _texts() -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for name in PACKAGES:
        for p in _package_files(name):
            try:
                out.append((f"{name}:{p.name}", p.read_text(encoding="utf-8")))
            except (UnicodeDecodeError, OSError):
                continue
    for dist in DISTRIBUTIONS:
        try:
            readme = metadata.distribution(dist).read_text("METADATA")
        except metadata.PackageNotFoundError:
            continue
        if readme:
            out.append((f"{dist}:METADATA", readme))
    return out


TEXTS = _texts()


def test_installed_packages_are_enough() -> None:
    assert len(TEXTS) >= 200, f"only {len(TEXTS)} real files found; install the test dependencies"


def test_false_positive_rate_on_real_files() -> None:
    if len(TEXTS) < 200:
        pytest.skip("too few installed packages")
    withheld = []
    for name, text in TEXTS:
        r = scan(text)
        if r.fired:
            withheld.append((name, r.fired, r.features))
    rate = len(withheld) / len(TEXTS)
    print(f"\nreal files: {len(TEXTS)} screened, {len(withheld)} withheld ({100 * rate:.2f}%): {withheld}")
    assert rate < 0.01, withheld
