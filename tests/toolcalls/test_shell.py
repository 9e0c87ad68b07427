"""Shell blocks of text-protocol agents (``X-Fak-Text-Tools: bash``), found as the agents find them.

Every case is fed whole, one character at a time, and split at every position. The key property:
every command that fak's text protocol or mini-swe-agent would run (their own regexes, below) lies
inside a block the gateway adjudicates, never in the text it passes through. To add a case, append
``(text, expected_block_inners)`` to ``CASES``.
"""

from __future__ import annotations

import re

import pytest
from fak.toolcalls.segmenter import Block, Text
from fak.toolcalls.shell import BashBlockParser

FAK_AGENT = re.compile(r"```(?:bash|sh|shell)[ \t]*\n(.*?)```", re.DOTALL)  # fak.agent.protocols.text
MINI_SWE_AGENT = re.compile(r"```bash\s*\n(.*?)\n```", re.DOTALL)  # mini-swe-agent's default action regex

CASES = [
    ("```bash\nls -la\n```", ["\nls -la\n"]),
    ("Run:\n```sh\nls\n```\nthen", ["\nls\n"]),
    ("```shell\npwd```", ["\npwd"]),
    ("```Bash\nls\n```", ["\nls\n"]),
    ("```ZSH\nls\n```", ["\nls\n"]),
    ("``` bash\nls\n```", ["\nls\n"]),
    ("```bash   \nls\n```", ["   \nls\n"]),
    ("````bash\nls\n```", ["\nls\n"]),
    ("```bash ls```", [" ls"]),
    # an opening fence inside another fenced block still counts (the agents' regexes find it)
    ("```python\nx = '```bash\nrm -rf /\n```'\n```", ["\nrm -rf /\n"]),
    ("```\n```bash\nsudo reboot\n```\n```", ["\nsudo reboot\n"]),
    ("```bash\nls\n```\n```sh\nrm -rf /\n```", ["\nls\n", "\nrm -rf /\n"]),
    # unclosed blocks are blocks
    ("Here:\n```bash\nsudo reboot", ["\nsudo reboot"]),
    ("```sh", [""]),
    # not shell fences
    ("```bashful\nx\n```", []),
    ("```python\nprint(1)\n```", []),
    ("```shx\nls\n```", []),
    ("use `ls` and ``", []),
    ("plain text", []),
]


def _splits(text: str) -> list[list[str]]:
    return [[text], list(text)] + [[text[:i], text[i:]] for i in range(1, len(text))]


@pytest.mark.parametrize("text,inners", CASES)
def test_blocks_any_split(text: str, inners: list[str]) -> None:
    for parts in _splits(text):
        parser = BashBlockParser()
        pieces: list[Text | Block] = []
        for part in parts:
            pieces += parser.feed(part)
        pieces += parser.finish()
        assert [p.inner for p in pieces if isinstance(p, Block)] == inners, parts
        assert "".join(p.text if isinstance(p, Text) else p.raw for p in pieces) == text, parts
        passed = "".join(p.text if isinstance(p, Text) else "\0" for p in pieces)
        for regex in (FAK_AGENT, MINI_SWE_AGENT):
            for command in regex.findall(text):
                if command.strip():
                    assert command.strip() not in passed, (regex.pattern, command, parts)


def test_plain_text_streams_without_delay() -> None:
    parser = BashBlockParser()
    assert parser.feed("Hello ") == [Text("Hello ")]
    assert parser.feed("wor") == [Text("wor")]
    assert parser.feed("ld `") == [Text("ld ")]  # a backtick may start a fence: held
    assert parser.feed("x`") == [Text("`x")]
    assert parser.feed("``pyth") == [Text("```pyth")]  # no shell name starts with "pyth"
    assert parser.feed("on\n```") == [Text("on\n")]
    assert parser.finish() == [Text("```")]
