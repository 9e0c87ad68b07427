"""Screening of tool results: detectors, a digest cache, and what replaces a withheld result.

:class:`Screener` decides one text at a time: its SHA-256 digest is looked up in an LRU of
earlier decisions (the same bytes are decided once, withheld or passed, without re-scanning),
else :func:`fak.quarantine.detectors.scan` runs and the decision is cached. Digests quarantined
after the fact (:meth:`Screener.pin`) stay quarantined whatever the LRU forgets.

A withheld result is replaced by ``ScreenConfig.replacement`` (default
``[fak: tool result quarantined: <reason>; N bytes withheld]``): the reason names the detector
families, never the matched text (quoting it would hand the injection to the model).
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

from fak.quarantine.detectors import (
    FAMILIES,
    FAMILY_DESCRIPTIONS,
    HiddenTextLimits,
    scan,
)

__all__ = ["DEFAULT_REPLACEMENT", "Decision", "ScreenConfig", "Screener", "content_digest"]

DEFAULT_REPLACEMENT = "[fak: tool result quarantined: {reason}; {bytes} bytes withheld]"


def content_digest(text: str) -> str:
    """``"sha256:"`` and the hex SHA-256 of ``text`` as UTF-8 (the bytes withheld)."""
    return "sha256:" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True)
class ScreenConfig:
    """Compiled ``quarantine`` section (see :mod:`fak.policy.quarantine`).

    Attributes:
        enabled: detector families evaluated.
        thresholds: family → score at which it withholds.
        limits: ``hidden_text`` parameters.
        extra: operator patterns ``(feature id, family, compiled regex, reason)``.
        replacement: template with ``{reason}``, ``{bytes}``, ``{digest}``, ``{detectors}``.
        cache_entries: LRU size (decisions by digest; 0 = no cache).
        roles: message roles screened (``("tool",)``).
        audit_passes: audit a result that passed the first time it is scanned.
    """

    enabled: tuple[str, ...] = FAMILIES
    thresholds: dict[str, float] = field(default_factory=dict)
    limits: HiddenTextLimits = field(default_factory=HiddenTextLimits)
    extra: tuple[tuple[str, str, re.Pattern[str], str], ...] = ()
    replacement: str = DEFAULT_REPLACEMENT
    cache_entries: int = 4096
    roles: tuple[str, ...] = ("tool",)
    audit_passes: bool = True


@dataclass(frozen=True)
class Decision:
    """The verdict on one text.

    ``quarantined``; ``digest`` (``sha256:...`` of its UTF-8 bytes); ``n_bytes``; ``detectors``
    (families that fired, or ``("after-the-fact",)`` for a pinned digest); ``features`` (feature
    ids that contributed); ``reason`` (human-readable, no quoted text); ``cached`` (decided by
    digest without scanning); ``replacement`` (the text the model sees instead, or ``None``).
    """

    quarantined: bool
    digest: str
    n_bytes: int
    detectors: tuple[str, ...] = ()
    features: tuple[str, ...] = ()
    reason: str = ""
    cached: bool = False
    replacement: str | None = None


class Screener:
    """Thread-safe screening with an LRU of decisions by digest.

    Args:
        config: a :class:`ScreenConfig`.
    """

    def __init__(self, config: ScreenConfig | None = None) -> None:
        self.config = config or ScreenConfig()
        self._lru: OrderedDict[str, Decision] = OrderedDict()
        self._pinned: dict[str, str] = {}
        self._lock = threading.Lock()
        self.scans = 0

    def screen(self, text: str) -> Decision:
        """Decide ``text`` (cached by digest). Never raises for any string."""
        digest = content_digest(text)
        with self._lock:
            pinned = self._pinned.get(digest)
            hit = self._lru.get(digest) if pinned is None else None
            if hit is not None:
                self._lru.move_to_end(digest)
        n_bytes = len(text.encode("utf-8", "surrogatepass"))
        if pinned is not None:
            return self._withhold(digest, n_bytes, ("after-the-fact",), (), pinned, cached=True)
        if hit is not None:
            return Decision(hit.quarantined, hit.digest, hit.n_bytes, hit.detectors, hit.features, hit.reason,
                            True, hit.replacement)
        c = self.config
        r = scan(text, thresholds=c.thresholds, enabled=c.enabled, limits=c.limits,
                 extra=tuple((fid, fam, rx) for fid, fam, rx, _ in c.extra))
        self.scans += 1
        if r.fired:
            reasons = [FAMILY_DESCRIPTIONS[f] for f in r.fired]
            extra_reasons = [reason for fid, _, _, reason in c.extra if fid in r.features]
            decision = self._withhold(digest, n_bytes, tuple(r.fired), tuple(r.features),
                                      ", ".join(dict.fromkeys(reasons + extra_reasons)), cached=False)
        else:
            decision = Decision(False, digest, n_bytes)
        if c.cache_entries > 0:
            with self._lock:
                self._lru[digest] = decision
                self._lru.move_to_end(digest)
                while len(self._lru) > c.cache_entries:
                    self._lru.popitem(last=False)
        return decision

    def pin(self, digest: str, reason: str = "found poisoned after the fact") -> None:
        """Quarantine ``digest`` from now on, whatever it was decided before (not evicted)."""
        with self._lock:
            self._pinned[digest] = reason
            self._lru.pop(digest, None)

    def is_pinned(self, digest: str) -> bool:
        """Whether ``digest`` was quarantined after the fact."""
        with self._lock:
            return digest in self._pinned

    def _withhold(self, digest: str, n_bytes: int, detectors: tuple[str, ...], features: tuple[str, ...],
                  reason: str, *, cached: bool) -> Decision:
        try:
            text = self.config.replacement.format(reason=reason, bytes=n_bytes, digest=digest,
                                                  detectors=",".join(detectors))
        except (KeyError, IndexError, ValueError):
            text = DEFAULT_REPLACEMENT.format(reason=reason, bytes=n_bytes)
        return Decision(True, digest, n_bytes, detectors, features, reason, cached, text)
