"""Progress bars for fak's long steps: a model download (`fak pull`), model load and kernel
compile, mirror and task-env builds, grading.

One rule for all of them: a rich progress bar on standard error with the amount done (bytes or
items), the rate and an ETA, shown only when standard error is a terminal and the command was not
given ``--no-live``; otherwise nothing is drawn (logs and pipes stay clean) and the step's own
one-line messages are all that is printed.

    with progress_bar("download model.gguf", total=n_bytes, unit="bytes", live=live) as bar:
        for chunk in chunks:
            bar.advance(len(chunk))

``hf_tqdm(bar)`` hands such a bar to ``huggingface_hub`` (its ``tqdm_class`` argument).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal, TextIO

Unit = Literal["bytes", "items"]


def live_enabled(live: bool | None = None, stream: TextIO | None = None) -> bool:
    """Whether to draw progress: ``live`` when given (``--live`` / ``--no-live``), else whether
    ``stream`` (default standard error) is a terminal."""
    if live is not None:
        return live
    stream = stream if stream is not None else sys.stderr
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # closed or replaced stream
        return False


class Bar:
    """One task of a progress display, or a no-op stand-in when progress is not drawn.

    ``advance(n)`` adds ``n`` units done (bytes or items; negative to take some back, as a
    download that restarts from zero does); ``update(total=..., description=..., completed=...)``
    changes the task. Safe to call from any thread (rich's ``Progress`` locks)."""

    def __init__(self, progress: Any = None, task: Any = None) -> None:
        self._progress = progress
        self._task = task
        self.completed = 0.0

    @property
    def drawn(self) -> bool:
        """True when this bar is on a terminal (False for the no-op stand-in)."""
        return self._progress is not None

    def advance(self, n: float = 1) -> None:
        """Count ``n`` more units done."""
        self.completed += n
        if self._progress is not None:
            self._progress.advance(self._task, n)

    def update(self, *, total: float | None = None, description: str | None = None,
               completed: float | None = None) -> None:
        """Set the task's total, description or amount done (each only when given)."""
        if completed is not None:
            self.completed = completed
        if self._progress is not None:
            kw: dict[str, Any] = {}
            if total is not None:
                kw["total"] = total
            if description is not None:
                kw["description"] = description
            if completed is not None:
                kw["completed"] = completed
            self._progress.update(self._task, **kw)


def _columns(unit: Unit) -> list[Any]:
    from rich.progress import (BarColumn, DownloadColumn, MofNCompleteColumn, TaskProgressColumn,
                               TextColumn, TimeElapsedColumn, TimeRemainingColumn,
                               TransferSpeedColumn)

    cols: list[Any] = [TextColumn("[progress.description]{task.description}"), BarColumn()]
    if unit == "bytes":
        cols += [DownloadColumn(), TransferSpeedColumn()]
    else:
        cols += [MofNCompleteColumn(), TaskProgressColumn()]
    cols += [TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn()]
    return cols


@contextmanager
def progress_bar(description: str, total: float | None = None, *, unit: Unit = "items",
                 live: bool | None = None, transient: bool = False) -> Iterator[Bar]:
    """A progress bar for one long step, on standard error.

    Args:
        description: what is being done (``"download Qwen2.5…q4_k_m.gguf"``).
        total: units to do (bytes or items), or None while unknown (an indeterminate bar).
        unit: ``"bytes"`` (sizes and a transfer rate) or ``"items"`` (``done/total``).
        live: ``--live`` / ``--no-live``; None: draw only when standard error is a terminal.
        transient: remove the bar when the step ends instead of leaving its last state.

    Yields a ``Bar``; a no-op one when nothing is drawn."""
    if not live_enabled(live):
        yield Bar()
        return
    from rich.console import Console
    from rich.progress import Progress

    with Progress(*_columns(unit), console=Console(stderr=True), transient=transient) as prog:
        task = prog.add_task(description, total=total)
        yield Bar(prog, task)


def hf_tqdm(bar: Bar) -> type:
    """A ``tqdm``-like class for ``huggingface_hub``'s ``tqdm_class`` argument that feeds ``bar``.

    huggingface_hub creates it with ``total``, ``initial``, ``desc`` (and unit keywords), calls
    ``update(n)`` per chunk (negative when a server ignored a range request and the download
    starts over) and uses it as a context manager; every instance reports into the one ``bar``."""

    class _BarTqdm:
        def __init__(self, *args: Any, total: float | None = None, initial: float = 0,
                     **kwargs: Any) -> None:
            self.n = initial
            self.total = total
            if total is not None:
                bar.update(total=total, completed=initial)

        def update(self, n: float = 1) -> None:
            self.n += n
            bar.advance(n)

        def set_description(self, *args: Any, **kwargs: Any) -> None:
            pass

        def refresh(self, *args: Any, **kwargs: Any) -> None:
            pass

        def close(self) -> None:
            pass

        def __enter__(self) -> _BarTqdm:
            return self

        def __exit__(self, *exc: Any) -> None:
            self.close()

    return _BarTqdm
