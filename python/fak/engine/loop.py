"""The engine loop: the one thread per ``fak.Engine`` that calls the native model (vLLM's EngineCore,
in-process; text stays on the consumer side, ``request.py``).

Requests reach the loop through a locked inbox, each carrying its own reply channel
(``channels.py``). Between two ``step()`` calls the loop admits waiting requests
(``add_sequence``), so new sequences join a running batch; it sleeps on a condition while nothing
is running. The native core ends a request itself: each sequence carries ``max_tokens`` and the
end-of-generation ids, and the step that samples one of them, or the last allowed token, returns
its ``finish`` and frees the sequence. The loop hands each sampled token, as a
:class:`TokenOutput`, to the request's channel; it never detokenizes. A consumer that ends a
request (a stop string matched in its text, a closed stream, a cancelled task) aborts it here
(``remove_sequence``), a step or more after its last token; outputs that arrive for it meanwhile
are dropped.

Failures stay with the request that caused them: a failing ``add_sequence`` (bad values, a prompt
that can never fit in the KV cache) fails that request, and a failing ``step()`` fails the sequences
that the core held then; the loop goes on serving the others. The queue is the native core's: a
request is handed to it as soon as the loop sees it, and the core runs up to ``max_batch``
sequences, queues the rest and admits them as KV blocks free up (preempting by recompute when it
must); the loop keeps no queue of its own.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from fak.engine.channels import Wakes
from fak.errors import FakError


class NativeModel(Protocol):
    """What :class:`fak.Engine` needs from a model: the ``fak._native.EngineCore`` contract."""

    @property
    def n_ctx(self) -> int: ...
    @property
    def n_vocab(self) -> int: ...
    @property
    def kv_blocks_total(self) -> int: ...
    @property
    def kv_blocks_free(self) -> int: ...
    @property
    def request_limits(self) -> Any:
        """The core's ``fak._native.RequestLimits``: ``check(prompt_ids, sampling)`` raises what
        ``add_sequence`` would, ``check_logits(token_ids)`` what ``logits`` would, without waiting
        for a step."""
    def add_sequence(self, seq_id: int, prompt_ids: list[int], sampling: dict[str, Any],
                     resident_tokens: int = 0, conversation: str | None = None) -> None: ...
    def remove_sequence(self, seq_id: int) -> None: ...
    def step(self) -> list[tuple[int, int, float, list[tuple[int, float]] | None, str | None]]: ...
    def logits(self, token_ids: list[int]) -> Any: ...


class TokenOutput(NamedTuple):
    """One token the core sampled for a request, as the loop sends it to the request's channel.

    ``finish``: the core's end of the request (``"stop"``: an end-of-generation token;
    ``"length"``), else None; ``t_start`` / ``t_end``: the ``perf_counter`` bounds of the step.
    """

    token_id: int
    logprob: float
    top: list[tuple[int, float]] | None
    finish: str | None
    t_start: float
    t_end: float


class CoreRequest:
    """One request as the engine loop sees it: token ids and native sampling in, token outputs
    (or an exception) out through ``sink``. Written by the loop once submitted, except the
    consumer's ``cancelled`` / ``stopped``."""

    def __init__(self, seq_id: int, prompt_ids: list[int], native: dict[str, Any]) -> None:
        self.seq_id = seq_id
        self.prompt_ids = prompt_ids
        self.native = native  # the core's sampling dict, with max_tokens and stop_ids
        self.resident = 0  # leading prompt tokens to keep resident in the prefix cache
        self.conversation: str | None = None  # its conversation (drafts from earlier outputs)
        self.sink: Any = None  # its reply channel (channels.py), set before submit
        self.submitted = False
        self.cancelled = False  # the consumer ended it: drop its outputs, free its sequence
        self.stopped = False  # ... because a stop string finished it (counted as finished)
        self.native_done = False  # the core finished (and removed) the sequence
        self.t_submit = 0.0
        self.t_added = 0.0
        self.cached_tokens: int | None = None  # prompt tokens the prefix cache held


class EngineLoop:
    """The engine-loop thread over ``model`` and its inbox; the only caller of the model.

    Args:
        model: the native model (``fak._native.EngineCore`` or an object following its contract).
        name: the thread's name suffix.
    """

    def __init__(self, model: NativeModel, name: str) -> None:
        from fak import _native

        self.model = model
        # per-sequence prefix-cache hits and resident prefixes (native cores that have them)
        self._prefix_hits = callable(getattr(model, "take_prefix_hits", None))
        # conversations (drafts from a conversation's earlier outputs): fak's own native core
        self._conversations = isinstance(model, _native.EngineCore)
        self._cond = threading.Condition()
        self._inbox: list[tuple[str, Any]] = []
        self._waiting: deque[CoreRequest] = deque()
        self._active: dict[int, CoreRequest] = {}
        self._closing = False
        self._closed = False
        self._broken: BaseException | None = None
        self._stats: dict[str, int | float] = {"running": 0, "waiting": 0, "kv_blocks_used": 0, "kv_blocks_total": 0,
                       "steps": 0, "requests_finished": 0, "tokens_generated": 0}
        self._update_stats()
        self.thread = threading.Thread(target=self._run, name=f"fak-engine-{name}", daemon=True)
        self.thread.start()

    # --- the consumers' side ----------------------------------------------------------------------

    def check_open(self) -> None:
        """Raises fak.FakError when the loop no longer takes requests."""
        if self._closing or self._closed:
            raise FakError("the engine is closed")
        if self._broken is not None:
            raise FakError(f"the engine loop has failed: {self._broken!r}")

    def submit(self, req: CoreRequest) -> None:
        """Hands ``req`` (its sink set) to the loop."""
        req.t_submit = time.perf_counter()
        req.submitted = True
        self._post("submit", req)

    def abort(self, req: CoreRequest, stopped: bool = False) -> None:
        """Ends ``req`` in the core (``stopped``: a stop string finished it); its outputs still on
        their way are dropped. Never raises."""
        req.stopped = stopped
        req.cancelled = True
        with self._cond:
            if not self._closing and self._broken is None:
                self._inbox.append(("cancel", req))
                self._cond.notify()

    def call(self, fn: Callable[[Any], Any]) -> Any:
        """``fn(model)`` run on the loop thread between two steps; its result, or its exception
        raised here."""
        reply: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._post("call", (fn, reply))
        result = reply.get()
        if isinstance(result, BaseException):
            raise result
        return result

    def quarantine_span(self, req: CoreRequest, start: int, end: int) -> int:
        """Removes prompt positions ``start:end`` of ``req`` (see ``Engine.quarantine_span``)."""
        def edit(m: Any) -> int:
            if req.seq_id in self._active:
                n = int(m.quarantine_span(req.seq_id, start, end))
            elif req in self._waiting or not req.submitted:
                n = int(m.evict_prefix(list(req.prompt_ids), start))
            else:
                return 0
            req.prompt_ids = req.prompt_ids[:start] + req.prompt_ids[end:]
            return n

        return int(self.call(edit))

    def stats(self) -> dict[str, int | float]:
        """The counters as of the last step, plus the requests still in the inbox (waiting)."""
        with self._cond:
            stats = dict(self._stats)
            stats["waiting"] += sum(1 for kind, _ in self._inbox if kind == "submit")
        return stats

    def close(self) -> None:
        """Stops the loop (running requests fail with ``fak.FakError``), joins its thread.
        Idempotent."""
        with self._cond:
            if self._closed:
                return
            self._closing = True
            self._cond.notify()
        if threading.current_thread() is not self.thread:
            self.thread.join()
        self._closed = True

    def _post(self, kind: str, payload: Any) -> None:
        with self._cond:
            if self._broken is not None:
                raise FakError(f"the engine loop has failed: {self._broken!r}")
            if self._closing:
                raise FakError("the engine is closed")
            self._inbox.append((kind, payload))
            self._cond.notify()

    # --- the loop thread --------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self._inbox and not self._active and not self._waiting and not self._closing:
                        self._cond.wait()
                    inbox, self._inbox = self._inbox, []
                    if self._closing:
                        self._inbox = inbox
                        return
                for kind, payload in inbox:
                    self._handle(kind, payload)
                self._admit()
                if self._active:
                    self._step()
                self._update_stats()
        except BaseException as e:  # a bug in the loop itself: fail everyone, never hang them
            self._broken = e
        finally:
            self._shutdown()

    def _handle(self, kind: str, payload: Any) -> None:
        if kind == "submit":
            self._waiting.append(payload)
        elif kind == "cancel":
            req: CoreRequest = payload
            if req.seq_id in self._active:
                self._drop(req)
            else:
                try:
                    self._waiting.remove(req)
                except ValueError:
                    pass
        elif kind == "call":
            fn, reply = payload
            try:
                reply.put(fn(self.model))
            except BaseException as e:
                reply.put(e)

    def _admit(self) -> None:
        # Every request goes to the core at once: it queues what it cannot run yet.
        while self._waiting:
            req = self._waiting[0]
            if req.cancelled:
                self._waiting.popleft()
                continue
            try:
                # The native scheduler queues a sequence past max_batch or until KV blocks free
                # up (preempting by recompute when needed); KVCacheFullError means the prompt can
                # never fit.
                extra: dict[str, Any] = {}
                if req.resident and self._prefix_hits:
                    extra["resident_tokens"] = req.resident
                if req.conversation is not None and self._conversations:
                    extra["conversation"] = req.conversation
                self.model.add_sequence(req.seq_id, req.prompt_ids, req.native, **extra)
            except Exception as e:
                self._remove(req)
                self._waiting.popleft()
                self._fail(req, e)
                continue
            self._waiting.popleft()
            req.t_added = time.perf_counter()
            self._active[req.seq_id] = req

    def _step(self) -> None:
        t0 = time.perf_counter()
        try:
            outputs = self.model.step()
        except Exception as e:
            # Fail every sequence handed to the core (those that took part in the failed step
            # and those it queued: the core's state after a failed forward is not trusted), free
            # their KV.
            failed = list(self._active.values())
            self._active.clear()
            for req in failed:
                self._remove(req)
                self._fail(req, e)
            return
        t1 = time.perf_counter()
        self._stats["steps"] += 1
        if self._prefix_hits:
            for seq_id, n_hit in self.model.take_prefix_hits():  # type: ignore[attr-defined]
                hit_req = self._active.get(seq_id)
                if hit_req is not None and hit_req.cached_tokens is None:
                    hit_req.cached_tokens = int(n_hit)
        wakes = Wakes()
        try:
            self._deliver(outputs, t0, t1, wakes)
        finally:
            wakes.flush()

    def _deliver(self, outputs: list[Any], t0: float, t1: float, wakes: Wakes) -> None:
        for seq_id, token_id, logprob, top, finish in outputs:
            req = self._active.get(seq_id)
            if req is None:
                continue
            if finish is not None:
                req.native_done = True  # the core has removed the sequence already
            if req.cancelled:
                self._drop(req)
                continue
            self._stats["tokens_generated"] += 1
            if finish is not None:
                del self._active[seq_id]
                self._stats["requests_finished"] += 1
                self._update_stats(native=False)  # consistent when the consumer sees its last delta
            req.sink.put_deferred(TokenOutput(int(token_id), logprob, top, finish, t0, t1), wakes)

    def _drop(self, req: CoreRequest) -> None:
        """Ends an active request its consumer ended."""
        del self._active[req.seq_id]
        self._remove(req)
        if req.stopped:
            self._stats["requests_finished"] += 1

    def _fail(self, req: CoreRequest, error: BaseException) -> None:
        if req.sink is not None:
            req.sink.put(error)

    def _remove(self, req: CoreRequest) -> None:
        if req.native_done:
            return
        try:
            self.model.remove_sequence(req.seq_id)
        except Exception:
            pass  # the sequence is gone either way; nothing else depends on it

    def _update_stats(self, native: bool = True) -> None:
        try:
            total = int(self.model.kv_blocks_total)
            used = total - int(self.model.kv_blocks_free)
        except Exception:
            total = used = 0
        try:
            running, queued = int(self.model.n_running), int(self.model.n_waiting)
        except Exception:
            running, queued = len(self._active), 0
        counters: dict[str, Any] = {}
        native_stats = getattr(self.model, "stats", None) if native else None
        if native_stats is not None:
            try:
                counters = {f"native_{k}": v for k, v in native_stats().items()}
            except Exception:
                counters = {}
        with self._cond:
            self._stats.update(counters)
            # running / waiting: the core's own counts (it queues), plus requests the loop has
            # not handed to it yet
            self._stats.update(running=running, waiting=queued + len(self._waiting),
                               kv_blocks_used=used, kv_blocks_total=total)

    def _shutdown(self) -> None:
        error = FakError(f"the engine loop has failed: {self._broken!r}") if self._broken is not None \
            else FakError("the engine was closed while the request was running")
        with self._cond:
            self._closing = True
            inbox, self._inbox = self._inbox, []
        pending = list(self._active.values()) + list(self._waiting)
        for kind, payload in inbox:
            if kind == "submit":
                pending.append(payload)
            elif kind == "call":
                payload[1].put(error)
        for req in self._active.values():
            self._remove(req)
        self._active.clear()
        self._waiting.clear()
        for req in pending:
            self._fail(req, error)
        self._update_stats()
