"""``fak generate`` and ``fak chat``: stream completions from a GGUF model in the terminal.

Both print the speed of each reply at the end: prompt tokens and prefill tok/s, generated tokens
and decode tok/s, time to first token. Sampling defaults are llama.cpp's command-line defaults
(temperature 0.8, top-k 40, top-p 0.95, min-p 0.05); ``--temperature 0`` is greedy.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import click

from fak.rope_options import rope_click_options, rope_kwargs
from fak.terminal import printable

__all__ = ["generate", "chat", "resolve_model"]

MODELS_DIR = Path(os.environ.get("FAK_MODELS", Path.home() / ".cache" / "fak" / "models"))


def resolve_model(model: str) -> Path:
    """A GGUF path from ``model``: an existing file, the name of a cached model
    (``~/.cache/fak/models/NAME.gguf``, or ``$FAK_MODELS``), or a hub model
    (``hf://ORG/NAME/FILE.gguf``, ``hf://ORG/NAME:QUANT``: pulled into the cache on first use).

    Raises:
        click.BadParameter: none of these exists, or the pull failed (the message says why).
    """
    from fak.hub.cli import GGUF_PATH
    from fak.hub.pull import is_hf_uri

    if is_hf_uri(model):
        return GGUF_PATH.convert(model, None, None)
    path = Path(model).expanduser()
    if path.is_file():
        return path
    cached = MODELS_DIR / f"{model}.gguf"
    if cached.is_file():
        return cached
    raise click.BadParameter(f"no GGUF file at {path} and no cached model {cached}", param_hint="MODEL")


def _sampling_options(f: Any) -> Any:
    options = [
        click.option("--max-tokens", type=click.IntRange(min=1), default=512, show_default=True,
                     help="Most tokens to generate per reply."),
        click.option("--temperature", type=click.FloatRange(min=0), default=0.8, show_default=True,
                     help="Sampling temperature; 0 is greedy."),
        click.option("--top-k", type=click.IntRange(min=0), default=40, show_default=True, help="0 disables."),
        click.option("--top-p", type=float, default=0.95, show_default=True),
        click.option("--min-p", type=float, default=0.05, show_default=True),
        click.option("--repeat-penalty", type=float, default=1.0, show_default=True),
        click.option("--seed", type=int, default=None, help="RNG seed (same seed, same output)."),
        click.option("--stop", multiple=True, help="Stop string (repeatable)."),
        click.option("--backend", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True),
        click.option("--n-ctx", type=click.IntRange(min=16), default=4096, show_default=True,
                     help="Context window in tokens."),
        click.option("--threads", type=click.IntRange(min=1), default=None, help="CPU threads."),
    ]
    for option in reversed(options):
        f = option(f)
    return rope_click_options(f)


def _sampling(kw: dict[str, Any]) -> dict[str, Any]:
    return {
        "max_tokens": kw["max_tokens"], "temperature": kw["temperature"], "top_k": kw["top_k"],
        "top_p": kw["top_p"], "min_p": kw["min_p"], "repeat_penalty": kw["repeat_penalty"],
        "seed": kw["seed"], "stop": list(kw["stop"]) or None,
    }


def _open_engine(model: str, kw: dict[str, Any]) -> Any:
    from fak.engine import Engine

    return Engine(resolve_model(model), backend=kw["backend"], n_ctx=kw["n_ctx"], threads=kw["threads"],
                  **rope_kwargs(**kw))


def _speed_line(delta: Any) -> str:
    u, t = delta.usage, delta.timings
    return (f"prefill {u.prompt_tokens} tok {t.prefill_tok_s:.1f} tok/s · "
            f"decode {u.completion_tokens} tok {t.decode_tok_s:.1f} tok/s · "
            f"ttft {t.ttft_s:.2f} s · {delta.finish_reason}")


@click.command("generate")
@click.argument("model")
@click.argument("prompt")
@click.option("--chat", "as_chat", is_flag=True, help="Wrap PROMPT as a user message in the model's chat template.")
@click.option("--system", default=None, help="System message (with --chat).")
@_sampling_options
def generate(model: str, prompt: str, as_chat: bool, system: str | None, **kw: Any) -> None:
    """Stream a completion of PROMPT from MODEL (a GGUF path or a cached model name) to stdout."""
    from fak.errors import FakError

    from fak.progress import progress_bar

    try:
        with progress_bar(f"loading {model}", transient=True):  # load and kernel compile, on a terminal
            engine = _open_engine(model, kw)
    except (FakError, OSError) as e:
        raise click.ClickException(str(e)) from e
    with engine:
        try:
            if as_chat:
                messages = ([{"role": "system", "content": system}] if system else []) + [
                    {"role": "user", "content": prompt}]
                stream = engine.chat_stream(messages, **_sampling(kw))
            else:
                stream = engine.stream(prompt, **_sampling(kw))
            last = None
            with stream:
                tty = sys.stdout.isatty()  # a terminal: no escape sequence of the model's
                for delta in stream:
                    sys.stdout.write(printable(delta.text) if tty else delta.text)
                    sys.stdout.flush()
                    last = delta
        except (FakError, ValueError) as e:
            raise click.ClickException(str(e)) from e
        except KeyboardInterrupt:
            click.echo("\n[interrupted]", err=True)
            return
    sys.stdout.write("\n")
    if last is not None and last.usage is not None:
        click.echo(_speed_line(last), err=True)


@click.command("chat")
@click.argument("model")
@click.option("--system", default=None, help="System message.")
@_sampling_options
def chat(model: str, system: str | None, **kw: Any) -> None:
    """Chat with MODEL interactively. Type /reset to start over, /exit (or Ctrl-D) to quit;
    Ctrl-C stops the reply being written."""
    from rich.console import Console

    from fak.errors import FakError

    console = Console(highlight=False)
    try:
        with console.status(f"loading {model}"):
            engine = _open_engine(model, kw)
    except (FakError, OSError) as e:
        raise click.ClickException(str(e)) from e
    start = [{"role": "system", "content": system}] if system else []
    messages: list[dict[str, str]] = list(start)
    console.print(f"[bold]{engine.model_name}[/] on {engine.backend}, context {engine.n_ctx} tokens. "
                  "[dim]/reset to start over, /exit to quit[/]")
    with engine:
        while True:
            try:
                line = console.input("[bold green]> [/]")
            except (EOFError, KeyboardInterrupt):
                console.print()
                break
            command = line.strip()
            if command in ("/exit", "/quit"):
                break
            if command == "/reset":
                messages = list(start)
                console.print("[dim]conversation cleared[/]")
                continue
            if not command:
                continue
            messages.append({"role": "user", "content": line})
            reply: list[str] = []
            last = None
            try:
                with engine.chat_stream(messages, **_sampling(kw)) as stream:
                    for delta in stream:
                        console.print(printable(delta.text), end="", markup=False, soft_wrap=True)
                        reply.append(delta.text)
                        last = delta
            except KeyboardInterrupt:
                console.print("\n[dim]stopped[/]")
            except (FakError, ValueError) as e:
                messages.pop()
                console.print(f"[red]{e}[/] [dim](/reset clears the conversation)[/]")
                continue
            console.print()
            messages.append({"role": "assistant", "content": "".join(reply)})
            if last is not None and last.usage is not None:
                console.print(f"[dim]{_speed_line(last)}[/]")
