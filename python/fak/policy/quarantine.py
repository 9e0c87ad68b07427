"""The ``quarantine`` section of a policy file: which tool results the gateway withholds.

Schema (msgspec Structs, validated by :func:`fak.policy.schema.validate` like the rest of the
file, every problem reported with its location) and its compiled form,
:class:`fak.quarantine.screen.ScreenConfig`. Documented in ``docs/quarantine.md``::

    "quarantine": {
      "roles": ["tool"],
      "detectors": {"role_markup": {"enabled": true, "threshold": 1.0},
                    "override": {}, "exec_request": {},
                    "hidden_text": {"max_bidi": 0, "max_zero_width": 2, "padding_chars": 256}},
      "extra_patterns": [{"id": "internal-host", "regex": "corp\\\\.internal", "reason": "..."}],
      "replacement": "[fak: tool result quarantined: {reason}; {bytes} bytes withheld]",
      "cache_entries": 4096
    }

A file without the section screens nothing (``enabled`` defaults to true when it is present).
"""

from __future__ import annotations

import re
import string
from typing import Annotated, Any, Literal

import msgspec

__all__ = [
    "DEFAULT_REPLACEMENT",
    "REPLACEMENT_FIELDS",
    "SEMANTICS",
    "DetectorConfig",
    "Detectors",
    "ExtraPattern",
    "HiddenTextConfig",
    "QuarantineSection",
    "compile_section",
]

DEFAULT_REPLACEMENT = "[fak: tool result quarantined: {reason}; {bytes} bytes withheld]"
#: Fields a ``replacement`` template may use.
REPLACEMENT_FIELDS = ("reason", "bytes", "digest", "detectors")

Threshold = Annotated[float, msgspec.Meta(gt=0, le=100)]
Count = Annotated[int, msgspec.Meta(ge=0)]
Family = Literal["role_markup", "override", "exec_request", "hidden_text"]


class _Base(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    pass


class DetectorConfig(_Base, frozen=True):
    """One detector family: on or off, and the score at which it withholds a result."""

    enabled: bool = True
    threshold: Threshold = 1.0


class HiddenTextConfig(_Base, frozen=True):
    """``hidden_text``, with its limits: bidi controls and zero-width characters tolerated,
    whitespace runs (characters) after which a tail with an instruction (``padding_chars``) or
    any tail (``padding_chars_any``) counts as hidden (0 turns that check off)."""

    enabled: bool = True
    threshold: Threshold = 1.0
    max_bidi: Count = 0
    max_zero_width: Count = 2
    padding_chars: Count = 256
    padding_chars_any: Count = 4096


class Detectors(_Base, frozen=True):
    """The four detector families (``fak.quarantine.detectors``)."""

    role_markup: DetectorConfig = DetectorConfig()
    override: DetectorConfig = DetectorConfig()
    exec_request: DetectorConfig = DetectorConfig()
    hidden_text: HiddenTextConfig = HiddenTextConfig()


class ExtraPattern(_Base, frozen=True):
    """An operator's own pattern: a match withholds the result (weight 1.0 in ``family``)."""

    id: Annotated[str, msgspec.Meta(min_length=1, pattern=r"^[A-Za-z0-9_.\-]+$")]
    regex: str
    reason: Annotated[str, msgspec.Meta(min_length=1)]
    family: Family = "override"
    ignore_case: bool = True


class QuarantineSection(_Base, frozen=True):
    """The whole ``quarantine`` section."""

    enabled: bool = True
    roles: Annotated[list[Literal["tool", "user", "system", "developer", "assistant"]],
                     msgspec.Meta(min_length=1)] = msgspec.field(default_factory=lambda: ["tool"])
    detectors: Detectors = Detectors()
    extra_patterns: list[ExtraPattern] = []
    replacement: Annotated[str, msgspec.Meta(min_length=1)] = DEFAULT_REPLACEMENT
    cache_entries: Count = 4096
    audit_passes: bool = True


def _check_section(value: dict[str, Any], path: str, errors: list[str]) -> None:
    where = f"{path}.replacement" if path else "replacement"
    template = value.get("replacement", DEFAULT_REPLACEMENT)
    try:
        names = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
    except ValueError as e:
        errors.append(f"{where}: invalid template: {e}")
        return
    bad = sorted(n for n in names if n not in REPLACEMENT_FIELDS)
    if bad:
        errors.append(f"{where}: unknown field(s) {', '.join(bad)} (known: {', '.join(REPLACEMENT_FIELDS)})")


def _check_pattern(value: dict[str, Any], path: str, errors: list[str]) -> None:
    try:
        re.compile(value["regex"])
    except re.error as e:
        errors.append(f"{path}.regex: invalid regular expression: {e}")


#: Semantic checks for :mod:`fak.policy.schema`'s walk (Struct → check(value, path, errors)).
SEMANTICS = {QuarantineSection: _check_section, ExtraPattern: _check_pattern}


def compile_section(section: QuarantineSection | None) -> Any:
    """The :class:`fak.quarantine.screen.ScreenConfig` of a validated section (``None`` when
    the section is absent or disabled)."""
    if section is None or not section.enabled:
        return None
    from fak.quarantine.detectors import HiddenTextLimits
    from fak.quarantine.screen import ScreenConfig

    d = section.detectors
    fams = {"role_markup": d.role_markup, "override": d.override, "exec_request": d.exec_request,
            "hidden_text": d.hidden_text}
    h = d.hidden_text
    extra = tuple((f"extra.{p.id}", p.family, re.compile(p.regex, re.IGNORECASE if p.ignore_case else 0), p.reason)
                  for p in section.extra_patterns)
    return ScreenConfig(
        enabled=tuple(name for name, c in fams.items() if c.enabled),
        thresholds={name: float(c.threshold) for name, c in fams.items()},
        limits=HiddenTextLimits(h.max_bidi, h.max_zero_width, h.padding_chars, h.padding_chars_any),
        extra=extra,
        replacement=section.replacement,
        cache_entries=section.cache_entries,
        roles=tuple(section.roles),
        audit_passes=section.audit_passes,
    )
