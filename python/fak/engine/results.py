"""What a generation returns: the deltas of a stream, the finished completion, its usage, timings
and log-probabilities, and the merge of deltas into one."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import msgspec

from fak.errors import FakError


class TopLogprob(msgspec.Struct, frozen=True):
    """One alternative at a position: its token id, piece text and natural-log probability."""

    token_id: int
    token: str
    logprob: float


class TokenLogprob(msgspec.Struct, frozen=True):
    """The sampled token at one position, its log-probability (natural log of the softmax of the
    model's raw logits, before penalties, temperature and truncation) and the most likely
    alternatives."""

    token_id: int
    token: str
    logprob: float
    top_logprobs: list[TopLogprob]


class Usage(msgspec.Struct, frozen=True):
    """Token counts of one request (the generated count includes a final EOS/EOT token)."""

    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class Timings(msgspec.Struct, frozen=True):
    """Wall-clock timings of one request, in seconds and tokens per second.

    ``ttft_s``: submission to first token (queueing + prefill); ``queue_s``: submission to
    admission into the batch; ``prefill_s``: the engine step that prefilled the prompt (shared with
    the decode of other running sequences); ``decode_s``: first to last token.
    ``prefill_tok_s = prompt_tokens / prefill_s``, ``decode_tok_s = (completion_tokens - 1) / decode_s``.
    """

    ttft_s: float
    prefill_tok_s: float
    decode_tok_s: float
    queue_s: float = 0.0
    prefill_s: float = 0.0
    decode_s: float = 0.0


class Delta(msgspec.Struct):
    """A piece of a streamed completion.

    ``text``: new text (may be empty while bytes of a character or a possible stop string are
    held back); ``token_ids``: the tokens sampled since the previous delta; ``finish_reason``:
    ``"stop"`` (EOS/EOT token or stop string) or ``"length"`` (max_tokens or context full) on the
    last delta, else None; ``logprobs``: one entry per token when requested. The last delta also
    carries ``usage`` and ``timings``. The first delta carries ``cached_tokens``: the prompt tokens
    the prefix cache held (their prefill was skipped), when the native core reports it.
    """

    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    logprobs: list[TokenLogprob] | None = None
    usage: Usage | None = None
    timings: Timings | None = None
    stop_reason: str | int | None = None
    cached_tokens: int | None = None


class Completion(msgspec.Struct):
    """A finished completion.

    ``text``: the generated text (without the stop string or EOS); ``token_ids``: every sampled
    token up to the end (including a final EOS/EOT and the tokens of a stop string, none after
    it); ``finish_reason``: ``"stop"`` or ``"length"``; ``stop_reason``: the stop string or
    EOS/EOT id that ended it.
    """

    text: str
    token_ids: list[int]
    finish_reason: str
    usage: Usage
    timings: Timings
    logprobs: list[TokenLogprob] | None = None
    stop_reason: str | int | None = None


def merge(deltas: Sequence[Delta]) -> Delta:
    """One delta holding ``deltas`` in order (the last one's end, the first one's cached_tokens)."""
    if len(deltas) == 1:
        return deltas[0]
    last = deltas[-1]
    logprobs = None
    if any(d.logprobs is not None for d in deltas):
        logprobs = [lp for d in deltas for lp in (d.logprobs or [])]
    return Delta(
        text="".join(d.text for d in deltas),
        token_ids=[t for d in deltas for t in d.token_ids],
        finish_reason=last.finish_reason,
        logprobs=logprobs,
        usage=last.usage,
        timings=last.timings,
        stop_reason=last.stop_reason,
        cached_tokens=deltas[0].cached_tokens,
    )


def collect(deltas: Iterable[Delta]) -> Completion:
    """The completion that a whole stream of ``deltas`` makes.

    Raises:
        fak.FakError: the stream ended without its final delta.
    """
    parts: list[Delta] = list(deltas)
    final = merge(parts) if parts else None
    if final is None or final.finish_reason is None or final.usage is None or final.timings is None:
        raise FakError("generation ended without a final delta")
    return Completion(final.text, final.token_ids, final.finish_reason, final.usage, final.timings,
                      final.logprobs, final.stop_reason)
