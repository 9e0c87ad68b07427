"""``fak.Engine``: generation over one native model, sync and async, with continuous batching.

The split follows vLLM v1's (EngineCore apart from the output processor on the consumer side):

- ``client.py``: :class:`Engine`, the API: loads the model, checks each request once, builds it.
- ``loop.py``: the engine-loop thread, the only caller of the native model (``fak._native.EngineCore``,
  contract in ARCHITECTURE.md): admits requests between steps, steps, hands each sampled token to
  the request's reply channel; the core ends a request at an end-of-generation token or its
  token budget.
- ``channels.py``: the reply channels, one per request (sync queue; async deque woken on the
  consumer's asyncio or trio event loop).
- ``request.py``: a request's text state on the consumer side: UTF-8-safe detokenizer and
  stop-string matcher; a stop string finishes the request there, and the core is told a step or
  more later (the tokens it sampled meanwhile are dropped).
- ``streams.py``: :class:`TokenStream` / :class:`AsyncTokenStream`, where the text is made;
  closing or dropping a stream, or cancelling the task that awaits it, cancels its sequence.
- ``results.py``: :class:`Delta`, :class:`Completion`, :class:`Usage`, :class:`Timings`,
  log-probabilities.
"""

from fak.engine.client import Engine
from fak.engine.loop import NativeModel
from fak.engine.results import Completion, Delta, Timings, TokenLogprob, TopLogprob, Usage
from fak.engine.streams import AsyncTokenStream, TokenStream

__all__ = [
    "Engine",
    "Delta",
    "Completion",
    "Usage",
    "Timings",
    "TokenLogprob",
    "TopLogprob",
    "TokenStream",
    "AsyncTokenStream",
    "NativeModel",
]
