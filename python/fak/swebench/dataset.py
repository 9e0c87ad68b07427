"""SWE-bench rows: loading, filtering by id/regex/named slice, difficulty labels.

Rows keep the official field names of ``princeton-nlp/SWE-bench_Verified`` (``repo``,
``instance_id``, ``base_commit``, ``patch``, ``test_patch``, ``problem_statement``, ``version``,
``FAIL_TO_PASS``, ``PASS_TO_PASS``, ``environment_setup_commit``, ...). ``FAIL_TO_PASS`` and
``PASS_TO_PASS`` are JSON-encoded strings in the dataset; ``parse_test_list`` decodes either form.

Sources: a ``.json`` file (a list of rows), a ``.jsonl`` file (one row per line), or a Hugging Face
dataset name (``princeton-nlp/SWE-bench_Verified`` or ``name:split``) through the ``datasets``
library where a network is there.

Filters (``--filter``): ``smoke`` (the named slice shipped in ``data/smoke.txt``), a
comma-separated list of instance ids, or else a regular expression searched in each id.

Difficulty (``--difficulty FILE``): a JSON map ``{instance_id: label}``, a JSON/JSONL list of
objects with ``instance_id`` and ``difficulty`` (the ``verified-smoke.meta.jsonl`` shape), or,
with no file, the rows' own ``difficulty`` field. Labels are Verified's (``"<15 min fix"``,
``"15 min - 1 hour"``, ``"1-4 hours"``, ``">4 hours"``); ``easy``, ``medium``, ``hard`` and
``very_hard`` are accepted as their aliases.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

DATA_DIR = Path(__file__).resolve().parent / "data"
SLICES = {"smoke": DATA_DIR / "smoke.txt"}
DIFFICULTY_ALIASES = {"easy": "<15 min fix", "medium": "15 min - 1 hour", "hard": "1-4 hours",
                      "very_hard": ">4 hours", "very-hard": ">4 hours"}


class DatasetError(ValueError):
    """A dataset, filter or difficulty file that cannot be used; the message says why."""


def parse_test_list(value: Any) -> list[str]:
    """``FAIL_TO_PASS`` / ``PASS_TO_PASS`` as a list of test names (JSON string or list)."""
    if value is None or value == "":
        return []
    if isinstance(value, str):
        value = json.loads(value)
    if not isinstance(value, list):
        raise DatasetError(f"expected a list of tests, got {type(value).__name__}")
    return [str(v) for v in value]


def _read_rows(path: Path) -> list[dict[str, Any]]:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl" or (text.lstrip()[:1] == "{" and "\n{" in text):
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    data = json.loads(text)
    if isinstance(data, dict):
        data = data.get("rows") or data.get("instances") or list(data.values())
    if not isinstance(data, list):
        raise DatasetError(f"{path}: expected a list of rows")
    return data


def load_rows(source: str | Path) -> list[dict[str, Any]]:
    """All rows of ``source`` (file path or Hugging Face dataset name).

    Raises ``DatasetError`` when the file is missing or malformed, or the name cannot be loaded.
    """
    path = Path(source)
    if path.exists():
        rows = _read_rows(path)
    elif str(source).endswith((".json", ".jsonl")):
        raise DatasetError(f"dataset file {source} does not exist")
    else:
        rows = _load_hf(str(source))
    for i, row in enumerate(rows):
        missing = [k for k in ("instance_id", "repo", "base_commit") if k not in row]
        if missing:
            raise DatasetError(f"{source}: row {i} lacks {', '.join(missing)}")
    return rows


def _load_hf(name: str) -> list[dict[str, Any]]:
    name, _, split = name.partition(":")
    try:
        import datasets  # noqa: PLC0415 - optional, heavy
    except ImportError:
        raise DatasetError(f"{name} is not a file and the `datasets` package is not installed") from None
    try:
        ds = datasets.load_dataset(name, split=split or "test")
    except Exception as e:  # noqa: BLE001 - no network, unknown name, ...
        raise DatasetError(f"could not load dataset {name!r}: {e}") from None
    return [dict(r) for r in ds]


def slice_ids(name: str) -> list[str]:
    """The instance ids of a named slice (``smoke``)."""
    path = SLICES[name]
    return [ln.strip() for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#")]


def apply_filter(rows: list[dict[str, Any]], spec: str | None) -> list[dict[str, Any]]:
    """Rows selected by ``spec`` (``smoke`` | ``ID,ID,...`` | regex), in dataset order.

    Raises ``DatasetError`` when ids of a slice or list are not in the dataset, or when nothing
    matches.
    """
    if not spec:
        return rows
    by_id = {r["instance_id"]: r for r in rows}
    if spec in SLICES:
        wanted = slice_ids(spec)
        absent = [i for i in wanted if i not in by_id]
        if absent:
            raise DatasetError(f"slice {spec!r}: {len(absent)} ids not in the dataset "
                               f"(e.g. {absent[0]}); use a dataset that contains them")
        keep = set(wanted)
        return [r for r in rows if r["instance_id"] in keep]
    tokens = [t.strip() for t in spec.split(",") if t.strip()]
    if tokens and all(t in by_id for t in tokens):
        keep = set(tokens)
        return [r for r in rows if r["instance_id"] in keep]
    try:
        pattern = re.compile(spec)
    except re.error as e:
        raise DatasetError(f"--filter {spec!r} is neither known ids nor a valid regex ({e})") from None
    selected = [r for r in rows if pattern.search(r["instance_id"])]
    if not selected:
        raise DatasetError(f"--filter {spec!r} matches no instance")
    return selected


def load_difficulty(path: str | Path | None, rows: list[dict[str, Any]]) -> dict[str, str]:
    """Map ``instance_id → difficulty label`` from ``path`` (see module docstring), or from the
    rows' ``difficulty`` field when ``path`` is ``None``."""
    if path is None:
        return {r["instance_id"]: r["difficulty"] for r in rows if r.get("difficulty")}
    p = Path(path)
    text = p.read_text(encoding="utf-8")
    try:
        data: Any = json.loads(text)
    except json.JSONDecodeError:
        data = [json.loads(line) for line in text.splitlines() if line.strip()]
    if isinstance(data, dict):
        return {str(k): str(v) for k, v in data.items()}
    if isinstance(data, list):
        return {str(o["instance_id"]): str(o["difficulty"]) for o in data
                if isinstance(o, dict) and "instance_id" in o and o.get("difficulty")}
    raise DatasetError(f"{path}: expected a JSON map or a list of objects with difficulty")


def filter_difficulty(rows: list[dict[str, Any]], labels_by_id: dict[str, str],
                      wanted: list[str]) -> list[dict[str, Any]]:
    """Rows whose label is one of ``wanted`` (aliases allowed); all rows when ``wanted`` is empty."""
    if not wanted:
        return rows
    want = {DIFFICULTY_ALIASES.get(w, w) for w in wanted}
    return [r for r in rows if labels_by_id.get(r["instance_id"]) in want]


def select(source: str | Path, filter_spec: str | None = None, difficulty_file: str | Path | None = None,
           difficulty_labels: list[str] | None = None) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Rows of ``source`` after the filter and the difficulty selection, and the labels map."""
    rows = apply_filter(load_rows(source), filter_spec)
    labels = load_difficulty(difficulty_file, rows) if (difficulty_file or difficulty_labels) else {}
    rows = filter_difficulty(rows, labels, list(difficulty_labels or []))
    if not rows:
        raise DatasetError("no instance left after filtering")
    return rows, labels
