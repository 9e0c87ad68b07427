"""What the pipeline may know about an instance: the honesty boundary.

A dataset row carries the instance's grading material as well as its task. The pipeline is given
only ``task_view(row)``: an allow-list of the fields a developer has when the issue is filed (the
repository, the commit, the issue text, the version used to pick the task's environment, and,
only when asked, the issue thread's hints). Everything else in the row never reaches a stage, a
prompt or an artifact; ``tests/swebench/test_pipeline_honest.py`` poisons the other fields and
checks that the outputs do not change.
"""

from __future__ import annotations

from typing import Any

#: the fields of a row the pipeline reads (SWE-bench Verified names)
TASK_FIELDS = ("instance_id", "repo", "base_commit", "problem_statement", "version",
               "environment_setup_commit", "created_at")
HINTS_FIELD = "hints_text"


def task_view(row: dict[str, Any], hints: bool = False) -> dict[str, Any]:
    """The allow-listed fields of ``row`` (``hints_text`` only with ``hints``), as a new dict.

    Raises ``KeyError`` when ``instance_id``, ``repo`` or ``base_commit`` is missing.
    """
    view = {k: row[k] for k in TASK_FIELDS if k in row}
    for k in ("instance_id", "repo", "base_commit"):
        if k not in view:
            raise KeyError(f"dataset row lacks {k}")
    view.setdefault("problem_statement", "")
    view["version"] = str(view.get("version", ""))
    if hints and row.get(HINTS_FIELD):
        view[HINTS_FIELD] = str(row[HINTS_FIELD])
    return view


def issue_text(task: dict[str, Any], max_chars: int = 6000) -> str:
    """The issue as shown to the model: the problem statement (and the hints, when the task view
    carries them), cut to ``max_chars`` characters (head and tail kept)."""
    from fak.agent.tools import truncate_middle

    text = str(task.get("problem_statement") or "").strip()
    if task.get(HINTS_FIELD):
        text += "\n\nHints from the discussion:\n" + str(task[HINTS_FIELD]).strip()
    return truncate_middle(text, max_chars)
