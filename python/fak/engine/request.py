"""The consumer side of one request (vLLM's output processor ``RequestState``): its UTF-8-safe
detokenizer and stop-string matcher, turning the core's token outputs into :class:`Delta` where the
tokens are consumed, never on the engine thread between steps.

A stop string is text, which the core never sees: it finishes the request here, and the stream
aborts it in the core, which may have sampled a few more tokens by then; those are dropped
(neither in ``token_ids`` nor in ``usage``).
"""

from __future__ import annotations

from fak.engine.loop import CoreRequest, TokenOutput
from fak.engine.results import Delta, Timings, TokenLogprob, TopLogprob, Usage
from fak.sampling import SamplingParams
from fak.tokenizer import IncrementalDetokenizer, StopMatcher, Tokenizer


class RequestState:
    """One request's text state: feeds its tokens to the detokenizer and the stop matcher, counts
    them and times them.

    Args:
        core: the request as the engine loop runs it.
        params: its sampling parameters (``stop_strings``, ``logprobs``).
        tokenizer: the model's tokenizer.
    """

    def __init__(self, core: CoreRequest, params: SamplingParams, tokenizer: Tokenizer) -> None:
        self.core = core
        self._tokenizer = tokenizer
        self._logprobs = params.logprobs is not None
        self._detok = IncrementalDetokenizer(tokenizer)
        self._stop = StopMatcher(params.stop_strings)
        self.n_generated = 0
        self._t_first: float | None = None
        self._prefill_s = 0.0
        self._t_last = 0.0

    def on_output(self, out: TokenOutput) -> Delta:
        """The delta of one sampled token; its ``finish_reason`` is set when the core finished the
        request with it or a stop string completed in its text.

        Raises:
            IndexError: a token id outside the vocabulary (a misbehaving model).
        """
        token_id = out.token_id
        self.n_generated += 1
        if self._t_first is None:
            self._t_first = out.t_end
            self._prefill_s = out.t_end - out.t_start
        self._t_last = out.t_end
        logprobs = None
        if self._logprobs:
            alts = [TopLogprob(int(t), self._piece(int(t)), float(lp)) for t, lp in (out.top or [])]
            logprobs = [TokenLogprob(token_id, self._piece(token_id), float(out.logprob), alts)]
        finish: str | None = None
        stop_reason: str | int | None = None
        text = ""
        # The core decided "stop" (an end-of-generation token: not text) or "length"; stop
        # strings are matched here, on the text, and may end the request before the core would.
        if out.finish == "stop":
            finish, stop_reason = "stop", token_id
        else:
            text, stopped = self._stop.feed(self._detok.add(token_id))
            if stopped:
                finish, stop_reason = "stop", self._stop.stopped
            elif out.finish is not None:
                finish = out.finish
        if finish is not None and not isinstance(stop_reason, str):  # not a stop string: release held text
            tail, stopped = self._stop.feed(self._detok.flush())
            text += tail
            if stopped:
                stop_reason, finish = self._stop.stopped, "stop"
            else:
                text += self._stop.flush()
        delta = Delta(text, [token_id], finish, logprobs)
        if self.n_generated == 1:
            delta.cached_tokens = self.core.cached_tokens
        if finish is not None:
            delta.usage = Usage(len(self.core.prompt_ids), self.n_generated)
            delta.timings = self._timings()
            delta.stop_reason = stop_reason
        return delta

    def _piece(self, token_id: int) -> str:
        return self._tokenizer.token_bytes(token_id, skip_special=False).decode("utf-8", errors="replace")

    def _timings(self) -> Timings:
        core = self.core
        t_first = self._t_first if self._t_first is not None else self._t_last
        decode_s = self._t_last - t_first
        n = len(core.prompt_ids)
        return Timings(
            ttft_s=t_first - core.t_submit,
            prefill_tok_s=n / self._prefill_s if self._prefill_s > 0 else 0.0,
            decode_tok_s=(self.n_generated - 1) / decode_s if decode_s > 0 and self.n_generated > 1 else 0.0,
            queue_s=core.t_added - core.t_submit,
            prefill_s=self._prefill_s,
            decode_s=decode_s,
        )
