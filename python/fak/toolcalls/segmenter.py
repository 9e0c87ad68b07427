"""Split streamed text into plain text and marker-delimited blocks, one delta at a time.

``BlockSegmenter("<tool_call>", "</tool_call>")`` turns a stream of text deltas into
``Text`` pieces and ``Block`` pieces (the text between the markers). Text that could be the start
of an opening marker is held back until the next delta decides it, so a marker split across deltas
(``"<tool_"`` + ``"call>"``) is still found and never leaks to the client as text. Used for
Qwen2.5 tool calls and for fenced ```bash blocks of text-protocol agents.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Block", "BlockSegmenter", "Text"]


@dataclass(frozen=True, slots=True)
class Text:
    """Plain text outside any block."""

    text: str


@dataclass(frozen=True, slots=True)
class Block:
    """The text between an opening and a closing marker.

    ``closed`` is ``False`` for a block still open when the stream ended. ``raw`` is the block as
    it appeared, markers included (what a client would see if the block were passed as text).
    """

    inner: str
    raw: str
    closed: bool


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``marker``."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0


class BlockSegmenter:
    """Incremental splitter of text into ``Text`` and ``Block`` pieces.

    Args:
        open_marker: the string that opens a block (e.g. ``"<tool_call>"``).
        close_marker: the string that closes it (e.g. ``"</tool_call>"``).

    ``feed(delta)`` returns the pieces completed by ``delta`` (possibly none: text may be held
    back); ``finish()`` returns the rest, with an unterminated block as ``Block(closed=False)``.
    Concatenating every piece's text (``Text.text``, ``Block.raw``) gives back the input exactly.
    """

    def __init__(self, open_marker: str, close_marker: str) -> None:
        if not open_marker or not close_marker:
            raise ValueError("markers must be non-empty")
        self.open_marker = open_marker
        self.close_marker = close_marker
        self._buf = ""
        self._in_block = False
        self._scan_from = 0  # where the next close-marker search in the block buffer starts

    @property
    def in_block(self) -> bool:
        """Whether an opening marker has been seen and its closing marker not yet."""
        return self._in_block

    @property
    def held(self) -> str:
        """The text held back: inside an open block, the block's inner text so far."""
        return self._buf

    def feed(self, delta: str) -> list[Text | Block]:
        """Consume ``delta``; return the pieces it completes, in order."""
        if not delta:
            return []
        self._buf += delta
        out: list[Text | Block] = []
        while True:
            if self._in_block:
                end = self._buf.find(self.close_marker, self._scan_from)
                if end < 0:
                    self._scan_from = max(0, len(self._buf) - len(self.close_marker) + 1)
                    return out
                inner = self._buf[:end]
                self._buf = self._buf[end + len(self.close_marker):]
                out.append(Block(inner, self.open_marker + inner + self.close_marker, True))
                self._in_block = False
                self._scan_from = 0
            else:
                start = self._buf.find(self.open_marker)
                if start < 0:
                    keep = _partial_suffix(self._buf, self.open_marker)
                    emit = self._buf[: len(self._buf) - keep]
                    self._buf = self._buf[len(self._buf) - keep:]
                    if emit:
                        out.append(Text(emit))
                    return out
                if start:
                    out.append(Text(self._buf[:start]))
                self._buf = self._buf[start + len(self.open_marker):]
                self._in_block = True
                self._scan_from = 0

    def finish(self) -> list[Text | Block]:
        """End of stream: return what is held back (an open block as ``closed=False``)."""
        buf, self._buf = self._buf, ""
        if self._in_block:
            self._in_block = False
            return [Block(buf, self.open_marker + buf, False)]
        return [Text(buf)] if buf else []
