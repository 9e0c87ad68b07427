"""``fak generate`` / ``fak chat`` over a fake native model (the real model runs in
``test_engine_native.py``): streaming output, chat turns, /reset, /exit, speed line, errors."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner

from fak import cli_generate
from fak.chat import ChatTemplate
from fak.cli import main
from fak.engine import Engine

from fake_native import FakeModel, tiny_tokenizer

TOK = tiny_tokenizer()
CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture
def fake_engine(monkeypatch: pytest.MonkeyPatch) -> list[Engine]:
    made: list[Engine] = []

    def open_engine(model: str, kw: dict[str, Any]) -> Engine:
        engine = Engine.from_model(FakeModel(TOK, n_ctx=kw["n_ctx"], eos_after=6), TOK,
                                   chat_template=ChatTemplate(CHATML), model_name=model)
        made.append(engine)
        return engine

    monkeypatch.setattr(cli_generate, "_open_engine", open_engine)
    return made


def test_generate_streams_text_and_prints_speed(fake_engine: list[Engine]) -> None:
    result = CliRunner().invoke(main, ["generate", "m", "Hi", "--temperature", "0", "--max-tokens", "4"])
    assert result.exit_code == 0, result.output
    expected = Engine.from_model(FakeModel(TOK, eos_after=6), TOK).generate("Hi", temperature=0, max_tokens=4)
    assert result.stdout == expected.text + "\n"
    assert "prefill" in result.stderr and "decode" in result.stderr and result.stderr.strip().endswith("length")
    assert not fake_engine[0]._loop.thread.is_alive()  # closed


def test_generate_chat_and_eos(fake_engine: list[Engine]) -> None:
    result = CliRunner().invoke(main, ["generate", "m", "Hi", "--chat", "--temperature", "0"])
    assert result.exit_code == 0, result.output
    assert result.stderr.strip().endswith("stop") and "decode 7 tok" in result.stderr


def test_generate_bad_values(fake_engine: list[Engine]) -> None:
    result = CliRunner().invoke(main, ["generate", "m", "Hi", "--top-p", "1.5"])
    assert result.exit_code != 0 and "top_p" in result.output


def test_missing_model_file() -> None:
    result = CliRunner().invoke(main, ["generate", "/no/such/model.gguf", "Hi"])
    assert result.exit_code == 2 and "no GGUF file" in result.output


def test_chat_turns_reset_and_exit(fake_engine: list[Engine]) -> None:
    result = CliRunner().invoke(main, ["chat", "m", "--temperature", "0"], input="hello\n/reset\nagain\n/exit\n")
    assert result.exit_code == 0, result.output
    assert result.output.count("decode") == 2
    assert "conversation cleared" in result.output
    assert not fake_engine[0]._loop.thread.is_alive()


def test_chat_ends_on_eof(fake_engine: list[Engine]) -> None:
    result = CliRunner().invoke(main, ["chat", "m"], input="hi\n")
    assert result.exit_code == 0 and result.output.count("decode") == 1


def test_resolve_model_by_cached_name(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "tiny.gguf").write_bytes(b"GGUF")
    monkeypatch.setattr(cli_generate, "MODELS_DIR", tmp_path)
    assert cli_generate.resolve_model("tiny") == tmp_path / "tiny.gguf"
    assert cli_generate.resolve_model(str(tmp_path / "tiny.gguf")) == tmp_path / "tiny.gguf"
