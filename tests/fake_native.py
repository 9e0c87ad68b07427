"""A deterministic stand-in for ``fak._native.EngineCore`` (tests only), and a tiny byte-level tokenizer.

The fake follows the native contract of ARCHITECTURE.md (``request_limits`` / ``add_sequence`` /
``remove_sequence`` / ``step`` / ``logits``, paged-KV accounting with ``kv_blocks_total`` /
``kv_blocks_free``; requests are checked by the core's own rules, ``request_limits``, a
``fak._native.RequestLimits``) and
records what the engine did to it, so tests can check continuous batching, cancellation and error
isolation without a real model. Its "model" continues each sequence with the UTF-8 bytes of a
fixed text (multi-byte characters split across byte tokens), starting at an offset given by the
prompt and, when sampling with temperature > 0, by the seed.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import numpy as np

from fak import _native
from fak.tokenizer import Tokenizer, _BYTE_ENCODER

TEXT = "Hello, wörld! 日本語 😀 code: x = 1\n"
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def tiny_tokenizer() -> Tokenizer:
    """256 byte tokens, a few merges, and three control tokens (ids 256.. after the merges)."""
    tokens = [_BYTE_ENCODER[b] for b in range(256)]
    merges = ["H e", "He l", "Hel l", "Hell o", "Ġ w", "o r", "l d"]
    for m in merges:
        a, b = m.split(" ")
        tokens.append(a + b)
    types = [1] * len(tokens)
    for s in SPECIALS:
        tokens.append(s)
        types.append(3)
    return Tokenizer(tokens, types, merges, pre="qwen2",
                     bos_id=tokens.index("<|endoftext|>"), eos_id=tokens.index("<|im_end|>"), add_bos=False)


class FakeModel:
    """Deterministic native-model double.

    Args:
        tokenizer: vocabulary to produce tokens from (byte tokens 0..255 must be the bytes).
        n_ctx: context window.
        kv_blocks: KV blocks in the pool; ``block_size`` tokens each (accounting only: like the
            native scheduler, a prompt is refused only when it could never fit).
        eos_after: emit EOS after this many generated tokens (None: never).
        step_delay: seconds each ``step()`` sleeps (the GIL is released, as in the real one).
        fail_prompt_token: ``add_sequence`` raises ValueError for a prompt containing this id.
        fail_step_when: ``step()`` raises RuntimeError while this sequence id is running.
        bad_token_prompt_token: sequences whose prompt contains this id get an out-of-vocabulary
            token from ``step()`` (a misbehaving model).
        max_batch: as the native scheduler, ``step()`` runs the first ``max_batch`` sequences in
            the order they were added; the others wait in its queue.
    """

    def __init__(self, tokenizer: Tokenizer, n_ctx: int = 256, kv_blocks: int = 1024, block_size: int = 16,
                 eos_after: int | None = None, step_delay: float = 0.0, fail_prompt_token: int | None = None,
                 fail_step_when: int | None = None, bad_token_prompt_token: int | None = None,
                 max_batch: int = 64) -> None:
        self.max_batch = max_batch
        self.n_ctx = n_ctx
        self.n_vocab = tokenizer.n_vocab
        self.kv_blocks_total = kv_blocks
        self.block_size = block_size
        self.eos_id = tokenizer.eos_id
        self.eos_after = eos_after
        self.step_delay = step_delay
        self.fail_prompt_token = fail_prompt_token
        self.fail_step_when = fail_step_when
        self.bad_token_prompt_token = bad_token_prompt_token
        self.text = TEXT.encode("utf-8")
        self.seqs: dict[int, dict[str, Any]] = {}
        self.added: list[int] = []
        self.removed: list[int] = []
        self.batch_sizes: list[int] = []
        self.joined_running_batch = 0  # prefills done in a step that also decoded other sequences
        self.thread_ids: set[int] = set()
        self.sampling: dict[int, dict[str, Any]] = {}
        self.request_limits = _native.RequestLimits(n_ctx, self.n_vocab, kv_blocks, block_size)

    @property
    def kv_blocks_free(self) -> int:
        return self.kv_blocks_total - sum(self._blocks(len(s["tokens"]) + 1) for s in self.seqs.values())

    @property
    def n_running(self) -> int:
        return min(len(self.seqs), self.max_batch)

    @property
    def n_waiting(self) -> int:
        return max(0, len(self.seqs) - self.max_batch)

    def _blocks(self, n_tokens: int) -> int:
        return -(-n_tokens // self.block_size)

    def add_sequence(self, seq_id: int, prompt_ids: list[int], sampling: dict[str, Any]) -> None:
        self.thread_ids.add(threading.get_ident())
        if seq_id in self.seqs:
            raise ValueError(f"sequence {seq_id} exists")
        if self.fail_prompt_token is not None and self.fail_prompt_token in prompt_ids:
            raise ValueError("injected add_sequence failure")
        self.request_limits.check(prompt_ids, sampling)  # as the native: the same rules again
        offset = sum(prompt_ids) % len(self.text)
        if sampling["temperature"] > 0:
            offset = random.Random(sampling["seed"]).randrange(len(self.text))
        self.seqs[seq_id] = {"tokens": list(prompt_ids), "new": True, "offset": offset, "n_gen": 0,
                             "n_logprobs": sampling["n_logprobs"],
                             "bad": self.bad_token_prompt_token in prompt_ids}
        self.sampling[seq_id] = dict(sampling)
        self.added.append(seq_id)

    def remove_sequence(self, seq_id: int) -> None:
        self.thread_ids.add(threading.get_ident())
        if self.seqs.pop(seq_id, None) is not None:
            self.removed.append(seq_id)

    def step(self) -> list[tuple[int, int, float, list[tuple[int, float]] | None, str | None]]:
        self.thread_ids.add(threading.get_ident())
        if self.step_delay:
            time.sleep(self.step_delay)
        if self.fail_step_when is not None and self.fail_step_when in self.seqs:
            raise RuntimeError("injected step failure")
        running = dict(list(self.seqs.items())[: self.max_batch])  # the rest wait (insertion order)
        new = [i for i, s in running.items() if s["new"]]
        if new and len(new) < len(running):
            self.joined_running_batch += len(new)
        self.batch_sizes.append(len(running))
        out = []
        for seq_id, s in running.items():
            s["new"] = False
            if s["bad"]:
                token = self.n_vocab + 5
            elif self.eos_after is not None and s["n_gen"] >= self.eos_after:
                token = self.eos_id
            else:
                token = self.text[(s["offset"] + s["n_gen"]) % len(self.text)]
            s["n_gen"] += 1
            s["tokens"].append(token)
            top = [(token, -0.25), ((token + 1) % 256, -1.5)][: s["n_logprobs"]] if s["n_logprobs"] else None
            # As the native core: a stop id or the last allowed token finishes and removes it.
            sampling = self.sampling[seq_id]
            finish = None
            if token in sampling.get("stop_ids", ()):
                finish = "stop"
            elif s["n_gen"] >= sampling.get("max_tokens", 1 << 62) or len(s["tokens"]) >= self.n_ctx:
                finish = "length"
            out.append((seq_id, token, -0.25, top, finish))
        for seq_id, *_, finish in out:
            if finish is not None:
                del self.seqs[seq_id]
                self.removed.append(seq_id)
        return out

    def logits(self, token_ids: list[int]) -> np.ndarray:
        self.thread_ids.add(threading.get_ident())
        self.request_limits.check_logits(token_ids)
        out = np.zeros((len(token_ids), self.n_vocab), dtype=np.float32)
        for i, t in enumerate(token_ids):
            out[i, (t + 1) % self.n_vocab] = 1.0
        return out
