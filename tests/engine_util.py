"""Helpers that drive ``fak._native.EngineCore`` in tests of several folders."""

from __future__ import annotations

from fak import _native


def greedy_run(model: _native.EngineCore, prompts: list[list[int]], n_new: int, base: int = 0) -> dict[int, list[int]]:
    """Greedy continuations of ``prompts`` (``n_new`` tokens each) decoded together, by sequence id
    ``base + i``."""
    out: dict[int, list[int]] = {base + i: [] for i in range(len(prompts))}
    for i, p in enumerate(prompts):
        model.add_sequence(base + i, p, {"temperature": 0.0, "max_tokens": n_new})
    while model.n_running or model.n_waiting:
        for sid, tok, *_ in model.step():
            out[sid].append(tok)
    return out
