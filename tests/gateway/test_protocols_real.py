"""Every protocol of ``fak serve`` through its official SDK, against a real ``fak serve`` process over
the tiny synthetic Qwen2 model (``fak synth --tiny qwen2``: random weights, the real tokenizer and
chat template), with the coding-agent policy on.

Random weights write arbitrary text, so the checks are about the protocol, not the words: the
shapes the SDKs parse, the stream event sequences, usage equal to the engine's token counts, a
forced tool call naming an offered tool (the engine's ``prefix_choices`` hold it there), a tool
round trip accepted, errors with their status and shape. To add a case, use ``served`` (the base
URL of the module's server).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest
from fak_subprocess import fak_process

REPO = Path(__file__).resolve().parents[2]
POLICY = REPO / "examples" / "swebench-coding-agent-policy.json"
BASH = {"name": "bash", "description": "Run a shell command.",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}
READ = {"name": "read", "description": "Read a file.",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    pytest.importorskip("fak.engine", reason="fak.Engine is not in this checkout")
    synth = pytest.importorskip("fak.synth", reason="fak.synth is not in this checkout")
    tmp = tmp_path_factory.mktemp("protocols")
    path = tmp / "tiny.gguf"
    synth.write_tiny_model(path)
    with fak_process("serve", "--gguf", str(path), "--backend", "cpu", "--n-ctx", "1024", "--model-name", "tiny",
                     "--policy", str(POLICY), "--audit-log", str(tmp / "audit.jsonl"), timeout=180) as url:
        yield url


def test_messages_through_the_anthropic_sdk(served: str) -> None:
    client = anthropic.Anthropic(base_url=served, api_key="x", max_retries=0, timeout=300)
    hi = [{"role": "user", "content": "Name a prime number."}]
    r = client.messages.create(model="tiny", max_tokens=12, system="Be brief.", messages=hi)
    assert r.content and r.content[0].type == "text"
    assert r.stop_reason in ("end_turn", "max_tokens") and 1 <= r.usage.output_tokens <= 12
    assert client.messages.count_tokens(model="tiny", system="Be brief.", messages=hi).input_tokens == \
        r.usage.input_tokens
    with client.messages.stream(model="tiny", max_tokens=12, system="Be brief.", messages=hi) as stream:
        events = [e.type for e in stream]
        final = stream.get_final_message()
    assert events[0] == "message_start" and events[-1] == "message_stop" and "message_delta" in events
    assert final.usage.input_tokens == r.usage.input_tokens
    # a forced tool call names an offered tool; a fitting one is adjudicated by the policy
    names: set[str] = set()
    for seed in range(3):
        f = client.messages.create(model="tiny", max_tokens=24, tools=[BASH, READ], tool_choice={"type": "any"},
                                   messages=[{"role": "user", "content": "List the files."}],
                                   extra_body={"temperature": 1.0, "seed": seed})
        for b in f.content:
            if b.type == "tool_use":
                names.add(b.name)
            else:  # did not fit the schema: the model's own text, never the pre-fill
                assert not b.text.startswith("<tool_call>")
    assert names <= {"bash", "read"}
    # a tool round trip: the result is accepted and answered
    turns: list[dict[str, Any]] = [
        {"role": "user", "content": "List the files."},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "bash",
                                           "input": {"command": "ls"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.py\nb.py"}]}]
    r2 = client.messages.create(model="tiny", max_tokens=8, tools=[BASH], messages=turns)
    assert r2.usage.input_tokens > r.usage.input_tokens
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="claude-opus-4", max_tokens=8, messages=hi)
