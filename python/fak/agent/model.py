"""The agent's model: an OpenAI-compatible chat completions endpoint (``fak serve``), over httpx.

The raw JSON of each response is kept, because the gateway adds a ``fak_policy`` extension object
(``{"verdicts": [{"tool", "allowed", "reason", "rule", "call_ref", "span", "arguments_digest"}]}``) that the official
client would hide in ``model_extra``.

Retries: HTTP 429, 5xx and connection errors are retried ``max_retries`` times with exponential
back-off (``backoff_s * 2**attempt``, capped at 30 s; a ``Retry-After`` header in seconds wins).
Other 4xx answers fail at once (``ModelError``; ``ContextLimitExceeded`` when the error's code is
``context_length_exceeded``), as does a body that is not a chat completion.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from fak.agent.exceptions import ContextLimitExceeded, ModelError


def normalize_base_url(gateway: str) -> str:
    """``HOST:PORT`` or a full URL → the API base ending in ``/v1`` (no trailing slash)."""
    url = gateway.strip()
    if "://" not in url:
        url = "http://" + url
    url = url.rstrip("/")
    if not url.endswith("/v1"):
        url += "/v1"
    return url


def _error_code(resp: httpx.Response) -> str | None:
    """``error.code`` of an OpenAI-shaped error body, if any."""
    try:
        err = resp.json().get("error")
    except (ValueError, AttributeError):
        return None
    return err.get("code") if isinstance(err, dict) else None


@dataclass
class ModelResponse:
    """One chat completion: ``message`` (the assistant message dict: ``role``, ``content``,
    ``tool_calls``), ``usage`` (``prompt_tokens``, ``completion_tokens``), ``policy`` (the
    ``fak_policy`` object or ``None``), ``latency_s`` (seconds, the successful attempt),
    ``attempts`` (HTTP requests made), ``finish_reason``; ``decode_s`` / ``decode_tokens``: the
    server's decode time (seconds, first to last token) and the tokens decoded in it, from its
    ``timings`` (fak serve, llama.cpp's server), ``None`` / 0 when it sent none."""

    message: dict[str, Any]
    usage: dict[str, int]
    policy: dict[str, Any] | None
    latency_s: float
    attempts: int = 1
    finish_reason: str | None = None
    raw: dict[str, Any] = field(default_factory=dict)
    decode_s: float | None = None
    decode_tokens: int = 0


class OpenAIChatModel:
    """``Model`` for the agent loop: POST ``{base_url}/chat/completions``.

    ``headers`` go with every request (the fleet sets ``X-Fak-Conversation`` and
    ``X-Fak-Workspace``, and ``X-Fak-Text-Tools`` for the text protocol). ``sampling`` is merged
    into the request body (``temperature``, ``max_tokens``, ...). ``cancel`` (a
    ``threading.Event``) aborts the back-off between retries.
    """

    def __init__(self, base_url: str, model: str, *, headers: dict[str, str] | None = None,
                 sampling: dict[str, Any] | None = None, timeout_s: float = 600.0,
                 max_retries: int = 5, backoff_s: float = 1.0, api_key: str | None = None,
                 cancel: threading.Event | None = None):
        self.base_url = normalize_base_url(base_url)
        self.model = model
        self.sampling = dict(sampling or {})
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.cancel = cancel or threading.Event()
        h = {"Authorization": f"Bearer {api_key or 'fak'}"}
        h.update(headers or {})
        self._client = httpx.Client(base_url=self.base_url, headers=h,
                                    timeout=httpx.Timeout(timeout_s, connect=10.0))

    def close(self) -> None:
        self._client.close()

    def query(self, messages: list[dict[str, Any]], tools: list[dict] | None = None,
              options: dict[str, Any] | None = None) -> ModelResponse:
        """One chat completion for ``messages`` (OpenAI message dicts), with ``tools`` when given;
        ``options`` are extra body fields (``tool_choice``, ``stop``; they win over ``sampling``).

        Raises ``ContextLimitExceeded`` when the conversation no longer fits the context window,
        ``ModelError`` when the endpoint keeps failing or answers with another client error.
        """
        body: dict[str, Any] = {"model": self.model, "messages": messages, **self.sampling,
                                **(options or {})}
        if tools:
            body["tools"] = tools
            body.setdefault("tool_choice", "auto")
        else:
            body.pop("tool_choice", None)
        last_error = ""
        for attempt in range(self.max_retries + 1):
            if self.cancel.is_set():
                raise ModelError("cancelled")
            t0 = time.perf_counter()
            delay: float | None = None
            try:
                resp = self._client.post("/chat/completions", json=body)
            except (httpx.HTTPError, RuntimeError) as e:  # RuntimeError: client closed by a stop
                if self.cancel.is_set():
                    raise ModelError("cancelled") from None
                last_error = f"{type(e).__name__}: {e}"
            else:
                latency = time.perf_counter() - t0
                if resp.status_code == 200:
                    return self._parse(resp, latency, attempt + 1)
                last_error = f"HTTP {resp.status_code}: {resp.text[:500]}"
                if resp.status_code != 429 and resp.status_code < 500:
                    if _error_code(resp) == "context_length_exceeded":
                        raise ContextLimitExceeded(f"the conversation outgrew the context window: "
                                                   f"{last_error}")
                    raise ModelError(f"the model endpoint refused the request: {last_error}")
                retry_after = resp.headers.get("retry-after")
                if retry_after and retry_after.replace(".", "", 1).isdigit():
                    delay = float(retry_after)
            if attempt == self.max_retries:
                break
            if delay is None:
                delay = min(30.0, self.backoff_s * (2 ** attempt))
            if self.cancel.wait(delay):
                raise ModelError("cancelled")
        raise ModelError(f"the model endpoint failed {self.max_retries + 1} times; last: {last_error}")

    @staticmethod
    def _parse(resp: httpx.Response, latency: float, attempts: int) -> ModelResponse:
        try:
            data = resp.json()
            choice = data["choices"][0]
            message = dict(choice["message"])
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise ModelError(f"not a chat completion ({e}): {resp.text[:300]}") from None
        message.setdefault("role", "assistant")
        usage = data.get("usage") or {}
        decode_s, decode_tokens = None, 0
        timings = data.get("timings")
        if isinstance(timings, dict) and isinstance(timings.get("predicted_ms"), (int, float)):
            decode_s = float(timings["predicted_ms"]) / 1e3
            decode_tokens = max(0, int(timings.get("predicted_n") or 0) - 1)  # the first ends prefill
        return ModelResponse(
            message=message,
            usage=_usage(usage),
            policy=data.get("fak_policy"),
            latency_s=latency,
            attempts=attempts,
            finish_reason=choice.get("finish_reason"),
            raw=data,
            decode_s=decode_s,
            decode_tokens=decode_tokens,
        )


def _usage(usage: Any) -> dict[str, int]:
    """``prompt_tokens`` and ``completion_tokens`` of a chat completion's usage, plus
    ``cached_tokens`` (the prompt tokens served from the prefix cache,
    ``prompt_tokens_details.cached_tokens``) when the server reports them (fak serve does)."""
    usage = usage if isinstance(usage, dict) else {}
    out = {"prompt_tokens": int(usage.get("prompt_tokens") or 0),
           "completion_tokens": int(usage.get("completion_tokens") or 0)}
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
        out["cached_tokens"] = int(details["cached_tokens"])
    return out
