"""Injection quarantine: deterministic detectors over tool results, and what the gateway does
with a result they withhold (``docs/quarantine.md``).

:mod:`~fak.quarantine.detectors` (the detector families, pure functions),
:mod:`~fak.quarantine.screen` (decisions, the digest LRU, the replacement text). The policy
file's ``quarantine`` section is :mod:`fak.policy.quarantine`; the gateway side is
:mod:`fak.gateway.quarantine_filter`.
"""

from fak.quarantine.detectors import FAMILIES, Finding, ScanResult, scan
from fak.quarantine.screen import Decision, ScreenConfig, Screener, content_digest

__all__ = ["FAMILIES", "Decision", "Finding", "ScanResult", "ScreenConfig", "Screener", "content_digest", "scan"]
