"""``fak.terminal``: model- and workspace-written text shown on a terminal or in a log line
(docs/sandbox.md, audit): control characters, bidi controls and Rich markup come out visible,
never interpreted."""

from __future__ import annotations

import io

from rich.console import Console
from rich.table import Table

from fak.terminal import markup_safe, printable

#: what a file name, a tool name or an error quoting one may hold (data, never printed raw)
HOSTILE = ["evil\x1b]52;c;cm0gLXJmIH4=\x07.py", "a\rb", "x\x08y", "\x1b[2J\x1b[Hcleared",
           "safe\u202egnp.exe", "zero\u200bwidth", "nul\x00byte", "del\x7f", "c1\x9bm",
           "[bold red]fake[/]", "line\u2028sep"]


def test_printable_leaves_no_control_character():
    for text in HOSTILE:
        out = printable(text, newlines=False)
        assert all(c.isprintable() for c in out), (text, out)
    assert printable("a\tb\nc") == "a\tb\nc"
    assert printable("a\tb\nc", newlines=False) == "a\\tb\\nc"
    assert printable("\x1b[31m") == "\\x1b[31m"
    assert printable("x\u202ey") == "x\\u202ey"
    assert printable("ünïcödé ✓") == "ünïcödé ✓"


def test_markup_safe_in_a_rich_table_and_line():
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, color_system=None, width=200)
    t = Table()
    t.add_column("last tool")
    for text in HOSTILE:
        t.add_row(markup_safe(text, newlines=False))
    console.print(t)
    console.print(f"instance: {markup_safe(HOSTILE[0])}")
    out = buf.getvalue()
    assert "\x1b]52" not in out and "\x07" not in out and "\u202e" not in out
    assert "[bold red]fake[/]" in out  # shown as written, not applied
    assert "\\x1b]52;c;" in out
