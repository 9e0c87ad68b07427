"""Serving logic of ``POST /v1/completions`` in engine mode.

The prompt is tokenized with the model's special tokens added (BOS where the model wants one),
or taken as token ids; the generated text goes through the same text-tool policy filter as chat
(``X-Fak-Text-Tools: bash``), so a raw-completion agent is adjudicated too. ``echo`` prepends the
prompt text. Logprobs use the legacy format (``tokens``, ``token_logprobs``, ``top_logprobs``,
``text_offset``).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import msgspec
from litestar import Request, Response
from litestar.background_tasks import BackgroundTask
from litestar.response import Stream

from fak.gateway.completions.protocol import (
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
)
from fak.gateway.disconnect import ClientDisconnected, run_until_disconnect
from fak.gateway.engine_client import (
    EngineRun,
    TokenLogprobs,
    sampling_kwargs,
    token_logprobs,
)
from fak.gateway.errors import APIError, bad_request, error_response
from fak.gateway.policy_filter import (
    AssistantOutputFilter,
    ContentOut,
    PolicyGate,
    ToolCallOut,
    merge_content,
    request_context,
)
from fak.gateway.schemas import Usage, decode_body, new_id, now
from fak.gateway.sse import DONE, SSE_HEADERS, sse_error, sse_event
from fak.toolcalls.wire import FakPolicyInfo

__all__ = ["CompletionServing", "prompt_of", "validate_completion_request"]

DEFAULT_MAX_TOKENS = 16  # OpenAI's documented default for /v1/completions
SYSTEM_FINGERPRINT = "fp_fak"


def validate_completion_request(req: CompletionRequest) -> None:
    """Checks beyond the schema, shared by engine and proxy mode.

    Raises:
        APIError: 400 naming the field at fault.
    """
    if req.n is not None and req.n != 1:
        raise bad_request(f"n={req.n} is not supported: one choice per request (n=1).", param="n",
                          code="unsupported_value")
    if req.best_of is not None and req.best_of != 1:
        raise bad_request("best_of must be 1.", param="best_of", code="unsupported_value")
    if req.stream_options is not None and not req.stream:
        raise bad_request("stream_options is only allowed when stream is true.", param="stream_options")
    if isinstance(req.prompt, list):
        kinds = {type(x) for x in req.prompt}
        if kinds == {str} and len(req.prompt) != 1:
            raise bad_request("Batched prompts are not supported: send one prompt per request.",
                              param="prompt", code="unsupported_value")
        if len(kinds) > 1:
            raise bad_request("prompt must be a string or a list of token ids, not a mix.", param="prompt")
        if kinds == {int} and any(t < 0 for t in req.prompt):  # type: ignore[operator]
            raise bad_request("Token ids must be non-negative.", param="prompt")


def prompt_of(req: CompletionRequest) -> str | list[int]:
    """The single prompt: text, or token ids."""
    if isinstance(req.prompt, str):
        return req.prompt
    if all(isinstance(x, str) for x in req.prompt):
        return str(req.prompt[0])
    return [int(x) for x in req.prompt]


class CompletionServing:
    """Engine-mode text completions (see module docstring)."""

    def __init__(self, gateway: Any) -> None:
        self.gw = gateway
        self.engine = gateway.engine

    async def handle(self, request: Request[Any, Any, Any]) -> Response[Any]:
        """Serve one request (body not yet read)."""
        t_arrival = time.perf_counter()
        req = decode_body(await request.body(), CompletionRequest)
        validate_completion_request(req)
        if req.suffix:
            raise bad_request("suffix is not supported.", param="suffix", code="unsupported_parameter")
        if req.logit_bias:
            raise bad_request("logit_bias is not supported.", param="logit_bias", code="unsupported_parameter")
        self.gw.check_model(req.model)
        prompt = prompt_of(req)
        ctx = request_context(request.headers, user=req.user, first_messages=[prompt if isinstance(prompt, str)
                                                                              else prompt[:512]])
        gate = PolicyGate(self.gw.policy, self.gw.audit, ctx, on_verdict=self.gw.metrics.count_verdict)
        if isinstance(prompt, str):
            text = prompt
            prompt_ids = await anyio.to_thread.run_sync(
                lambda: self.engine.tokenize(text, add_special=True, parse_special=True))
        else:
            prompt_ids = prompt  # the engine checks the ids against its vocabulary
        sampling = sampling_kwargs(req, req.max_tokens if req.max_tokens is not None else DEFAULT_MAX_TOKENS)
        if req.logprobs is not None:
            sampling["logprobs"] = req.logprobs
        run = EngineRun(self.engine, prompt_ids, sampling, self.gw.admission, self.gw.metrics, t_arrival,
                        prompt_param="prompt", max_tokens_param="max_tokens" if req.max_tokens is not None else None)
        try:
            await run_until_disconnect(request, run.start())
        except ClientDisconnected:
            await run.aclose()
            return Response(b"", status_code=499)
        # echoed token ids are detokenized once the engine has taken them (it checks their range)
        echo = "" if not req.echo else prompt if isinstance(prompt, str) else self.engine.detokenize(prompt)
        filt = AssistantOutputFilter(gate, content_offset=len(echo))
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return Stream(self._stream(run, filt, gate, req, len(prompt_ids), echo, include_usage),
                          media_type="text/event-stream", headers=SSE_HEADERS,
                          background=BackgroundTask(run.aclose))
        try:
            body = await run_until_disconnect(request, self._complete(run, filt, gate, req, len(prompt_ids), echo))
        except ClientDisconnected:
            return Response(b"", status_code=499)
        except APIError as err:
            return error_response(err)
        finally:
            await run.aclose()
        return Response(body, media_type="application/json")

    def _logprobs(self, entries: list[TokenLogprobs], offset: int) -> CompletionLogprobs:
        tokens: list[str] = []
        lps: list[float | None] = []
        tops: list[dict[str, float] | None] = []
        offsets: list[int] = []
        for e in entries:
            tok = e.token if e.token is not None else self.engine.detokenize([e.token_id])
            tokens.append(tok)
            lps.append(e.logprob)
            tops.append({(t if t is not None else self.engine.detokenize([tid])): lp for tid, lp, t in e.top}
                        if e.top else None)
            offsets.append(offset)
            offset += len(tok)
        return CompletionLogprobs(tokens=tokens, token_logprobs=lps, top_logprobs=tops, text_offset=offsets)

    async def _complete(self, run: EngineRun, filt: AssistantOutputFilter, gate: PolicyGate,
                        req: CompletionRequest, n_prompt: int, echo: str) -> bytes:
        parts = [echo]
        entries: list[TokenLogprobs] = []
        async for delta in run.deltas():
            parts += [ev.text for ev in filt.feed(delta.text) if isinstance(ev, ContentOut)]
            if req.logprobs is not None:
                entries += token_logprobs(delta)
        parts += [ev.text for ev in filt.finish() if isinstance(ev, ContentOut)]
        choice = CompletionChoice(text="".join(parts), index=0, finish_reason=run.finish_reason or "stop",
                                  logprobs=self._logprobs(entries, len(echo)) if req.logprobs is not None else None)
        resp = Completion(id=new_id("cmpl"), created=now(), model=self.gw.model_name, choices=[choice],
                          usage=Usage(n_prompt, run.n_completion, n_prompt + run.n_completion),
                          system_fingerprint=SYSTEM_FINGERPRINT)
        if gate.active:
            resp.fak_policy = FakPolicyInfo(verdicts=gate.verdicts)
        return msgspec.json.encode(resp)

    async def _stream(self, run: EngineRun, filt: AssistantOutputFilter, gate: PolicyGate,
                      req: CompletionRequest, n_prompt: int, echo: str, include_usage: bool) -> AsyncIterator[bytes]:
        cid, created, model = new_id("cmpl"), now(), self.gw.model_name
        usage_null: Any = None if include_usage else msgspec.UNSET
        # text_offset counts the tokens' own texts from the end of the echo, as the non-streamed
        # response does, whatever the chunks' text (held back, replaced by a note) looks like.
        lp_offset = len(echo)
        pending: list[TokenLogprobs] = []

        def chunk(text: str, finish: str | None = None, verdict: Any = None) -> bytes:
            nonlocal lp_offset, pending
            lp = None
            if req.logprobs is not None and (pending or finish):
                lp = self._logprobs(pending, lp_offset)
                lp_offset += sum(len(t) for t in lp.tokens)
                pending = []
            c = Completion(id=cid, created=created, model=model, system_fingerprint=SYSTEM_FINGERPRINT,
                           usage=usage_null, choices=[CompletionChoice(text=text, index=0, finish_reason=finish,
                                                                       logprobs=lp)])
            if verdict is not None:
                c.fak_policy = FakPolicyInfo(verdicts=[verdict])
            return sse_event(c)

        try:
            if echo:
                yield chunk(echo)
            async for group in run.batches():
                events: list[ContentOut | ToolCallOut] = []
                for delta in group:
                    if req.logprobs is not None:
                        pending += token_logprobs(delta)
                    events += filt.feed(delta.text)
                out = [chunk(ev.text, verdict=ev.verdict) for ev in merge_content(events)
                       if isinstance(ev, ContentOut) and (ev.text or ev.verdict)]
                if out:
                    yield b"".join(out)
            tail = [chunk(ev.text, verdict=ev.verdict) for ev in filt.finish()
                    if isinstance(ev, ContentOut) and (ev.text or ev.verdict)]
            tail.append(chunk("", finish=run.finish_reason or "stop"))
            if include_usage:
                tail.append(sse_event(Completion(id=cid, created=created, model=model, choices=[],
                                                 system_fingerprint=SYSTEM_FINGERPRINT,
                                                 usage=Usage(n_prompt, run.n_completion, n_prompt + run.n_completion))))
            tail.append(DONE)
            yield b"".join(tail)
        except APIError as err:
            yield sse_error(err)
            yield DONE
        finally:
            await run.aclose()
