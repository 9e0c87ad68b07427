"""Chat templates rendered from the GGUF, as transformers' apply_chat_template renders them.

The expected strings for the real Qwen2.5 template are the ChatML layout that template produces
(system default, ``# Tools`` block with one JSON line per tool, ``<tool_call>`` blocks for assistant
tool calls with the arguments serialized by ``tojson``, consecutive tool results grouped in one
user turn inside ``<tool_response>`` tags).
"""

from __future__ import annotations

import pytest

import fak
from fak.chat import ChatTemplate, ChatTemplateError, NoChatTemplateError

import model_meta

DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}]


@pytest.fixture(scope="module", params=["model_05b", "model_15b"])
def qwen(request: pytest.FixtureRequest) -> ChatTemplate:
    return ChatTemplate.from_metadata(model_meta.metadata(request.getfixturevalue(request.param)))


def test_special_token_variables(qwen: ChatTemplate) -> None:
    assert qwen.bos_token == "<|endoftext|>"
    assert qwen.eos_token == "<|im_end|>"


def test_single_turn_default_system(qwen: ChatTemplate) -> None:
    out = qwen.render([{"role": "user", "content": "Hi"}])
    assert out == (f"<|im_start|>system\n{DEFAULT_SYSTEM}<|im_end|>\n"
                   "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert qwen.render([{"role": "user", "content": "Hi"}], add_generation_prompt=False).endswith("Hi<|im_end|>\n")


def test_multi_turn_with_system(qwen: ChatTemplate) -> None:
    messages = [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "日本語で？"},
    ]
    assert qwen.render(messages) == (
        "<|im_start|>system\nBe terse.<|im_end|>\n"
        "<|im_start|>user\n2+2?<|im_end|>\n"
        "<|im_start|>assistant\n4<|im_end|>\n"
        "<|im_start|>user\n日本語で？<|im_end|>\n"
        "<|im_start|>assistant\n")


def test_tools_tool_calls_and_tool_results(qwen: ChatTemplate) -> None:
    messages = [
        {"role": "user", "content": "Weather in Paris and Zürich?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
            {"id": "c2", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}},
        ]},
        {"role": "tool", "tool_call_id": "c1", "content": "18°C"},
        {"role": "tool", "tool_call_id": "c2", "content": "12°C"},
    ]
    # The 1.5B file's template writes this instruction line with doubled braces (a quirk of that
    # Qwen2.5 revision, rendered literally by HF too); the 0.5B file's with single braces.
    braces = "{{" if '{{\\"name\\"' in qwen.source else "{"
    instruction = f'{braces}"name": <function-name>, "arguments": <args-json-object>{braces.replace("{", "}")}'
    tools_json = ('{"type": "function", "function": {"name": "get_weather", "description": "Current weather in a '
                  'city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, '
                  '"required": ["city"]}}}')
    assert qwen.render(messages, tools=TOOLS) == (
        f"<|im_start|>system\n{DEFAULT_SYSTEM}\n\n# Tools\n\n"
        "You may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        f"{tools_json}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n"
        f"{instruction}\n</tool_call><|im_end|>\n"
        "<|im_start|>user\nWeather in Paris and Zürich?<|im_end|>\n"
        "<|im_start|>assistant\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n18°C\n</tool_response>\n"
        "<tool_response>\n12°C\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n")


def test_tools_with_system_message(qwen: ChatTemplate) -> None:
    out = qwen.render([{"role": "system", "content": "Sys."}, {"role": "user", "content": "x"}], tools=TOOLS)
    assert out.startswith("<|im_start|>system\nSys.\n\n# Tools\n")
    assert out.count("<|im_start|>system") == 1
    assert qwen.render([{"role": "user", "content": "x"}], tools=[]) == qwen.render([{"role": "user", "content": "x"}])


def test_content_parts_are_joined(qwen: ChatTemplate) -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert "<|im_start|>user\na\nb<|im_end|>" in qwen.render([{"role": "user", "content": parts}])


def test_rendered_prompt_tokenizes_with_special_tokens(model_05b) -> None:  # type: ignore[no-untyped-def]
    tok = model_meta.tokenizer(model_05b)
    text = ChatTemplate.from_metadata(model_meta.metadata(model_05b)).render([{"role": "user", "content": "Hi"}])
    ids = tok.encode(text, add_special=False)
    assert ids[0] == tok.token_to_id("<|im_start|>") and ids.count(tok.token_to_id("<|im_end|>")) == 2


# --- HF environment: globals, filters, sandbox, errors -------------------------------------------


def test_raise_exception_becomes_chat_template_error() -> None:
    t = ChatTemplate("{% if messages[0].role != 'user' %}{{ raise_exception('first must be user') }}{% endif %}ok")
    assert t.render([{"role": "user", "content": ""}]) == "ok"
    with pytest.raises(ChatTemplateError, match="first must be user"):
        t.render([{"role": "assistant", "content": ""}])


def test_tojson_does_not_escape_and_takes_options() -> None:
    t = ChatTemplate("{{ messages[0] | tojson }}|{{ messages[0] | tojson(indent=1) }}")
    out = t.render([{"role": "user", "content": "<b>é & ü</b>"}])
    assert out.split("|")[0] == '{"role": "user", "content": "<b>é & ü</b>"}'
    assert out.split("|")[1].startswith('{\n "role"')


def test_trim_blocks_loopcontrols_generation_and_strftime() -> None:
    src = ("{% for m in messages %}\n{% if loop.index > 2 %}{% break %}{% endif %}"
           "{% generation %}[{{ m.content }}]{% endgeneration %}\n{% endfor %}{{ strftime_now('%Y') | length }}")
    t = ChatTemplate(src)
    assert t.render([{"role": "user", "content": c} for c in "abc"]) == "[a][b]4"


def test_bos_eos_and_extra_variables() -> None:
    t = ChatTemplate("{{ bos_token }}{{ messages[0].content }}{{ eos_token }}{{ enable_thinking }}", "<s>", "</s>")
    assert t.render([{"role": "user", "content": "x"}], enable_thinking=False) == "<s>x</s>False"


def test_sandbox_blocks_attribute_escape() -> None:
    t = ChatTemplate("{{ messages.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(ChatTemplateError):
        t.render([])
    mutate = ChatTemplate("{{ messages.append(1) }}")
    with pytest.raises(ChatTemplateError):
        mutate.render([])


def test_syntax_error() -> None:
    with pytest.raises(ChatTemplateError, match="does not compile"):
        ChatTemplate("{% if %}")


def test_no_template_in_file() -> None:
    with pytest.raises(NoChatTemplateError, match="no chat template"):
        ChatTemplate.from_metadata({"tokenizer.ggml.tokens": ["a"]})
    assert issubclass(NoChatTemplateError, fak.FakError) and issubclass(NoChatTemplateError, ValueError)
    t = ChatTemplate.from_metadata({}, override="{{ messages[0].content }}!")
    assert t.render([{"role": "user", "content": "x"}]) == "x!"


def test_missing_field_is_a_template_error() -> None:
    t = ChatTemplate("{{ messages[0].content + 1 }}")
    with pytest.raises(ChatTemplateError):
        t.render([{"role": "user", "content": "x"}])
