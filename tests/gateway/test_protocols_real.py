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


def _prompt_tokens(usage: Any) -> int:
    """Anthropic's prompt size: tokens computed plus tokens the prefix cache held."""
    return usage.input_tokens + (usage.cache_read_input_tokens or 0)


def test_messages_through_the_anthropic_sdk(served: str) -> None:
    client = anthropic.Anthropic(base_url=served, api_key="x", max_retries=0, timeout=300)
    hi = [{"role": "user", "content": "Name a prime number."}]
    r = client.messages.create(model="tiny", max_tokens=12, system="Be brief.", messages=hi)
    assert r.content and r.content[0].type == "text"
    assert r.stop_reason in ("end_turn", "max_tokens") and 1 <= r.usage.output_tokens <= 12
    assert client.messages.count_tokens(model="tiny", system="Be brief.", messages=hi).input_tokens == \
        _prompt_tokens(r.usage)
    with client.messages.stream(model="tiny", max_tokens=12, system="Be brief.", messages=hi) as stream:
        events = [e.type for e in stream]
        final = stream.get_final_message()
    assert events[0] == "message_start" and events[-1] == "message_stop" and "message_delta" in events
    assert _prompt_tokens(final.usage) == _prompt_tokens(r.usage)
    assert final.usage.cache_read_input_tokens  # the same prompt again: its full blocks were cached
    # a forced tool call names an offered tool; a fitting one is adjudicated by the policy
    names: set[str] = set()
    for seed in range(3):
        f = client.messages.create(model="tiny", max_tokens=24, tools=[BASH, READ], tool_choice={"type": "any"},
                                   messages=[{"role": "user", "content": "List the files."}],
                                   extra_body={"temperature": 1.0, "seed": seed})
        for b in f.content:
            if b.type == "tool_use":
                names.add(b.name)
            else:  # did not fit the schema: never the pre-fill, never a fragment
                assert not b.text.startswith("<tool_call>")
    assert names <= {"bash", "read"}
    # a tool round trip: the result is accepted and answered
    turns: list[dict[str, Any]] = [
        {"role": "user", "content": "List the files."},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "bash",
                                           "input": {"command": "ls"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.py\nb.py"}]}]
    r2 = client.messages.create(model="tiny", max_tokens=8, tools=[BASH], messages=turns)
    assert _prompt_tokens(r2.usage) > _prompt_tokens(r.usage)
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="claude-opus-4", max_tokens=8, messages=hi)


def test_responses_through_the_openai_sdk(served: str) -> None:
    import openai

    client = openai.OpenAI(base_url=served + "/v1", api_key="x", max_retries=0, timeout=300)
    r = client.responses.create(model="tiny", input="Name a prime number.", instructions="Be brief.",
                                max_output_tokens=12, temperature=0)
    assert r.status in ("completed", "incomplete") and r.output[0].type == "message"
    assert 1 <= r.usage.output_tokens <= 12
    events = list(client.responses.create(model="tiny", input="Name a prime number.", instructions="Be brief.",
                                          max_output_tokens=12, temperature=0, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[-1].type in ("response.completed", "response.incomplete")
    final = events[-1].response
    assert final.output_text == r.output_text and final.usage.input_tokens == r.usage.input_tokens
    # a forced call of Codex's shell tool names it; the answer goes back by previous_response_id
    shell = {"type": "function", "name": "shell", "parameters": {"type": "object", "properties": {
        "command": {"type": "array", "items": {"type": "string"}}}, "required": ["command"]}}
    f = client.responses.create(model="tiny", input="List the files.", tools=[shell], tool_choice="required",
                                max_output_tokens=32)
    calls = [o for o in f.output if o.type == "function_call"]
    assert all(c.name == "shell" for c in calls)
    if calls:
        r2 = client.responses.create(model="tiny", previous_response_id=f.id, tools=[shell], max_output_tokens=8,
                                     input=[{"type": "function_call_output", "call_id": calls[0].call_id,
                                             "output": "a.py"}])
        assert r2.usage.input_tokens > f.usage.input_tokens
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model="tiny", input="hi", tools=[{"type": "web_search"}])
