"""Greedy continuations through ``fak._native.EngineCore``'s batched ``step()`` (shared by the parity and
CUDA engine tests)."""

from __future__ import annotations

from typing import Any


def greedy_batched(model: Any, prompts: list[list[int]], n_new: int) -> list[list[int]]:
    """Add every prompt as a sequence (ids 0..n-1, temperature 0), step until each has ``n_new``
    tokens, remove it; returns the new token ids per prompt, in prompt order."""
    out: dict[int, list[int]] = {i: [] for i in range(len(prompts))}
    for i, toks in enumerate(prompts):
        model.add_sequence(i, toks, {"temperature": 0.0})
    live = set(out)
    while live:
        for seq_id, token, _logprob, _top, _finish in model.step():
            out[seq_id].append(token)
            if len(out[seq_id]) >= n_new:
                model.remove_sequence(seq_id)
                live.discard(seq_id)
    return [out[i] for i in range(len(prompts))]
