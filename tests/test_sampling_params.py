"""Sampling parameters: validation names the parameter; conversion to the native dict; one set of
ranges, the engine core's (``SamplingParams`` accepts exactly what ``add_sequence`` accepts)."""

from __future__ import annotations

import pytest

from fak import _native
from fak.sampling import MAX_LOGPROBS, MAX_PREFIX_CHOICE_TOKENS, MAX_STOP_STRINGS, SamplingParams


@pytest.mark.parametrize("kwargs, name", [
    ({"temperature": -0.1}, "temperature"),
    ({"temperature": float("nan")}, "temperature"),
    ({"temperature": float("inf")}, "temperature"),
    ({"temperature": "hot"}, "temperature"),
    ({"top_p": -0.01}, "top_p"),
    ({"top_p": 1.01}, "top_p"),
    ({"top_p": float("nan")}, "top_p"),
    ({"top_k": -2}, "top_k"),
    ({"top_k": 2**40}, "top_k"),
    ({"top_k": 1.5}, "top_k"),
    ({"min_p": -0.01}, "min_p"),
    ({"min_p": 1.5}, "min_p"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": -5}, "max_tokens"),
    ({"max_tokens": True}, "max_tokens"),
    ({"repeat_penalty": 0}, "repeat_penalty"),
    ({"repeat_penalty": -1}, "repeat_penalty"),
    ({"repeat_penalty": float("inf")}, "repeat_penalty"),
    ({"repeat_last_n": -2}, "repeat_last_n"),
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"frequency_penalty": -3}, "frequency_penalty"),
    ({"seed": 2**64}, "seed"),
    ({"seed": "42"}, "seed"),
    ({"stop": ["x"] * (MAX_STOP_STRINGS + 1)}, "stop"),
    ({"stop": [""]}, "stop"),
    ({"stop": ["a", 3]}, "stop"),
    ({"stop": 7}, "stop"),
    ({"stop": "x" * 2000}, "stop"),
    ({"logprobs": MAX_LOGPROBS + 1}, "logprobs"),
    ({"logprobs": -1}, "logprobs"),
    ({"prefix_choices": []}, "prefix_choices"),
    ({"prefix_choices": [[]]}, "prefix_choices"),
    ({"prefix_choices": [[1, -2]]}, "prefix_choices"),
    ({"prefix_choices": [[True]]}, "prefix_choices"),
    ({"prefix_choices": [3]}, "prefix_choices"),
    ({"prefix_choices": [[1] * (MAX_PREFIX_CHOICE_TOKENS + 1)]}, "prefix_choices"),
])
def test_invalid_values_name_the_parameter(kwargs: dict, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        SamplingParams.from_kwargs(**kwargs)


def test_unknown_parameter_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="temprature"):
        SamplingParams.from_kwargs(temprature=0.5)


@pytest.mark.parametrize("kwargs", [
    {}, {"temperature": 0}, {"temperature": 2}, {"top_p": 1}, {"top_p": 0.01}, {"top_k": 0}, {"top_k": 40},
    {"min_p": 0}, {"min_p": 1}, {"max_tokens": 1}, {"seed": -1}, {"seed": 2**64 - 1}, {"stop": "x"},
    {"top_p": 0}, {"top_k": -1}, {"repeat_penalty": 11}, {"repeat_last_n": -1}, {"repeat_last_n": 0},
    {"stop": ["a", "b"]}, {"logprobs": 0}, {"logprobs": 20}, {"presence_penalty": -2}, {"frequency_penalty": 2},
])
def test_valid_values(kwargs: dict) -> None:
    SamplingParams.from_kwargs(**kwargs)


def test_none_means_default() -> None:
    assert SamplingParams.from_kwargs(temperature=None, max_tokens=None, stop=None) == SamplingParams()


def test_native_dict() -> None:
    p = SamplingParams.from_kwargs(temperature=0.7, top_k=40, top_p=0.9, min_p=0.05, repeat_penalty=1.1,
                                   repeat_last_n=32, presence_penalty=0.5, frequency_penalty=-0.5, seed=-1,
                                   logprobs=5, stop="\n\n", max_tokens=12)
    assert p.to_native() == {
        "temperature": 0.7, "top_k": 40, "top_p": 0.9, "min_p": 0.05, "repeat_penalty": 1.1,
        "repeat_last_n": 32, "presence_penalty": 0.5, "frequency_penalty": -0.5,
        "seed": 2**64 - 1, "n_logprobs": 5,
    }
    assert p.stop_strings == ("\n\n",)
    assert SamplingParams().to_native()["n_logprobs"] == 0
    # prefix_choices only when set (a native module without the key still takes the rest)
    assert SamplingParams.from_kwargs(prefix_choices=[[5, 6], [7]]).to_native()["prefix_choices"] == [[5, 6], [7]]


def test_unseeded_requests_draw_different_seeds() -> None:
    seeds = {SamplingParams().to_native()["seed"] for _ in range(8)}
    assert len(seeds) == 8 and all(0 <= s < 2**64 for s in seeds)


def test_greedy_flag_and_frozen() -> None:
    assert SamplingParams(temperature=0).greedy and not SamplingParams().greedy
    with pytest.raises(AttributeError):
        SamplingParams().temperature = 0.0  # type: ignore[misc]


@pytest.fixture(scope="module")
def tiny_qwen2(tmp_path_factory: pytest.TempPathFactory) -> str:
    from fak import synth

    return str(synth.write_tiny_model(tmp_path_factory.mktemp("tiny") / "qwen2.gguf", "qwen2"))


# Values at and past every range's ends: SamplingParams must accept exactly what the core accepts.
EDGES = {
    "temperature": [-1e-6, 0.0, 2.0, 1e30, float("inf")],
    "top_k": [-2, -1, 0, 1, 2**31 - 1],
    "top_p": [-1e-6, 0.0, 0.5, 1.0, 1.000001],
    "min_p": [-1e-6, 0.0, 1.0, 1.01],
    "repeat_penalty": [0.0, 1e-6, 1.0, 10.0, 11.0, 1e30],
    "repeat_last_n": [-2, -1, 0, 64],
    "presence_penalty": [-2.01, -2.0, 2.0, 2.01],
    "frequency_penalty": [-2.01, -2.0, 2.0, 2.01],
    "logprobs": [0, MAX_LOGPROBS, MAX_LOGPROBS + 1],
    "max_tokens": [1, 7],
}


@pytest.mark.parametrize("name, value", [(n, v) for n, vs in EDGES.items() for v in vs])
def test_python_and_core_agree_on_every_range(name: str, value: object, tiny_qwen2: str) -> None:
    """The one validator: ``SamplingParams`` raises exactly when the core's ``add_sequence`` does
    (both for the same parameter), on a real (tiny) model."""
    try:
        params = SamplingParams.from_kwargs(**{name: value})
        py_error = None
    except ValueError as e:
        py_error = str(e)
    native_name = {"logprobs": "n_logprobs"}.get(name, name)
    model = _native.EngineCore(tiny_qwen2, n_ctx=64, threads=1)
    try:
        model.add_sequence(1, [1, 2, 3], {native_name: value})
        core_error = None
    except ValueError as e:
        core_error = str(e)
    assert (py_error is None) == (core_error is None), f"{name}={value!r}: Python {py_error!r}, core {core_error!r}"
    if py_error is not None:
        assert py_error.startswith(name), py_error
        assert native_name in core_error  # type: ignore[operator]
    else:
        assert params.to_native()["seed"] >= 0


def test_check_sampling_names_the_parameter() -> None:
    assert _native.check_sampling({"temperature": 0.5, "top_p": 0.9}) is None
    assert _native.check_sampling({"top_p": 2.0}) == ("top_p", "2 (must be in [0, 1])")
    assert _native.check_sampling({"max_tokens": 0})[0] == "max_tokens"
    assert _native.check_sampling({"stop_ids": [1] * 2000})[0] == "stop_ids"
    assert _native.check_sampling({"bogus": 1})[0] == "bogus"
    assert _native.SAMPLING_LIMITS["max_logprobs"] == MAX_LOGPROBS
