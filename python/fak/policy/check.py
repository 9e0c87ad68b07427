"""Validate a policy file from the command line (``fak serve --policy FILE --policy-check``, or
``python -m fak.policy.check FILE``).

:func:`check_file` returns the problems as ``"<location>: <problem>"`` strings; :func:`check_main`
prints ``OK`` or one line per problem (``FILE: <location>: <problem>``) and returns the exit
status (0 valid, 1 not).
"""

from __future__ import annotations

import os
import sys

from fak.policy.decide import Policy, PolicyError


def check_file(path: str | os.PathLike[str]) -> list[str]:
    """Every problem in the policy file at ``path`` (``[]`` when it is valid): unreadable file,
    invalid JSON (line and column), unknown or missing fields, wrong types, bad regexes, unknown
    checks. Each problem says where, as a JSON path (``tools.bash.deny[2].regex``)."""
    try:
        Policy.load(path)
    except PolicyError as e:
        return e.errors
    return []


def check_main(path: str | os.PathLike[str]) -> int:
    """Print ``OK`` (stdout) or each problem with its location (stderr); return 0 or 1."""
    errors = check_file(path)
    if not errors:
        print("OK")
        return 0
    for e in errors:
        print(f"{os.fspath(path)}: {e}", file=sys.stderr)
    return 1


if __name__ == "__main__":  # pragma: no cover - exercised through a subprocess in the tests
    if len(sys.argv) != 2:
        print("usage: python -m fak.policy.check POLICY.json", file=sys.stderr)
        sys.exit(2)
    sys.exit(check_main(sys.argv[1]))
