"""``fak serve``: argument checks, ``--policy-check``, and real servers started as subprocesses.

Each server test runs ``python -m fak.cli serve ...`` on a free loopback port, waits for
``/health``, talks to it with the official client, and stops it with SIGTERM.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import openai
import pytest
from click.testing import CliRunner
from fak.cli import main
from fak.gateway import BackgroundServer
from fak_subprocess import fak_env, fak_process
from gateway_fakes import FakeUpstream, UpstreamReply

REPO = Path(__file__).resolve().parents[2]


@contextmanager
def fak_serve(*args: str, timeout: float = 120.0, cwd: Path | None = None) -> Iterator[str]:
    """Run ``fak serve ARGS --addr 127.0.0.1:PORT``; yield its base URL (``.../v1``)."""
    with fak_process("serve", *args, timeout=timeout, cwd=cwd) as url:
        yield url + "/v1"


@pytest.mark.parametrize("args,message", [
    ([], "exactly one of --gguf"),
    (["--base-url", "http://x/v1", "--gguf", __file__], "exactly one of --gguf"),
    (["--policy-check"], "--policy-check needs --policy"),
    (["--base-url", "http://x/v1", "--audit-log", "a.jsonl"], "--audit-log records policy decisions"),
    (["--gguf", __file__, "--upstream-key", "k"], "--upstream-key only applies"),
    (["--base-url", "http://x/v1", "--addr", "nohost"], "HOST:PORT"),
    (["--base-url", "http://x/v1", "--max-concurrency", "0"], "--max-concurrency"),
    (["--base-url", "http://x/v1", "--tool-call-retries", "-1"], "--tool-call-retries"),
    (["--base-url", "http://x/v1", "--tool-call-format", "xml"], "--tool-call-format"),
    (["--gguf", __file__, "--replicas", "2", "--tool-call-format", "hermes"], "--tool-call-format applies"),
])
def test_usage_errors(args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, ["serve", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_serve_is_registered() -> None:
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0 and "serve" in result.output


def test_proxy_mode_end_to_end() -> None:
    fake = FakeUpstream(script={"weather": UpstreamReply(tool_calls=[("get_weather", {"city": "Oslo"})])})
    with BackgroundServer(fake.app()) as upstream, \
            fak_serve("--base-url", upstream.base_url, "--upstream-key", "up", "--api-key", "k") as base:
        client = openai.OpenAI(base_url=base, api_key="k", max_retries=0)
        r = client.chat.completions.create(model="up-model", messages=[{"role": "user", "content": "weather?"}])
        assert r.choices[0].message.tool_calls[0].function.name == "get_weather"
        assert fake.seen[-1][1]["authorization"] == "Bearer up"
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=base, api_key="bad", max_retries=0).models.list()


def test_proxy_mode_with_policy_and_default_audit_log(tmp_path: Path) -> None:
    pytest.importorskip("fak.policy")
    fake = FakeUpstream(script={"go": UpstreamReply(tool_calls=[("bash", {"command": "sudo su"}),
                                                                ("bash", {"command": "ls"})])})
    policy = REPO / "examples" / "swebench-coding-agent-policy.json"
    with BackgroundServer(fake.app()) as upstream, \
            fak_serve("--base-url", upstream.base_url, "--policy", str(policy), cwd=tmp_path) as base:
        client = openai.OpenAI(base_url=base, api_key="x", max_retries=0)
        r = client.chat.completions.create(model="up-model", messages=[{"role": "user", "content": "go"}],
                                           extra_headers={"X-Fak-Workspace": str(tmp_path)})
        assert [tc.function.arguments for tc in r.choices[0].message.tool_calls] == ['{"command": "ls"}']
    lines = (tmp_path / "fak-audit.jsonl").read_text().splitlines()
    assert [json.loads(x)["verdict"] for x in lines] == ["deny", "allow"]


def test_engine_mode_end_to_end(tmp_path: Path) -> None:
    pytest.importorskip("fak.engine", reason="fak.Engine lands from branch pyengine")
    synth = pytest.importorskip("fak.synth", reason="fak.synth lands from branch synth")
    path = tmp_path / "tiny.gguf"
    synth.write_tiny_model(path)
    with fak_serve("--gguf", str(path), "--backend", "cpu", "--n-ctx", "256", "--model-name", "tiny") as base:
        client = openai.OpenAI(base_url=base, api_key="x", max_retries=0)
        r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=8, temperature=0)
        assert r.usage.completion_tokens >= 1 and r.choices[0].finish_reason in ("stop", "length")


def test_engine_mode_tool_names_are_the_offered_ones(tmp_path: Path) -> None:
    """A real ``fak serve`` over the tiny synthetic model (random weights: it would name anything)
    and the official client: with ``tool_choice: "required"`` every call names an offered tool, and
    when its arguments do not fit (random text rarely does), nothing of the broken call comes back
    (empty content, ``fak.tool_call_error``); what the model wrote (its tokens' logprobs) starts
    with an offered name (the engine's prefix_choices held it there)."""
    pytest.importorskip("fak.engine", reason="fak.Engine lands from branch pyengine")
    synth = pytest.importorskip("fak.synth", reason="fak.synth lands from branch synth")
    from gateway_fakes import BASH_TOOL, WEATHER_TOOL

    path = tmp_path / "tiny.gguf"
    synth.write_tiny_model(path)
    tools = [WEATHER_TOOL, BASH_TOOL, {"type": "function", "function": {"name": "get_time"}}]
    names = {t["function"]["name"] for t in tools}
    haiku = [{"role": "user", "content": "Write a haiku about autumn."}]
    with fak_serve("--gguf", str(path), "--backend", "cpu", "--n-ctx", "1024", "--model-name", "tiny",
                   "--tool-call-retries", "1") as base:
        client = openai.OpenAI(base_url=base, api_key="x", max_retries=0, timeout=300)
        seen = set()
        for seed in range(6):
            r = client.chat.completions.create(model="tiny", messages=haiku, tools=tools, tool_choice="required",
                                               max_tokens=24, temperature=1.0, seed=seed, logprobs=True)
            msg = r.choices[0].message
            for call in msg.tool_calls or []:
                assert call.function.name in names
                seen.add(call.function.name)
            if not msg.tool_calls:
                assert not msg.content and r.model_extra["fak"]["tool_call_error"]  # never a fragment
                written = "".join(t.token for t in r.choices[0].logprobs.content)
                name = written.split('"', 1)[0]
                assert name in names and written.startswith(name + '", "arguments":'), written
                seen.add(name)
        assert len(seen) > 1, seen  # the model chooses among them; nothing picks one for it
        for seed in range(3):
            r = client.chat.completions.create(model="tiny", messages=haiku, tools=tools, max_tokens=16, seed=seed,
                                               tool_choice={"type": "function", "function": {"name": "bash"}},
                                               logprobs=True)
            msg = r.choices[0].message
            assert msg.tool_calls or not msg.content  # a call, or nothing of one
            written = "".join(t.token for t in r.choices[0].logprobs.content)
            assert msg.tool_calls or written.startswith(" {"), written


def test_engine_mode_qwen3_coder_tool_choice(tmp_path: Path) -> None:
    """The same over the tiny synthetic qwen3moe model, whose Qwen3-Coder template teaches the XML
    form: the gateway reads the form from the GGUF's template, pre-fills ``<tool_call>\\n`` and holds
    the model to ``<function=NAME>\\n`` of an offered NAME (required) or to ``<parameter=`` /
    ``</function>`` after ``<function=bash>\\n`` (named). Every call names an offered tool; a call
    that does not fit comes back as nothing (its tokens' logprobs show what the model wrote)."""
    pytest.importorskip("fak.engine", reason="fak.Engine lands from branch pyengine")
    synth = pytest.importorskip("fak.synth", reason="fak.synth lands from branch synth")
    from gateway_fakes import BASH_TOOL, WEATHER_TOOL

    path = tmp_path / "tiny-qwen3moe.gguf"
    try:
        synth.write_tiny_model(path, "qwen3moe")
    except (TypeError, ValueError) as exc:
        pytest.skip(f"fak.synth cannot write qwen3moe here ({exc})")
    tools = [WEATHER_TOOL, BASH_TOOL, {"type": "function", "function": {"name": "get_time"}}]
    names = {t["function"]["name"] for t in tools}
    haiku = [{"role": "user", "content": "Write a haiku about autumn."}]
    with fak_serve("--gguf", str(path), "--backend", "cpu", "--n-ctx", "1024", "--model-name", "tiny",
                   "--tool-call-retries", "1") as base:
        client = openai.OpenAI(base_url=base, api_key="x", max_retries=0, timeout=300)
        seen = set()
        for seed in range(6):
            r = client.chat.completions.create(model="tiny", messages=haiku, tools=tools, tool_choice="required",
                                               max_tokens=24, temperature=1.0, seed=seed, logprobs=True)
            msg = r.choices[0].message
            for call in msg.tool_calls or []:
                assert call.function.name in names and isinstance(json.loads(call.function.arguments), dict)
                seen.add(call.function.name)
            if not msg.tool_calls:
                assert not msg.content and r.model_extra["fak"]["tool_call_error"]  # never a fragment
                written = "".join(t.token for t in r.choices[0].logprobs.content)
                name = written[len("<function="):].split(">", 1)[0]
                assert name in names and written.startswith(f"<function={name}>\n"), written
                seen.add(name)
        assert len(seen) > 1, seen  # the model chooses among them; nothing picks one for it
        for seed in range(3):
            r = client.chat.completions.create(model="tiny", messages=haiku, tools=tools, max_tokens=16, seed=seed,
                                               tool_choice={"type": "function", "function": {"name": "bash"}},
                                               logprobs=True)
            msg = r.choices[0].message
            assert msg.tool_calls or not msg.content  # a call, or nothing of one
            written = "".join(t.token for t in r.choices[0].logprobs.content)
            assert msg.tool_calls or written.startswith(("<parameter=", "</function>")), written
            assert all(c.function.name == "bash" for c in msg.tool_calls or [])


def test_policy_check(tmp_path: Path) -> None:
    policy = pytest.importorskip("fak.policy", reason="fak.policy lands from branch policy")
    good = REPO / "examples" / "swebench-coding-agent-policy.json"
    if not good.exists():
        pytest.skip("examples/swebench-coding-agent-policy.json lands with fak.policy")
    result = CliRunner().invoke(main, ["serve", "--policy", str(good), "--policy-check"])
    assert result.exit_code == 0 and "OK" in result.output, result.output
    bad = tmp_path / "bad.json"
    bad.write_text('{"version": 1, "default": "maybe"}')
    result = CliRunner().invoke(main, ["serve", "--policy", str(bad), "--policy-check"])
    assert result.exit_code == 1 and "OK" not in result.output
    assert policy.check_main(bad) == 1
