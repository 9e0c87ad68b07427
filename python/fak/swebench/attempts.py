"""The rules of ``fak swebench run --attempts N`` (several independent fleet agents per
instance): the names and seeds of attempts, the record of finished attempts an output folder keeps
(``attempts.json``), and the choice of the one patch per instance that ``predictions.json``
holds. Nothing here reads a row's grading fields. The fleet that runs the attempts is
``fak.swebench.fleet``.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

#: the record of finished attempts of a run with ``attempts`` > 1 (read back by a re-run)
ATTEMPTS_FILE = "attempts.json"
ATTEMPTS_FORMAT = "fak-attempts/1"
#: ``select_attempt``'s reasons, in the order of the rule
SELECT_REASONS = ("submitted_patch", "unsubmitted_patch", "no_patch")


def unit_key(instance_id: str, attempt: int) -> str:
    """The name of attempt ``attempt`` of an instance in file names and conversation ids: the
    instance id itself for attempt 0 (as in a run without attempts), ``ID.a{k}`` for k >= 1."""
    return instance_id if attempt == 0 else f"{instance_id}.a{attempt}"


def attempt_seed(instance_id: str, attempt: int) -> int:
    """The sampling seed of attempt ``attempt`` of an instance: 31 bits of SHA-256 of
    ``ID NUL k`` (deterministic, the same in every run). It fits a signed 32-bit seed; with the
    agent's resample offsets ``+ 1000·step + n`` it stays within unsigned 32 bits."""
    digest = hashlib.sha256(f"{instance_id}\0{attempt}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def select_attempt(records: list[dict[str, Any]]) -> tuple[int, str] | None:
    """The attempt whose patch is an instance's prediction, and why: ``(k, reason)``, or ``None``
    without a finished attempt. ``records`` are the finished attempts (``attempt``,
    ``exit_reason``, ``patch``); nothing else is read — never a grading field. The rule: the lowest
    k that ended ``submitted`` with a non-empty patch (``"submitted_patch"``); else the lowest k
    with a non-empty patch (``"unsubmitted_patch"``); else the lowest finished k, attempt 0 once it
    finished (``"no_patch"``: its patch is empty). A patch of only white space counts as empty."""
    ordered = sorted(records, key=lambda r: int(r["attempt"]))
    if not ordered:
        return None
    for r in ordered:
        if r["exit_reason"] == "submitted" and str(r["patch"]).strip():
            return int(r["attempt"]), SELECT_REASONS[0]
    for r in ordered:
        if str(r["patch"]).strip():
            return int(r["attempt"]), SELECT_REASONS[1]
    return int(ordered[0]["attempt"]), SELECT_REASONS[2]


def read_ledger(output: Path) -> dict[str, Any] | None:
    """The record of finished attempts in ``output`` (``attempts.json``), checked; ``None`` when
    there is none. Raises ``ValueError`` for a record that cannot be read as one (cut short,
    edited), naming the file, rather than re-running or dropping attempts it may hold."""
    path = Path(output) / ATTEMPTS_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError) as e:
        raise ValueError(f"{path} cannot be read ({e}): fix it, or remove it to run every attempt again") from None

    def bad(why: str) -> ValueError:
        return ValueError(f"{path} is not a record of attempts ({why}): fix it, or remove it to run every attempt again")

    if not isinstance(data, dict):
        raise bad("not a JSON object")
    n = data.get("attempts")
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise bad(f"attempts = {n!r}")
    instances = data.get("instances") or {}
    if not isinstance(instances, dict):
        raise bad("instances is not an object")
    for iid, recs in instances.items():
        if not isinstance(recs, list) or not all(
                isinstance(r, dict) and isinstance(r.get("attempt"), int) and not isinstance(r.get("attempt"), bool)
                and r["attempt"] >= 0 for r in recs):
            raise bad(f"the records of {iid} need an integer attempt each")
    return data


def recorded_attempts(output: Path) -> int:
    """The ``attempts`` an output folder was run with (``attempts.json``; 1 without one).
    Raises ``ValueError`` as :func:`read_ledger`."""
    data = read_ledger(output)
    return int(data["attempts"]) if data is not None else 1


def check_attempts(output: Path, attempts: int, temperature: float = 0.0) -> None:
    """Raise ``ValueError`` when a run of ``attempts`` agents per instance at ``temperature`` cannot
    go into ``output``: more than one attempt at temperature 0 (greedy decoding: only the agent's
    resamples of repeated calls would differ), or fewer attempts than the folder was run with
    (the results of the attempts above would be silently left out of the choice); or
    :func:`read_ledger`'s error for a damaged record."""
    if attempts < 1:
        raise ValueError(f"attempts must be >= 1, not {attempts}")
    if attempts > 1 and temperature <= 0:
        raise ValueError(f"--attempts {attempts} at --temperature {temperature:g} would give "
                         "near-identical attempts (greedy decoding: only the agent's resamples of "
                         "repeated calls would differ): give --temperature above 0, e.g. 0.7.")
    before = recorded_attempts(output)
    if attempts < before:
        raise ValueError(f"{output} holds a run with --attempts {before} ({ATTEMPTS_FILE}); "
                         f"resume it with --attempts {before} or more, or use another --output")
