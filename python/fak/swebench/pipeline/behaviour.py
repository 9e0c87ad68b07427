"""What a candidate was observed to do (issue 31, selection by behaviour): the outcome class of
each of its runs of a kept reproduction script, its regression tests' result, and the clusters of
candidates that were observed to do the same.

An *outcome* of one run of a script (``outcome``, recorded by the ``test`` stage per candidate and
script as ``candidate_test.repro_out``):

- ``"pass"``: it exited 0 (the script's own verdict: fixed);
- ``"timeout"``: it was killed (its timeout, the candidate's limit);
- ``"fail: LINE"``: it ended with a traceback, ``LINE`` the last exception line (``KIND: message``)
  normalised: the work tree's path is ``.`` (every worker has its own copy), memory addresses are
  ``0x?``, white space collapsed, at most ``MESSAGE_CHARS`` characters;
- ``"exit N: LINE"``: a non-zero exit without a traceback, ``LINE`` the last line of its output,
  normalised the same way (``exit N`` when it printed nothing).

Older ``test`` artifacts have only the exit statuses (``repro``): there the outcome is ``pass``,
``timeout`` or ``exit N`` (``outcome_of_status``).

A candidate's *behaviour* (``behaviour``) is its outcome on each kept script (``None`` where
that run did not happen: cut, or could not start) and its regression observation: ``("ran",
failures)`` when all its test files ran (``regression_failures``: the tests that passed on the
original code and fail with it), ``("partial", failures)`` when some were cut
(``regression_partial``), ``None`` when none ran (or could not start). Candidates with equal
behaviours form a *cluster* (``clusters``); an observation that did not happen is a value of its
own, so a candidate is never put with others on what was not observed of it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fak.swebench.pipeline.execute import RunResult

#: the most characters of a failure's message kept in its outcome
MESSAGE_CHARS = 160
_EXC_LINE = re.compile(r"^(?:[\w.]+\.)?[A-Z]\w*(?:Error|Exception|Exit|Failure|Warning)\b")
_ADDR = re.compile(r"0x[0-9a-fA-F]+")
_SPACE = re.compile(r"\s+")


def _normal(line: str, root: Path | str | None) -> str:
    if root:
        line = line.replace(str(root).rstrip("/") + "/", "./").replace(str(root), ".")
    return _SPACE.sub(" ", _ADDR.sub("0x?", line)).strip()[:MESSAGE_CHARS]


def outcome(res: RunResult, root: Path | str | None = None) -> str:
    """The outcome class of one script run ``res`` (module docstring); ``root``: the work tree
    it ran in, written ``.`` in the message."""
    if res.killed:
        return "timeout"
    if res.returncode == 0:
        return "pass"
    lines = [ln.strip() for ln in res.output.splitlines() if ln.strip()]
    exc = next((ln for ln in reversed(lines) if _EXC_LINE.match(ln)), None)
    if exc is not None:
        return f"fail: {_normal(exc, root)}"
    last = _normal(lines[-1], root) if lines else ""
    return f"exit {res.returncode}" + (f": {last}" if last else "")


def outcome_of_status(returncode: int | None) -> str:
    """The outcome class when only the exit status was recorded (``repro``)."""
    if returncode is None:
        return "timeout"
    return "pass" if returncode == 0 else f"exit {returncode}"


def tested(result: dict[str, Any] | None) -> bool:
    """Whether a ``candidate_test`` record is a result: applied, and not a record whose scripts
    could none of them start (``repro_env_error`` without ``repro``)."""
    return result is not None and bool(result.get("applied")) and (
        "repro" in result or "repro_env_error" not in result)


def script_outcomes(result: dict[str, Any], scripts: list[str]) -> dict[str, str | None]:
    """The outcome of each of ``scripts`` in ``result`` (a ``candidate_test`` record): the
    recorded ``repro_out``, else from the exit status; ``None`` where it did not run."""
    out = result.get("repro_out") or {}
    statuses = result.get("repro") or {}
    return {s: out[s] if s in out else (outcome_of_status(statuses[s]) if s in statuses else None)
            for s in scripts}


def regression(result: dict[str, Any]) -> tuple[str, tuple[str, ...]] | None:
    """The regression observation of a ``candidate_test`` record (module docstring)."""
    if "regression_failures" in result:
        return ("ran", tuple(sorted(result["regression_failures"])))
    if "regression_partial" in result:
        return ("partial", tuple(sorted(result["regression_partial"])))
    return None


def behaviour(result: dict[str, Any], scripts: list[str]) -> tuple:
    """The behaviour of a tested candidate: ``(outcomes in the order of scripts, regression)``."""
    outs = script_outcomes(result, scripts)
    return (tuple(outs[s] for s in scripts), regression(result))


@dataclass
class Cluster:
    """Candidates observed to behave the same: ``members`` (candidate records, the
    representative first: most votes, then the smallest diff, then the earlier id),
    ``outcomes`` {script: outcome}, ``regression`` (the observation, see ``regression``)."""

    members: list[dict[str, Any]]
    outcomes: dict[str, str | None]
    regression: tuple[str, tuple[str, ...]] | None
    index: int = 0
    score: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def representative(self) -> dict[str, Any]:
        return self.members[0]

    @property
    def votes(self) -> int:
        """The cluster's size: the votes of its members summed (answers that gave one of them)."""
        return sum(int(c["votes"]) for c in self.members)

    @property
    def fixed(self) -> list[str]:
        """The scripts it passes."""
        return [s for s, o in self.outcomes.items() if o == "pass"]


def candidate_order(c: dict[str, Any]) -> tuple:
    """Within a cluster: most votes, then the smallest diff, then the earlier candidate."""
    return (-int(c["votes"]), int(c["diff_lines"]), candidate_number(c["id"]))


def candidate_number(cid: Any) -> int:
    """The number of candidate id ``cN`` (``repair``'s ids; 0 for anything else): the last
    tie-break of every order of candidates."""
    s = str(cid).lstrip("c")
    return int(s) if s.isdigit() else 0


def clusters(candidates: list[dict[str, Any]], results: dict[str, dict[str, Any]],
             scripts: list[str]) -> list[Cluster]:
    """The clusters of the tested candidates (``tested``) by behaviour over the kept
    ``scripts``; each cluster's members in ``candidate_order``; clusters in the order of their
    first member among ``candidates`` (the caller orders them)."""
    by_key: dict[tuple, Cluster] = {}
    for c in candidates:
        r = results.get(c["id"])
        if not tested(r):
            continue
        key = behaviour(r, scripts)
        if key not in by_key:
            by_key[key] = Cluster([], dict(zip(scripts, key[0])), key[1])
        by_key[key].members.append(c)
    out = list(by_key.values())
    for cl in out:
        cl.members.sort(key=candidate_order)
    return out
