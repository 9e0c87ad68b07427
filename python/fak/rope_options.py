"""The model options shared by ``fak serve``, ``fak generate`` and ``fak chat``: RoPE scaling
(``--rope-scaling``, ``--rope-scale``, ``--yarn-orig-ctx``), the sliding window
(``--sliding-window``) and where a mixture-of-experts model's experts live (``--cpu-moe``,
``--n-cpu-moe``), and the ``fak.Engine`` keyword arguments they become. All are Rust's
(``rust/src/model/rope_scaling.rs``, ``rust/src/model/config.rs``, ``rust/src/model/weights.rs``;
docs/long-context.md, docs/moe.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])

ROPE_SCALING_TYPES = ("none", "linear", "yarn", "llama3")


def rope_click_options(f: F) -> F:
    """Adds the three RoPE scaling options and ``--sliding-window`` to a click command (each
    defaults to the GGUF's)."""
    options = [
        click.option("--rope-scaling", type=click.Choice(ROPE_SCALING_TYPES), default=None,
                     help="RoPE scaling for long contexts [default: the GGUF's rope.scaling.type]; Qwen2.5 "
                          "at 128k: --rope-scaling yarn --rope-scale 4 --yarn-orig-ctx 32768."),
        click.option("--rope-scale", type=click.FloatRange(min=0.0, min_open=True), default=None,
                     help="RoPE context extension factor [default: the GGUF's rope.scaling.factor]."),
        click.option("--yarn-orig-ctx", type=click.IntRange(min=1), default=None,
                     help="Context the model was trained on before extension, in tokens [default: the "
                          "GGUF's rope.scaling.original_context_length, else its context_length]."),
        click.option("--sliding-window", type=click.IntRange(min=0), default=None,
                     help="Sliding-window attention: windowed layers attend to the last N positions only; "
                          "0 turns the window off [default: the GGUF's attention.sliding_window; the "
                          "layers are its attention.sliding_window_pattern, else all]. With every layer "
                          "windowed, KV memory is bounded by the window, not --n-ctx."),
        click.option("--cpu-moe", is_flag=True, default=False,
                     help="Keep every layer's MoE experts in host memory and run them on the CPU; "
                          "attention, router and the rest stay on the GPU (llama.cpp's --cpu-moe)."),
        click.option("--n-cpu-moe", type=click.IntRange(min=0), default=None,
                     help="Keep the MoE experts of the first N layers in host memory (llama.cpp's "
                          "--n-cpu-moe): for a model larger than the GPU."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


#: ``n_cpu_moe`` for "every layer" (``--cpu-moe``): more layers than any model has.
ALL_LAYERS = 1 << 30


def rope_kwargs(rope_scaling: str | None = None, rope_scale: float | None = None,
                yarn_orig_ctx: int | None = None, sliding_window: int | None = None,
                cpu_moe: bool = False, n_cpu_moe: int | None = None, **_: Any) -> dict[str, Any]:
    """The ``fak.Engine`` keyword arguments of the options that were given (unset ones are left
    out, so the file decides; ``--cpu-moe`` is ``n_cpu_moe`` of every layer).

    Raises ``click.UsageError`` for ``--cpu-moe`` together with ``--n-cpu-moe``."""
    if cpu_moe and n_cpu_moe is not None:
        raise click.UsageError("give --cpu-moe (every layer) or --n-cpu-moe N (the first N layers), not both.")
    given = {"rope_scaling": rope_scaling, "rope_scale": rope_scale, "yarn_orig_ctx": yarn_orig_ctx,
             "sliding_window": sliding_window, "n_cpu_moe": ALL_LAYERS if cpu_moe else n_cpu_moe}
    return {k: v for k, v in given.items() if v is not None}
