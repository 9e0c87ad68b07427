"""`fak pull`: a GGUF model from the Hugging Face hub into the model cache; `fak pull --list`;
and ``GGUF_PATH``, the click type of every option that takes a model file (a path, or a ``hf://``
reference pulled on first use)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import click

from fak.hub.pull import (SUPPORTED_ARCHITECTURES, PullError, cached_model_dict, is_hf_uri,
                          list_cached, models_dir, pull)


class GGUFPathType(click.ParamType):
    """A GGUF model for a command-line option: an existing file, or ``hf://ORG/NAME/FILE.gguf`` /
    ``hf://ORG/NAME:QUANT`` (pulled into ``$FAK_MODELS`` on first use, from the cache after).
    Converts to a ``Path``; a missing file or a failed pull is a usage error naming both."""

    name = "gguf"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Path:
        text = str(value)
        if is_hf_uri(text):
            try:
                return pull(text, echo=lambda m: click.echo(m, err=True))
            except (PullError, ValueError) as exc:
                self.fail(str(exc), param, ctx)
        path = Path(text).expanduser()
        if not path.is_file():
            self.fail(f"no file {text!r} (a GGUF path, or a hub model: hf://ORG/NAME/FILE.gguf, "
                      "hf://ORG/NAME:Q4_K_M)", param, ctx)
        return path


GGUF_PATH = GGUFPathType()


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1000
    return f"{n} B"


@click.command("pull")
@click.argument("repo", required=False)
@click.argument("file_or_quant", required=False)
@click.option("--revision", default=None, help="Branch, tag or commit [default: main].")
@click.option("--dir", "root", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Model cache [default: $FAK_MODELS, else ~/.cache/fak/models].")
@click.option("--refresh", is_flag=True, help="Ask the hub even when a verified copy is cached.")
@click.option("--list", "list_", is_flag=True, help="List the cached models (size, architecture).")
@click.option("--json", "as_json", is_flag=True, help="With --list: JSON lines.")
@click.option("--live/--no-live", default=None, help="Progress bars [default: on a terminal].")
def pull_command(repo: str | None, file_or_quant: str | None, revision: str | None,
                 root: Path | None, refresh: bool, list_: bool, as_json: bool,
                 live: bool | None) -> None:
    """Download a GGUF model from the Hugging Face hub into the model cache and print its path.

    REPO is ORG/NAME (or hf://ORG/NAME/FILE.gguf, hf://ORG/NAME:Q4_K_M); FILE_OR_QUANT picks a
    file of the repository or a quantization (Q4_K_M, Q8_0, ...); without it the repository's
    only GGUF, or its Q4_K_M. Split files (-00001-of-0000N.gguf) are joined into one. HF_TOKEN
    (gated and private repositories) and HF_ENDPOINT (a mirror) are honoured; a cut download
    resumes; the file is checked against the hub's sha256. Models of an architecture fak does not
    run are refused before the download.

    \b
      fak pull Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF Q4_K_M
      fak serve --gguf hf://Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF:Q4_K_M
      fak pull --list
    """
    if list_:
        _list(root, as_json)
        return
    if repo is None:
        raise click.UsageError("name a repository (fak pull ORG/NAME [FILE|QUANT]) or use --list")
    try:
        path = pull(repo, file_or_quant, revision=revision, root=root, refresh=refresh, live=live,
                    echo=lambda m: click.echo(m, err=True))
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="REPO") from exc
    except (PullError, OSError) as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(str(path))


def _list(root: Path | None, as_json: bool) -> None:
    models = list_cached(root)
    if as_json:
        for m in models:
            click.echo(json.dumps(cached_model_dict(m)))
        return
    base = models_dir(root)
    if not models:
        click.echo(f"no GGUF models in {base} (fak pull ORG/NAME to get one)", err=True)
        return
    from rich.console import Console
    from rich.table import Table

    from fak.terminal import markup_safe

    table = Table(title=f"models in {base}", title_justify="left")
    table.add_column("model")
    table.add_column("size", justify="right")
    table.add_column("architecture")
    table.add_column("fak runs it")
    for m in models:
        table.add_row(markup_safe(m.name), _human(m.size), markup_safe(m.architecture or "unreadable"),
                      "yes" if m.runs else f"no (fak runs {', '.join(SUPPORTED_ARCHITECTURES)})")
    Console(width=max(100, _columns())).print(table)


def _columns() -> int:
    try:
        return os.get_terminal_size().columns
    except OSError:
        return 120
