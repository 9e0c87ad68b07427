"""Many samples of one prompt from an OpenAI-compatible server, with the answer's opening
pre-filled where the server allows it.

Two ways to ask (``mode``):

- ``completions``: the messages are rendered with the model's own chat template (``fak.chat``:
  from the GGUF with ``--gguf``, or ``--chat-template FILE``) plus the assistant's first words
  (``prefill``: e.g. the opening of a SEARCH/REPLACE block), and sent as a raw prompt to
  ``POST /v1/completions``; a small model then only continues the format.
- ``chat``: ``POST /v1/chat/completions`` with the messages; the prefill cannot be forced, so it
  is asked for in words and parsing looks for it anywhere in the reply.

The server returns one choice per request (fak serve refuses ``n > 1``), so ``n`` samples are
``n`` requests sent at once (``concurrency`` at a time; the engine batches them, and shares the
prompt's KV blocks through its prefix cache). Sample 0 is greedy (temperature 0) when
``greedy_first``; the others use ``temperature`` and a seed derived from ``key`` and the sample
index, so a re-run asks exactly the same requests.
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from fak.agent.model import normalize_base_url


class SamplerError(RuntimeError):
    """The server kept failing, or answered with something that is not a completion."""


@dataclass
class Sample:
    """One answer: ``text`` (prefill included), ``index``, ``seed``, ``temperature``,
    ``finish_reason``, token counts and the request's latency (seconds)."""

    text: str
    index: int
    seed: int
    temperature: float
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    latency_s: float

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "seed": self.seed, "temperature": self.temperature,
                "finish_reason": self.finish_reason, "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens, "text": self.text}


@dataclass
class Usage:
    """Counters of one stage (thread-safe ``add``)."""

    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    model_s: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, s: Sample) -> None:
        with self._lock:
            self.requests += 1
            self.prompt_tokens += s.prompt_tokens
            self.completion_tokens += s.completion_tokens
            self.model_s += s.latency_s

    def to_json(self) -> dict[str, Any]:
        return {"requests": self.requests, "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens, "model_s": round(self.model_s, 3)}


def seed_for(key: str, index: int) -> int:
    """A 31-bit seed from ``key`` (instance, stage, prompt) and the sample index."""
    digest = hashlib.sha256(f"{key}#{index}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def load_template(path: Path) -> Any:
    """A ``fak.chat.ChatTemplate`` from a GGUF file (its ``tokenizer.chat_template``) or from a
    Jinja file. Raises ``fak.chat.ChatTemplateError`` / ``OSError``."""
    from fak.chat import ChatTemplate

    path = Path(path)
    if path.suffix == ".gguf":
        from fak.tokenizer import read_gguf_metadata

        return ChatTemplate.from_metadata(read_gguf_metadata(path))
    return ChatTemplate(path.read_text())


class Sampler:
    """Samples from ``gateway`` (``HOST:PORT`` or URL) for ``model``.

    ``template``: a ``ChatTemplate`` (then ``mode`` is ``completions``) or ``None`` (``chat``).
    ``headers``: sent with every request. ``cancel``: a ``threading.Event`` that stops retries.
    """

    def __init__(self, gateway: str, model: str, *, template: Any = None,
                 headers: dict[str, str] | None = None, concurrency: int = 8,
                 timeout_s: float = 900.0, max_retries: int = 4,
                 cancel: threading.Event | None = None):
        self.base_url = normalize_base_url(gateway)
        self.model = model
        self.template = template
        self.mode = "completions" if template is not None else "chat"
        self.concurrency = max(1, concurrency)
        self.max_retries = max_retries
        self.cancel = cancel or threading.Event()
        self._client = httpx.Client(base_url=self.base_url, headers=headers or {},
                                    timeout=httpx.Timeout(timeout_s, connect=10.0),
                                    limits=httpx.Limits(max_connections=self.concurrency * 2))

    def close(self) -> None:
        self._client.close()

    def prompt_of(self, messages: list[dict[str, str]], prefill: str) -> str:
        """The raw ``/v1/completions`` prompt: the rendered conversation plus ``prefill``."""
        return self.template.render(messages, add_generation_prompt=True) + prefill

    def sample(self, messages: list[dict[str, str]], *, n: int, key: str, prefill: str = "",
               temperature: float = 0.8, max_tokens: int = 512, stop: list[str] | None = None,
               greedy_first: bool = True, usage: Usage | None = None) -> list[Sample]:
        """``n`` samples of the answer to ``messages`` (see the module docstring), in index order.

        Raises ``SamplerError`` when a request keeps failing (after ``max_retries``).
        """
        jobs = []
        for i in range(n):
            t = 0.0 if (greedy_first and i == 0) else temperature
            jobs.append((i, t, seed_for(key, i)))
        with cf.ThreadPoolExecutor(max_workers=min(self.concurrency, max(1, n)),
                                   thread_name_prefix="fak-sample") as ex:
            futs = [ex.submit(self._one, messages, prefill, i, t, seed, max_tokens, stop)
                    for i, t, seed in jobs]
            out = [f.result() for f in futs]
        if usage is not None:
            for s in out:
                usage.add(s)
        return out

    def _one(self, messages: list[dict[str, str]], prefill: str, index: int, temperature: float,
             seed: int, max_tokens: int, stop: list[str] | None) -> Sample:
        body: dict[str, Any] = {"model": self.model, "max_tokens": max_tokens,
                                "temperature": temperature, "seed": seed}
        if stop:
            body["stop"] = stop[:4]
        if self.mode == "completions":
            body["prompt"] = self.prompt_of(messages, prefill)
            path = "/completions"
        else:
            body["messages"] = messages
            path = "/chat/completions"
        last = ""
        for attempt in range(self.max_retries + 1):
            if self.cancel.is_set():
                raise SamplerError("cancelled")
            t0 = time.perf_counter()
            try:
                resp = self._client.post(path, json=body)
            except (httpx.HTTPError, RuntimeError) as e:
                last = f"{type(e).__name__}: {e}"
            else:
                if resp.status_code == 200:
                    return self._parse(resp, prefill, index, seed, temperature,
                                       time.perf_counter() - t0)
                last = f"HTTP {resp.status_code}: {resp.text[:300]}"
                if resp.status_code < 500 and resp.status_code != 429:
                    raise SamplerError(f"{path} refused the request: {last}")
            if self.cancel.wait(min(30.0, 2.0 ** attempt)):
                raise SamplerError("cancelled")
        raise SamplerError(f"{path} failed {self.max_retries + 1} times; last: {last}")

    def _parse(self, resp: httpx.Response, prefill: str, index: int, seed: int,
               temperature: float, latency: float) -> Sample:
        try:
            data = resp.json()
            choice = data["choices"][0]
            text = choice["text"] if self.mode == "completions" else (choice["message"].get("content") or "")
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as e:
            raise SamplerError(f"not a completion ({e}): {resp.text[:300]}") from None
        usage = data.get("usage") or {}
        return Sample(text=(prefill + text) if self.mode == "completions" else text, index=index,
                      seed=seed, temperature=temperature, finish_reason=choice.get("finish_reason"),
                      prompt_tokens=int(usage.get("prompt_tokens") or 0),
                      completion_tokens=int(usage.get("completion_tokens") or 0),
                      latency_s=latency)
