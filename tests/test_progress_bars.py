"""fak.progress: bars only on a terminal and never under --no-live; huggingface_hub's tqdm calls
land in the one bar (including the negative update of a download that restarts)."""

from __future__ import annotations

import io

from fak.progress import Bar, hf_tqdm, live_enabled, progress_bar


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_live_enabled() -> None:
    assert live_enabled(True, io.StringIO()) and not live_enabled(False, _Tty())
    assert live_enabled(None, _Tty()) and not live_enabled(None, io.StringIO())


def test_quiet_bar_counts_and_draws_nothing(capsys) -> None:
    with progress_bar("x", total=10, live=False) as bar:
        assert not bar.drawn
        bar.advance(3)
        bar.update(completed=7, description="y")
    assert bar.completed == 7
    assert capsys.readouterr() == ("", "")


def test_hf_tqdm_feeds_the_bar() -> None:
    bar = Bar()
    cls = hf_tqdm(bar)
    with cls(total=100, initial=10, desc="f", unit="B", unit_scale=True) as t:
        t.update(50)
        t.update(-60)  # the server ignored a range request: the download starts over
        t.update(100)
    assert bar.completed == 100 and t.n == 100


def test_drawn_bar_on_forced_live(capsys) -> None:
    with progress_bar("download", total=4, unit="bytes", live=True) as bar:
        assert bar.drawn
        bar.advance(4)
    assert "download" in capsys.readouterr().err
