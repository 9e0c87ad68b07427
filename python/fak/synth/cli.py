"""``fak synth``: write a synthetic GGUF model (tiny model or twin of a real layout)."""

from __future__ import annotations

import time
from pathlib import Path

import click

from fak.errors import FakError
from fak.synth import PRESETS, plan_tiny_model, plan_twin, write_plan
from fak.synth.blocks import FORMATS
from fak.synth.layout import MIXES
from fak.synth.vocab import FAMILIES

__all__ = ["synth_command"]


@click.command("synth")
@click.argument("out", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--tiny", type=click.Choice(list(FAMILIES)), help="A tiny model of this architecture (CI-sized).")
@click.option("--like", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A twin of this real GGUF: same header and tensor layout, random weights.")
@click.option("--preset", type=click.Choice(sorted(PRESETS)), help="A twin of a known release's layout.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random weights.")
@click.option("--tokenizer-from", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Carry this real GGUF's tokenizer (and chat template) instead of fak's synthetic one.")
@click.option("--weight-type", default="Q8_0", show_default=True,
              type=click.Choice(sorted(FORMATS) + sorted(MIXES), case_sensitive=False),
              help="With --tiny: the type of the 2-D weights (or the Q4_K_M mix).")
@click.option("--sliding-window", type=click.IntRange(min=0), default=None,
              help="With --tiny: declare sliding-window attention of N tokens ({arch}.attention.sliding_window).")
@click.option("--sliding-window-pattern", default=None, metavar="N|B,B,...",
              help="With --tiny: which layers are windowed ({arch}.attention.sliding_window_pattern): an int "
                   "period N (llama.cpp's: layer i windowed iff N == 0 or i % N < N - 1) or one 0/1 per layer.")
@click.option("--n-layer", type=click.IntRange(min=1), default=None,
              help="With --tiny: transformer blocks [default: 2; 4 for qwen35 / qwen35moe].")
@click.option("--tied/--untied", "tied", default=None,
              help="With --tiny: tie output.weight to token_embd.weight, or write both [default: the family's].")
@click.option("--n-expert", type=click.IntRange(min=2), default=None,
              help="With --tiny qwen3moe / qwen35moe: experts per layer (expert_count) [default: 32].")
@click.option("--n-expert-used", type=click.IntRange(min=1), default=None,
              help="With --tiny qwen3moe / qwen35moe: experts chosen per token (expert_used_count) [default: 4].")
def synth_command(out: Path, tiny: str | None, like: Path | None, preset: str | None, seed: int,
                  tokenizer_from: Path | None, weight_type: str, sliding_window: int | None = None,
                  sliding_window_pattern: str | None = None, n_layer: int | None = None, tied: bool | None = None,
                  n_expert: int | None = None, n_expert_used: int | None = None) -> None:
    """Write a synthetic GGUF model to OUT: real names, shapes, types and metadata, random valid weights."""
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

    if sum(x is not None for x in (tiny, like, preset)) != 1:
        raise click.UsageError("give exactly one of --tiny ARCH, --like REAL.gguf, --preset NAME")
    if tiny and tokenizer_from:
        raise click.UsageError("--tokenizer-from applies to twins (--like/--preset), not --tiny")
    if not tiny and any(x is not None for x in (sliding_window, sliding_window_pattern, n_layer, tied)):
        raise click.UsageError("--sliding-window, --sliding-window-pattern, --n-layer and --tied/--untied "
                               "apply to --tiny")
    if tiny not in ("qwen3moe", "qwen35moe") and (n_expert is not None or n_expert_used is not None):
        raise click.UsageError("--n-expert and --n-expert-used apply to --tiny qwen3moe / qwen35moe")
    pattern: int | list[bool] | None = None
    if sliding_window_pattern is not None:
        try:
            parts = [int(x) for x in sliding_window_pattern.split(",")]
        except ValueError:
            raise click.BadParameter("an int period or comma-separated 0/1 per layer",
                                     param_hint="--sliding-window-pattern") from None
        pattern = parts[0] if len(parts) == 1 and "," not in sliding_window_pattern else [bool(x) for x in parts]
    try:
        if tiny:
            plan = plan_tiny_model(tiny, weight_type=weight_type.upper(), seed=seed,  # type: ignore[arg-type]
                                   n_layer=n_layer, sliding_window=sliding_window,
                                   sliding_window_pattern=pattern, tied_embeddings=tied,
                                   n_expert=n_expert, n_expert_used=n_expert_used)
        else:
            plan = plan_twin(like=like, preset=preset, seed=seed, tokenizer_from=tokenizer_from)
    except (FakError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc

    console = Console(stderr=True)
    total = plan.file_nbytes()
    console.print(f"writing {out}: {len(plan.tensors)} tensors, {plan.n_params():,} parameters, {total:,} bytes")
    start = time.perf_counter()
    with Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                  TimeRemainingColumn(), console=console, transient=True) as bar:
        task = bar.add_task("data", total=plan.data_nbytes())
        try:
            write_plan(out, plan, seed=seed, progress=lambda done, _total: bar.update(task, completed=done))
        except (FakError, ValueError, OSError) as exc:
            raise click.ClickException(f"cannot write {out}: {exc}") from exc
    elapsed = time.perf_counter() - start
    console.print(f"wrote {out} ({total / 1e6:,.1f} MB in {elapsed:.1f} s, {total / 1e6 / max(elapsed, 1e-9):,.0f} MB/s)")
    click.echo(str(out))
