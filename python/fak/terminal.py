"""Text a model or a workspace wrote, made safe to show on a terminal or in a log line.

A file name, a tool name, an error that quotes a path or git's stderr can hold control
characters: ``ESC`` starts terminal escape sequences (colours, cursor moves, the window title,
OSC 52 clipboard writes, OSC 8 links), ``CR`` and backspace overwrite what was printed, bidi
controls reorder it (Trojan Source, CVE-2021-42574). Rich strips only ``BEL``, ``BS``, ``VT``,
``FF`` and ``CR`` and reads ``[...]`` as markup. ``printable`` replaces every C0/C1 control
character, ``DEL`` and the bidi and zero-width formatting characters by a visible escape
(``\\x1b``, ``\\u202e``), keeping newlines and tabs when asked; ``markup_safe`` also escapes
Rich markup, for text put into a markup string or a table cell.
"""

from __future__ import annotations

import re

from rich.markup import escape

#: C0 (but tab and newline, handled apart), DEL, C1, bidi embeddings/overrides/isolates and
#: marks, zero-width and other invisible formatting characters
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e"
                     "\u2060-\u2069\ufeff]")


def _escape_char(m: re.Match[str]) -> str:
    c = ord(m.group(0))
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def printable(text: object, *, newlines: bool = True) -> str:
    """``str(text)`` with every control and invisible formatting character replaced by its
    visible escape (``\\x1b``, ``\\u202e``); tabs kept; newlines kept when ``newlines``, else
    shown as ``\\n``. Linear in the length."""
    s = str(text)
    s = _UNSAFE.sub(_escape_char, s)
    if not newlines:
        s = s.replace("\n", "\\n").replace("\t", "\\t")
    return s


def markup_safe(text: object, *, newlines: bool = True) -> str:
    """``printable(text)`` with Rich markup escaped (``[bold]`` shows as written): for text
    placed into a Rich markup string or a table cell."""
    return escape(printable(text, newlines=newlines))
