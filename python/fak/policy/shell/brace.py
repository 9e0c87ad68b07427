"""Bash brace expansion (bash manual, "Brace Expansion") of a word whose unquoted ``{ , }`` the
lexer marked: ``{a,b}`` alternatives and ``{x..y[..step]}`` sequences, nested, left to right."""

from __future__ import annotations

import re

from fak.policy.shell.model import COMMA, LB, MAX_BRACE_WORDS, RB, UNMARK, ShellSyntaxError

_MAX_BRACES = 64         # unquoted { in one word (brace scanning is quadratic in them)


def brace_expand(text: str) -> list[str]:
    """Bash brace expansion of a word whose unquoted ``{ , }`` are marked (bash manual, "Brace
    Expansion"): ``{a,b}`` alternatives and ``{x..y[..step]}`` sequences, nested, left to right;
    at most :data:`MAX_BRACE_WORDS` words (more raises :class:`ShellSyntaxError`)."""
    out = _expand_marked(text)
    return [t.translate(UNMARK) for t in out]


def _expand_marked(t: str) -> list[str]:
    if t.count(LB) > _MAX_BRACES:
        raise ShellSyntaxError(f"more than {_MAX_BRACES} braces in one word")
    i = t.find(LB)
    while i >= 0:
        depth = 0
        commas: list[int] = []
        end = -1
        for j in range(i, len(t)):
            c = t[j]
            if c == LB:
                depth += 1
            elif c == RB:
                depth -= 1
                if depth == 0:
                    end = j
                    break
            elif c == COMMA and depth == 1:
                commas.append(j)
        if end < 0:
            i = t.find(LB, i + 1)
            continue
        pre, post = t[:i], t[end + 1:]
        if commas:
            bounds = [i, *commas, end]
            alts = [t[bounds[k] + 1:bounds[k + 1]] for k in range(len(bounds) - 1)]
        else:
            seq = _sequence(t[i + 1:end].translate(UNMARK))
            if seq is None:
                i = t.find(LB, i + 1)
                continue
            alts = seq
        results: list[str] = []
        for a in alts:
            results.extend(_expand_marked(pre + a + post))
            if len(results) > MAX_BRACE_WORDS:
                raise ShellSyntaxError(f"brace expansion of more than {MAX_BRACE_WORDS} words")
        return results
    return [t]


def _sequence(body: str) -> list[str] | None:
    m = re.fullmatch(r"(-?\d+|[A-Za-z])\.\.(-?\d+|[A-Za-z])(?:\.\.(-?\d+))?", body)
    if m is None:
        return None
    a, b, step = m.group(1), m.group(2), m.group(3)
    inc = abs(int(step)) if step and int(step) != 0 else 1
    if a.lstrip("-").isdigit() and b.lstrip("-").isdigit():
        x, y = int(a), int(b)
        if abs(y - x) // inc > MAX_BRACE_WORDS:
            raise ShellSyntaxError(f"brace expansion of more than {MAX_BRACE_WORDS} words")
        width = max(len(a), len(b)) if (a.lstrip("-").startswith("0") and len(a.lstrip("-")) > 1
                                       or b.lstrip("-").startswith("0")
                                       and len(b.lstrip("-")) > 1) else 0
        rng = range(x, y + 1, inc) if y >= x else range(x, y - 1, -inc)
        return [str(v).zfill(width) if width else str(v) for v in rng]
    if len(a) == 1 and len(b) == 1 and not a.isdigit() and not b.isdigit():
        x, y = ord(a), ord(b)
        rng = range(x, y + 1, inc) if y >= x else range(x, y - 1, -inc)
        return [chr(v) for v in rng]
    return None
