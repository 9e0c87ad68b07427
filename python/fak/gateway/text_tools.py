"""Tool calls of text-protocol agents: fenced ```bash blocks in assistant content.

Agents such as mini-swe-agent do not use OpenAI tool calls: they ask the model for exactly one
fenced block (```` ```bash\\n<command>\\n``` ````) and run it. When a request carries
``X-Fak-Text-Tools: bash``, the gateway treats each such block as a call of the tool ``bash`` with
arguments ``{"command": <block text>}`` and adjudicates it like any other tool call.

The opening fence is matched exactly (```` ```bash ````); a block still open at the end of the
generation is adjudicated too, so a missing closing fence cannot smuggle a command past the policy.
"""

from __future__ import annotations

from fak.gateway.errors import bad_request
from fak.gateway.segmenter import Block, BlockSegmenter, Text

__all__ = ["BASH_FENCE_OPEN", "FENCE_CLOSE", "TEXT_TOOLS_HEADER", "BashBlockParser",
           "bash_command", "parse_text_tools_header"]

BASH_FENCE_OPEN = "```bash"
FENCE_CLOSE = "```"
TEXT_TOOLS_HEADER = "x-fak-text-tools"
SUPPORTED_TEXT_TOOLS = frozenset({"bash"})


def parse_text_tools_header(value: str | None) -> frozenset[str]:
    """The tools named by ``X-Fak-Text-Tools`` (comma-separated; only ``bash`` exists).

    Raises:
        APIError: 400 for an unknown tool name.
    """
    if value is None:
        return frozenset()
    names = frozenset(part.strip().lower() for part in value.split(",") if part.strip())
    unknown = names - SUPPORTED_TEXT_TOOLS
    if unknown:
        raise bad_request(f"X-Fak-Text-Tools names unknown text tool(s) {sorted(unknown)}; "
                          f"supported: {sorted(SUPPORTED_TEXT_TOOLS)}", param="X-Fak-Text-Tools")
    return names


def bash_command(block: Block) -> str:
    """The command inside a ```bash block: the text between the fences, stripped."""
    return block.inner.strip()


class BashBlockParser:
    """Streaming splitter of assistant content into ``Text`` and ```bash ``Block`` pieces."""

    def __init__(self) -> None:
        self._seg = BlockSegmenter(BASH_FENCE_OPEN, FENCE_CLOSE)

    def feed(self, delta: str) -> list[Text | Block]:
        """Consume a content delta; return the pieces it completes."""
        return self._seg.feed(delta)

    def finish(self) -> list[Text | Block]:
        """End of the content: what is held back, an unclosed block as ``Block(closed=False)``."""
        return self._seg.finish()
