"""Shell blocks of other agents' text protocols: mini-swe-agent 2.x's ```` ```mswea_bash_command ````
fences are found and adjudicated like ```` ```bash ```` ones, whole or split across any deltas.
Commands are data in ``tests/data/agent_fences.json``; to add a case, add an entry there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fak.toolcalls import BashBlockParser, Block, Text, bash_command, fence_language, shell_blocks

CASES = json.loads((Path(__file__).resolve().parents[1] / "data" / "agent_fences.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_fenced_blocks(case: dict) -> None:
    blocks = shell_blocks(case["text"])
    assert [bash_command(b.block) for b in blocks] == case["commands"]
    assert [fence_language(b.block) for b in blocks] == case["languages"]
    for b in blocks:
        assert case["text"][b.start:b.end] == b.block.raw


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_split_anywhere(case: dict) -> None:
    text = case["text"]
    for size in (1, 2, 3, 5, 7, 11):
        parser = BashBlockParser()
        pieces = []
        for i in range(0, len(text), size):
            pieces += parser.feed(text[i:i + size])
        pieces += parser.finish()
        assert "".join(p.text if isinstance(p, Text) else p.raw for p in pieces) == text
        assert [bash_command(p) for p in pieces if isinstance(p, Block)] == case["commands"], size
