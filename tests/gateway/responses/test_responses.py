"""``POST /v1/responses`` (OpenAI Responses) through the official ``openai`` SDK against a real HTTP
server over the fake engine (``gateway_fakes.FakeEngine``).

Covered: text answers with ``instructions``, a function-call round trip by items and by
``previous_response_id`` (``store``, retrieve, delete, bounds), the stream's event types and
sequence numbers, Codex's tool types (``custom`` freeform, ``shell``, ``local_shell``,
``apply_patch``) mapped onto functions and back onto their items, hosted tools refused with a 400
naming the type, unknown fields ignored, ``max_output_tokens`` and ``incomplete``, the policy.
To add a case: ask for ``client`` (the SDK over the module's server) or start a gateway with
``start_gateway``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from fak.gateway import BackgroundServer, GatewayConfig, create_app
from fak.gateway.responses.store import ResponseStore
from gateway_fakes import SCRIPT, FakeEngine, FakePolicy

MODEL = "fake-qwen"
WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather of a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
APPLY_PATCH = {"type": "custom", "name": "apply_patch", "description": "Edit files with a patch.",
               "format": {"type": "grammar", "syntax": "lark", "definition": "start: /(.|\\n)+/"}}
CODEX_SCRIPT = [
    ("run the listing", '<tool_call>\n{"name": "shell", "arguments": {"commands": ["ls -la"]}}\n</tool_call>'),
    ("argv listing", '<tool_call>\n{"name": "local_shell", "arguments": {"command": ["bash", "-lc", "ls"]}}\n'
                     '</tool_call>'),
    ("wipe it", '<tool_call>\n{"name": "shell", "arguments": {"commands": ["sudo rm -rf /"]}}\n</tool_call>'),
    ("new file", '<tool_call>\n{"name": "apply_patch", "arguments": {"type": "create_file", "path": "a.py", '
                 '"diff": "+print(1)\\n"}}\n</tool_call>'),
]


@pytest.fixture(scope="module")
def engine() -> FakeEngine:
    return FakeEngine(script=list(SCRIPT) + CODEX_SCRIPT)


@pytest.fixture(scope="module")
def server(engine: FakeEngine) -> Iterator[BackgroundServer]:
    with BackgroundServer(create_app(GatewayConfig(), engine=engine)) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: BackgroundServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)


def last_prompt(engine: FakeEngine) -> str:
    return engine.detokenize(engine.requests[-1][0])


def test_text_answer(client: openai.OpenAI, engine: FakeEngine) -> None:
    r = client.responses.create(model=MODEL, input="Say something.", instructions="Be brief.")
    assert r.object == "response" and r.status == "completed" and r.id.startswith("resp_")
    assert r.output_text and [o.type for o in r.output] == ["message"]
    assert last_prompt(engine).startswith("<|im_start|>system\nBe brief.<|im_end|>")
    assert r.usage is not None and r.usage.input_tokens == len(engine.requests[-1][0])
    assert r.usage.output_tokens == len(r.output_text) and r.usage.total_tokens == r.usage.input_tokens + len(
        r.output_text)


def test_function_call_round_trip_by_items(client: openai.OpenAI, engine: FakeEngine) -> None:
    items: list[Any] = [{"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]}]
    r = client.responses.create(model=MODEL, input=items, tools=[WEATHER], store=False)
    (call,) = r.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Paris"} and call.call_id and call.id.startswith("fc_")
    items += [{"type": "reasoning", "id": "rs_1", "summary": []}, call.model_dump(exclude_none=True),
              {"type": "function_call_output", "call_id": call.call_id, "output": "18 C, clear"}]
    r2 = client.responses.create(model=MODEL, input=items, tools=[WEATHER], store=False)
    assert r2.output_text == "It is sunny in Paris."
    assert "<tool_response>\n18 C, clear\n</tool_response>" in last_prompt(engine)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r2.id)  # store=False


def test_previous_response_id(client: openai.OpenAI, engine: FakeEngine) -> None:
    r = client.responses.create(model=MODEL, input="Weather in Paris?", tools=[WEATHER], instructions="Old.")
    call = r.output[0]
    assert client.responses.retrieve(r.id).output[0].call_id == call.call_id
    r2 = client.responses.create(model=MODEL, previous_response_id=r.id, tools=[WEATHER], instructions="New.",
                                 input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sun"}])
    assert r2.output_text == "It is sunny in Paris." and r2.previous_response_id == r.id
    prompt = last_prompt(engine)
    assert "New." in prompt and "Old." not in prompt  # instructions are not carried over
    assert "Weather in Paris?" in prompt and '"name": "get_weather"' in prompt
    r3 = client.responses.create(model=MODEL, previous_response_id=r2.id, input="And tomorrow?")
    assert "It is sunny in Paris.<|im_end|>\n<|im_start|>user\nAnd tomorrow?" in last_prompt(engine)
    assert r3.status == "completed"
    client.responses.delete(r.id)
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model=MODEL, previous_response_id=r.id, input="again")
    assert err.value.code == "previous_response_not_found" and err.value.param == "previous_response_id"


def test_store_is_bounded() -> None:
    store = ResponseStore(max_items=2, max_bytes=100, ttl_s=0.2)
    store.put("a", [], {}, 10)
    store.put("b", [], {}, 10)
    store.put("c", [], {}, 10)
    assert store.get("a") is None and store.get("c") is not None
    store.put("d", [], {}, 95)
    assert store.get("b") is None and store.get("c") is None and store.get("d") is not None
    store.put("huge", [], {}, 101)
    assert store.get("huge") is None
    time.sleep(0.3)
    assert store.get("d") is None and len(store) == 0


def test_stream_events(client: openai.OpenAI) -> None:
    events = list(client.responses.create(model=MODEL, input="two calls", tools=[WEATHER], stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    n_text = kinds.count("response.output_text.delta")
    assert kinds[4:4 + n_text] == ["response.output_text.delta"] * n_text
    call = ["response.output_item.added", "response.function_call_arguments.delta",
            "response.function_call_arguments.done", "response.output_item.done"]
    assert kinds[4 + n_text:] == ["response.output_text.done", "response.content_part.done",
                                  "response.output_item.done"] + call * 2 + ["response.completed"]
    final = events[-1].response
    assert [o.type for o in final.output] == ["message", "function_call", "function_call"]
    assert final.output_text == "Let me check both."
    assert [json.loads(o.arguments) for o in final.output[1:]] == [{"city": "Paris"}, {"city": "Rome"}]
    # the SDK's stream helper accumulates the same response
    with client.responses.stream(model=MODEL, input="two calls", tools=[WEATHER]) as stream:
        for _ in stream:
            pass
        helper = stream.get_final_response()
    assert [o.type for o in helper.output] == ["message", "function_call", "function_call"]


def test_codex_tool_types(client: openai.OpenAI, engine: FakeEngine) -> None:
    tools: list[Any] = [{"type": "shell"}, {"type": "local_shell"}, {"type": "apply_patch"}, APPLY_PATCH]
    with pytest.raises(openai.BadRequestError):  # apply_patch offered twice under one name
        client.responses.create(model=MODEL, input="hi", tools=tools)
    tools = tools[:3]
    r = client.responses.create(model=MODEL, input="run the listing", tools=tools)
    (item,) = r.output
    assert item.type == "shell_call" and item.action.commands == ["ls -la"] and item.call_id
    r = client.responses.create(model=MODEL, input="argv listing", tools=tools)
    assert r.output[0].type == "local_shell_call" and r.output[0].action.command == ["bash", "-lc", "ls"]
    r = client.responses.create(model=MODEL, input="new file", tools=tools)
    op = r.output[0]
    assert op.type == "apply_patch_call" and (op.operation.type, op.operation.path) == ("create_file", "a.py")
    # Codex's freeform apply_patch: a custom tool, offered as a function of one string
    r = client.responses.create(model=MODEL, input="patch it", tools=[APPLY_PATCH],
                                tool_choice={"type": "custom", "name": "apply_patch"})
    (custom,) = r.output
    assert custom.type == "custom_tool_call" and custom.name == "apply_patch" and custom.input == "forced"
    assert "grammar" in last_prompt(engine)  # the grammar is in the tool's description
    # the calls come back as history items and reach the template as calls and results
    history: list[Any] = [{"role": "user", "content": "new file"}, op.model_dump(exclude_none=True),
                          {"type": "apply_patch_call_output", "call_id": op.call_id, "output": "Done"},
                          custom.model_dump(exclude_none=True),
                          {"type": "custom_tool_call_output", "call_id": custom.call_id, "output": "ok"},
                          {"type": "shell_call", "call_id": "sh1", "action": {"commands": ["ls"]}, "status":
                           "completed"},
                          {"type": "shell_call_output", "call_id": "sh1",
                           "output": [{"stdout": "a.py\n", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}]}]
    client.responses.create(model=MODEL, input=history, tools=tools + [], store=False)
    prompt = last_prompt(engine)
    assert '"name": "apply_patch", "arguments": {"diff": "+print(1)\\n", "path": "a.py", "type": "create_file"}' in prompt
    assert '"name": "apply_patch", "arguments": {"input": "forced"}' in prompt
    assert "<tool_response>\na.py\n\n</tool_response>" in prompt


def test_refusals(server: BackgroundServer, client: openai.OpenAI) -> None:
    import httpx

    cases: list[tuple[dict[str, Any], str, str | None]] = [
        ({"tools": [{"type": "web_search"}]}, "tools[0].type", "unsupported_tool_type"),
        ({"tools": [WEATHER, {"type": "code_interpreter", "container": {"type": "auto"}}]}, "tools[1].type",
         "unsupported_tool_type"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}]},
         "input[0].content[0].type", "unsupported_content"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type", "unsupported_value"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice", None),
        ({"background": True}, "background", "unsupported_value"),
        ({"max_output_tokens": 0}, "max_output_tokens", None),
    ]
    for extra, param, code in cases:
        body = {"model": MODEL, "input": "hi", **extra}
        r = httpx.post(server.base_url + "/responses", json=body)
        assert r.status_code == 400, (extra, r.text)
        err = r.json()["error"]
        assert err["param"] == param and err["code"] == code, (extra, err)
    r = httpx.post(server.base_url + "/responses", json={"model": "gpt-5-codex", "input": "hi"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_unknown_fields_and_codex_shape(client: openai.OpenAI) -> None:
    r = client.responses.create(model=MODEL, input=[{"type": "message", "role": "developer", "content": "Be terse."},
                                                    {"type": "message", "role": "user", "content": "hi"}],
                                reasoning={"effort": "medium", "summary": "auto"}, store=False, parallel_tool_calls=False,
                                include=["reasoning.encrypted_content"], prompt_cache_key="session-1",
                                text={"verbosity": "low"}, tools=[WEATHER], tool_choice="auto",
                                extra_body={"client_metadata": {"x": 1}, "reasoning_effort": "high"})
    assert r.status == "completed" and r.parallel_tool_calls is False


def test_budget_and_incomplete(start_gateway: Any) -> None:
    engine = FakeEngine(script=list(SCRIPT), n_ctx=300)
    c = openai.OpenAI(base_url=start_gateway(engine=engine).base_url, api_key="x", max_retries=0)
    r = c.responses.create(model=MODEL, input="hi", max_output_tokens=16)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 16
    # a budget past the window is a ceiling (Codex sends its model's largest)
    r = c.responses.create(model=MODEL, input="hi", max_output_tokens=128_000)
    assert r.status == "completed"


def test_policy_on_responses(start_gateway: Any, engine: FakeEngine) -> None:
    srv = start_gateway(engine=engine, policy=FakePolicy(deny_tools=("shell",)))
    c = openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0)
    r = c.responses.create(model=MODEL, input="wipe it", tools=[{"type": "shell"}])
    assert [o.type for o in r.output] == ["message"]
    assert "[fak policy] Tool call `shell` was denied" in r.output_text
    verdicts = r.model_extra["fak_policy"]["verdicts"]  # type: ignore[index]
    assert [(v["tool"], v["allowed"]) for v in verdicts] == [("shell", False)]
    events = list(c.responses.create(model=MODEL, input="wipe it", tools=[{"type": "shell"}], stream=True))
    final = events[-1].response
    assert final.output_text.startswith("[fak policy]") and not any(o.type == "shell_call" for o in final.output)


@pytest.mark.parametrize("stream", [False, True])
def test_a_forced_call_that_fails_is_never_a_fragment(start_gateway: Any, stream: bool) -> None:
    """tool_choice required, and a model that names a tool that was not offered: no call item,
    no message holding a fragment of the call, and fak.tool_call_error saying why."""
    srv = start_gateway(engine=FakeEngine(honor_choices=False), tool_call_retries=0)
    client = openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0)
    kwargs: dict[str, Any] = dict(model=MODEL, input="Write a haiku about autumn.", tools=[WEATHER],
                                  tool_choice="required")
    if stream:
        events = list(client.responses.create(stream=True, **kwargs))
        assert [e.type for e in events] == ["response.created", "response.in_progress", "response.completed"]
        final = events[-1].response
    else:
        final = client.responses.create(**kwargs)
    assert final.output == [] and final.status == "completed"
    assert final.model_extra["fak"]["tool_call_error"]["kind"] == "unknown_tool"


def test_namespace_tools_are_offered_by_their_functions(start_gateway: Any) -> None:
    """Codex 0.147 sends its sub-agent functions inside a ``namespace`` tool: each inner function is
    offered by its own name, and its call comes back as a function_call carrying the namespace."""
    eng = FakeEngine(script=[("spawn", '<tool_call>\n{"name": "spawn_agent", "arguments": {"message": "go"}}\n'
                                       "</tool_call>")])
    srv = start_gateway(engine=eng)
    space = {"type": "namespace", "name": "multi_agent_v1", "description": "Sub-agents.", "tools": [
        {"type": "function", "name": "spawn_agent", "description": "Start an agent.",
         "parameters": {"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]}}]}
    client = openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0)
    r = client.responses.create(model=MODEL, input="spawn one", tools=[space])
    assert [(o.type, o.name) for o in r.output] == [("function_call", "spawn_agent")]
    assert r.output[0].model_extra.get("namespace") == "multi_agent_v1" or getattr(r.output[0], "namespace", None)
    assert '"name": "spawn_agent"' in eng.detokenize(eng.requests[-1][0])
    bad = {"type": "namespace", "name": "x", "tools": [{"type": "web_search"}]}
    with pytest.raises(openai.BadRequestError, match="function and custom tools only") as err:
        client.responses.create(model=MODEL, input="spawn one", tools=[bad])
    assert err.value.body["param"] == "tools[0].tools[0].type"
