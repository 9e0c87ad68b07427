"""Injection quarantine in the gateway: every screened message of a request (``tool`` results by
default) is decided before the model or an upstream sees it; a withheld one is replaced.

``QuarantineGate`` is built from the policy file's ``quarantine`` section
(:mod:`fak.policy.quarantine`) and shared by the app's requests:

- ``screen(messages, conversation)`` decides each screened message (``fak.quarantine.Screener``:
  digest LRU, so the history a client sends back on every turn is scanned once), writes each
  decision to the audit log (the detectors that fired and the digest of the withheld bytes,
  never the bytes), counts it in ``fak_quarantine_decisions_total{detector, decision}``, and
  returns a :class:`Screening` that rewrites the request: ``apply(messages)`` for engine mode (the
  content never reaches the chat template, so it is never tokenized, never in a KV block or the
  prefix cache), ``apply_raw(body)`` for proxy mode (the upstream receives the replacement).
- After the fact (``quarantine(content=... | digest=...)``, also ``POST /v1/fak/quarantine``):
  the digest is pinned (later requests get the replacement without a scan), and in engine mode
  the prefix-cache blocks that hold the bytes are dropped and banned (``Engine.evict_prefix``) and
  running generations whose prompt holds them continue as if they never saw them
  (``Engine.quarantine_span``). The gateway remembers, per conversation, the last prompt it
  rendered (text and token ids) to find those blocks.
"""

from __future__ import annotations

import logging
import threading
from array import array
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import msgspec
from litestar import Request, post

from fak.gateway.errors import APIError, bad_request
from fak.quarantine.screen import Decision, Screener, content_digest

log = logging.getLogger("fak.gateway.quarantine")

__all__ = ["QuarantineGate", "QuarantineRequest", "Screening", "quarantine_route"]


def _text_of(content: Any) -> str | None:
    if content is None:
        return None
    if isinstance(content, str):
        return content
    parts = []
    for p in content:
        t = p.get("text") if isinstance(p, Mapping) else getattr(p, "text", None)
        if t is None:
            t = p.get("refusal") if isinstance(p, Mapping) else getattr(p, "refusal", None)
        parts.append(t or "")
    return "\n".join(parts)


def _get(msg: Any, key: str) -> Any:
    return msg.get(key) if isinstance(msg, Mapping) else getattr(msg, key, None)


@dataclass
class Screening:
    """The decisions on one request: ``withheld`` maps a message index to its decision."""

    withheld: dict[int, Decision] = field(default_factory=dict)
    decisions: list[tuple[int, Decision]] = field(default_factory=list)

    @property
    def any(self) -> bool:
        """Whether anything was withheld."""
        return bool(self.withheld)

    def apply(self, messages: list[Any]) -> list[Any]:
        """``messages`` (msgspec ``ChatMessage`` structs) with withheld contents replaced."""
        if not self.withheld:
            return messages
        out = list(messages)
        for i, d in self.withheld.items():
            out[i] = msgspec.structs.replace(out[i], content=d.replacement)
        return out

    def apply_raw(self, body: bytes) -> bytes:
        """The client's JSON body with withheld message contents replaced (proxy mode); the body
        unchanged when nothing was withheld."""
        if not self.withheld:
            return body
        data = msgspec.json.decode(body)
        for i, d in self.withheld.items():
            data["messages"][i]["content"] = d.replacement
        return msgspec.json.encode(data)


@dataclass
class _Prompt:
    """The last prompt rendered for a conversation (to find its KV blocks after the fact)."""

    text: str
    ids: array
    contents: list[str]
    runs: list[Any] = field(default_factory=list)


class QuarantineGate:
    """Screens requests and quarantines after the fact (see the module doc).

    Args:
        screener: the ``fak.quarantine.Screener`` (its config says which roles are screened).
        audit: an object with ``write_entry(dict)`` (``fak.policy.AuditLog``) or ``None``.
        registry: the app's Prometheus registry (``GatewayMetrics.registry``) or ``None``.
        engine: the engine (engine mode) for after-the-fact eviction, or ``None``.
        remember: conversations whose last prompt is kept (LRU).
    """

    def __init__(self, screener: Screener, *, audit: Any = None, registry: Any = None, engine: Any = None,
                 remember: int = 256) -> None:
        self.screener = screener
        self.audit = audit
        self.engine = engine
        self.roles = frozenset(screener.config.roles)
        self.remember = remember
        self._prompts: OrderedDict[str, _Prompt] = OrderedDict()
        self._lock = threading.Lock()
        self.counter = None
        if registry is not None:
            from prometheus_client import Counter

            self.counter = Counter("fak_quarantine_decisions", "Screened messages by detector and decision "
                                   "(quarantine/pass; cached: decided by digest).", ["detector", "decision"],
                                   registry=registry)

    @classmethod
    def from_policy(cls, policy: Any, *, audit: Any = None, registry: Any = None,
                    engine: Any = None) -> QuarantineGate | None:
        """The gate of ``policy``'s ``quarantine`` section, or ``None`` (no section, disabled, or
        a policy object without a file)."""
        from fak.policy.quarantine import compile_section

        section = getattr(getattr(policy, "file", None), "quarantine", None)
        config = compile_section(section)
        if config is None:
            return None
        return cls(Screener(config), audit=audit, registry=registry, engine=engine)

    # -- screening a request

    def screen(self, messages: list[Any], conversation: str) -> Screening:
        """Decide every screened message of ``messages`` (structs or dicts)."""
        out = Screening()
        names: dict[str, str] = {}
        for i, msg in enumerate(messages):
            role = _get(msg, "role")
            for tc in _get(msg, "tool_calls") or ():
                fn = _get(tc, "function")
                tid = _get(tc, "id")
                if tid and fn is not None:
                    names[str(tid)] = str(_get(fn, "name"))
            if role not in self.roles:
                continue
            text = _text_of(_get(msg, "content"))
            if text is None:
                continue
            scans = self.screener.scans
            d = self.screener.screen(text)
            out.decisions.append((i, d))
            if d.quarantined:
                out.withheld[i] = d
            tid = _get(msg, "tool_call_id")
            self._record(conversation, role, tid, names.get(str(tid)) if tid else None, d,
                         scanned=self.screener.scans > scans)
        return out

    def _record(self, conversation: str, role: str, tool_call_id: Any, tool: str | None, d: Decision, *,
                scanned: bool) -> None:
        decision = "quarantine" if d.quarantined else "pass"
        if self.counter is not None:
            for det in d.detectors or ("none",):
                self.counter.labels(det, decision + ("_cached" if d.cached else "")).inc()
        if self.audit is None or not (d.quarantined or (scanned and self.screener.config.audit_passes)):
            return
        entry = {
            "time": datetime.now(timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z"),
            "conversation": conversation,
            "event": "quarantine",
            "role": role,
            "tool_call_id": tool_call_id,
            "tool": tool,
            "decision": decision,
            "detectors": list(d.detectors),
            "features": list(d.features),
            "reason": d.reason or None,
            "content_digest": d.digest,
            "bytes": d.n_bytes,
            "cached": d.cached,
        }
        write = getattr(self.audit, "write_entry", None)
        try:
            if write is not None:
                write(entry)
        except Exception:
            log.exception("audit log write failed")

    # -- prompts of a conversation (engine mode)

    def track(self, conversation: str, prompt_text: str, prompt_ids: list[int], messages: list[Any],
              run: Any = None) -> None:
        """Remember the prompt rendered for ``conversation`` (its screened contents, and the run
        that generates from it while it lasts)."""
        contents = [t for m in messages if _get(m, "role") in self.roles
                    for t in [_text_of(_get(m, "content"))] if t]
        p = _Prompt(prompt_text, array("I", prompt_ids), contents)
        with self._lock:
            old = self._prompts.get(conversation)
            if old is not None:
                p.runs = [r for r in old.runs if not getattr(r, "_closed", False)]
            if run is not None:
                p.runs.append(run)
            self._prompts[conversation] = p
            self._prompts.move_to_end(conversation)
            while len(self._prompts) > self.remember:
                self._prompts.popitem(last=False)

    def _token_span(self, p: _Prompt, start_char: int, end_char: int) -> tuple[int, int]:
        """Token positions covering characters ``start_char:end_char`` of ``p.text``."""
        b0 = len(p.text[:start_char].encode("utf-8", "surrogatepass"))
        b1 = b0 + len(p.text[start_char:end_char].encode("utf-8", "surrogatepass"))
        tok = getattr(self.engine, "tokenizer", None)
        pos, start, end = 0, None, len(p.ids)
        for i, t in enumerate(p.ids):
            if tok is not None:
                n = len(tok.token_bytes(int(t), skip_special=False))
            else:
                n = len(self.engine.detokenize([int(t)]).encode("utf-8", "surrogatepass"))
            if start is None and pos + n > b0:
                start = i
            if pos >= b1:
                end = i
                break
            pos += n
        return (start if start is not None else len(p.ids)), end

    # -- after the fact

    def quarantine(self, *, content: str | None = None, digest: str | None = None,
                   reason: str = "found poisoned after the fact") -> dict[str, Any]:
        """Quarantine bytes already passed: pin the digest; in engine mode drop the KV blocks that
        hold them from the prefix cache and take them out of running generations.

        Returns ``{"digest", "evicted_blocks", "sequences"}``.
        """
        if digest is None:
            if content is None:
                raise ValueError("give content or digest")
            digest = content_digest(content)
        self.screener.pin(digest, reason)
        evicted, sequences = 0, 0
        with self._lock:
            prompts = list(self._prompts.items())
        for conversation, p in prompts:
            texts = [c for c in p.contents if content_digest(c) == digest] if content is None else [content]
            for text in dict.fromkeys(texts):
                at = p.text.find(text)
                while at >= 0 and hasattr(self.engine, "evict_prefix"):
                    start, end = self._token_span(p, at, at + len(text))
                    if start < len(p.ids):
                        try:
                            evicted += int(self.engine.evict_prefix(list(p.ids), start))
                        except Exception:
                            log.exception("evicting the prefix cache failed")
                        for run in p.runs:
                            it = getattr(run, "_it", None)
                            if it is not None and not getattr(run, "_closed", False):
                                try:
                                    self.engine.quarantine_span(it, start, end)
                                    sequences += 1
                                except Exception:
                                    log.exception("quarantining a running sequence failed")
                    at = p.text.find(text, at + len(text))
            if texts:
                self._record(conversation, "tool", None, None,
                             Decision(True, digest, len(texts[0].encode("utf-8", "surrogatepass")),
                                      ("after-the-fact",), (), reason), scanned=False)
        return {"digest": digest, "evicted_blocks": evicted, "sequences": sequences}


class QuarantineRequest(msgspec.Struct, forbid_unknown_fields=True):
    """Body of ``POST /v1/fak/quarantine``: the bytes (``content``) or their ``digest``
    (``sha256:<hex>``), and a ``reason`` for the audit log."""

    content: str | None = None
    digest: str | None = None
    reason: str = "found poisoned after the fact"


@post("/v1/fak/quarantine", status_code=200, include_in_schema=False)
async def quarantine_route(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """Quarantine a tool result after the fact (see ``QuarantineGate.quarantine``)."""
    from fak.gateway.schemas import decode_body

    gw = request.app.state.gateway
    gate: QuarantineGate | None = getattr(gw, "quarantine", None)
    if gate is None:
        raise APIError(404, "Quarantine is not configured (the policy file has no `quarantine` section).",
                       code="not_found")
    body = decode_body(await request.body(), QuarantineRequest)
    if (body.content is None) == (body.digest is None):
        raise bad_request("Give exactly one of `content` and `digest`.", param="content")
    if body.digest is not None and not (body.digest.startswith("sha256:") and len(body.digest) == 71):
        raise bad_request("`digest` must be `sha256:` and 64 hex digits.", param="digest")
    import anyio

    return await anyio.to_thread.run_sync(
        lambda: gate.quarantine(content=body.content, digest=body.digest, reason=body.reason))
