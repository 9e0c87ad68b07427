"""The sandbox's errors: ``SandboxError`` (also exported as ``fak.agent.SandboxError``) and
``SandboxUnavailable``, raised when no sandbox can be made on this host."""

from __future__ import annotations

from fak.errors import FakError


class SandboxError(FakError, RuntimeError):
    """Something fak would execute on a model's behalf cannot be run safely; the message says
    what is missing and what to do."""


class SandboxUnavailable(SandboxError):
    """No sandbox can be made here (no working ``bwrap`` and no working ``unshare`` path, or an
    option this host cannot give, e.g. ``net_setup`` without root). The message names what is
    missing; ``--unsafe-no-sandbox`` is the only way to run without the sandbox."""
