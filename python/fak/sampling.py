"""Sampling parameters of one generation request, validated, and their native form.

Semantics follow llama.cpp's sampler chain (``common/sampling.cpp``): repetition penalties
(``repeat_penalty`` over the last ``repeat_last_n`` tokens, OpenAI ``presence_penalty`` /
``frequency_penalty``), then top-k, top-p, min-p, temperature; ``temperature == 0`` is greedy
(argmax). The sampler runs in Rust (``fak._native.EngineCore``), and so does the end of a request:
the engine core finishes a sequence on an end-of-generation token or after ``max_tokens``;
``stop`` strings, which need the detokenized text, are matched in Python by ``fak.Engine``.
Every range below is the core's (``fak._native.check_sampling``), checked once.
"""

from __future__ import annotations

import math
import os
from typing import Any

import msgspec

from fak import _native
from fak.errors import invalid_argument

__all__ = ["SamplingParams", "MAX_STOP_STRINGS", "MAX_STOP_LENGTH", "MAX_LOGPROBS", "MAX_PREFIX_CHOICES",
           "MAX_PREFIX_CHOICE_TOKENS"]

#: Most stop strings one request may carry.
MAX_STOP_STRINGS = 16
#: Longest stop string, in characters.
MAX_STOP_LENGTH = 1024
#: Most alternatives per token that ``logprobs`` may ask for (OpenAI's limit; the core's).
MAX_LOGPROBS: int = _native.SAMPLING_LIMITS["max_logprobs"]
#: Most sequences in ``prefix_choices`` (the gateway sends one per offered tool name and per
#: opening-brace token: 128 tools x a few hundred brace tokens fit; the core's).
MAX_PREFIX_CHOICES: int = _native.SAMPLING_LIMITS["max_prefix_choices"]
#: Longest sequence in ``prefix_choices``, in tokens (the core's).
MAX_PREFIX_CHOICE_TOKENS: int = _native.SAMPLING_LIMITS["max_prefix_choice_tokens"]
#: The core's names of two fields, as this class names them.
_PYTHON_NAMES = {"n_logprobs": "logprobs"}


def _check_number(name: str, value: Any, *, integer: bool = False) -> None:
    kinds: tuple[type, ...] = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise invalid_argument(name, f"{name} must be {'an integer' if integer else 'a number'}, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise invalid_argument(name, f"{name} must be finite, got {value!r}")


class SamplingParams(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How to sample one completion and when to stop.

    Attributes:
        max_tokens: most tokens to generate (>= 1); None: until the context window is full.
        temperature: softmax temperature (>= 0); 0 is greedy decoding.
        top_k: keep the k most likely tokens (>= -1; 0 and -1 disable).
        top_p: nucleus sampling mass, in [0, 1]; 1 disables, 0 keeps only the most likely token.
        min_p: drop tokens below ``min_p`` times the top probability, in [0, 1]; 0 disables.
        repeat_penalty: llama.cpp repetition penalty, a finite number > 0; 1 disables.
        repeat_last_n: how many recent tokens the penalties look at (>= -1; 0 disables them, -1
            is the whole sequence).
        presence_penalty: OpenAI presence penalty, in [-2, 2].
        frequency_penalty: OpenAI frequency penalty, in [-2, 2].
        seed: RNG seed (any integer fitting 64 bits); None draws a fresh one. Same seed, same
            prompt, same parameters: same output.
        stop: stop strings (at most 16, each 1..1024 characters); the matched string is not
            part of the output.
        logprobs: return the log-probability of each sampled token and of the ``logprobs`` most
            likely alternatives (0..20); None returns none.
        prefix_choices: token-id sequences the output must begin with one of: while the output
            so far is a proper prefix of some of them, only tokens continuing those are drawn
            (the native sampler walks a trie over them; temperature, top-k, top-p and min-p act
            on those candidates); after a whole sequence, generation is free. At most
            ``MAX_PREFIX_CHOICES`` sequences of at most ``MAX_PREFIX_CHOICE_TOKENS`` tokens.
            None: no constraint.
        speculative: this request's speculative decoding over the engine's default
            (docs/speculative.md): ``"ngram"`` (prompt lookup), ``"suffix"`` (suffix index over
            the sequence), ``"METHOD:K"`` (at most K draft tokens per step, 1..32) or ``"none"``;
            None: the engine's. Never changes the output's distribution (greedy: the same tokens).

    Raises:
        fak.InvalidArgumentError (a ValueError): any value out of range; ``.param`` names the
            parameter (``stop[i]`` for the i-th of a list of stop strings).
    """

    max_tokens: int | None = None
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    logprobs: int | None = None
    prefix_choices: list[list[int]] | None = None
    speculative: str | None = None

    def __post_init__(self) -> None:
        # Python's own checks: the kinds of values (a bool is not a number here) and the stop
        # strings, which the engine core never sees. Every range is the core's
        # (``fak._native.check_sampling``, the check ``add_sequence`` applies), so the two cannot
        # disagree.
        if self.max_tokens is not None:
            _check_number("max_tokens", self.max_tokens, integer=True)
        for name in ("temperature", "top_p", "min_p", "repeat_penalty", "presence_penalty", "frequency_penalty"):
            _check_number(name, getattr(self, name))
        for name in ("top_k", "repeat_last_n"):
            _check_number(name, getattr(self, name), integer=True)
        if self.seed is not None:
            _check_number("seed", self.seed, integer=True)
            if not -(2**63) <= self.seed < 2**64:
                raise invalid_argument("seed", f"seed must fit in 64 bits, got {self.seed}")
        if self.stop is not None and not isinstance(self.stop, (str, list, tuple)):
            raise invalid_argument("stop", f"stop must be a string or a list of strings, got {self.stop!r}")
        stops = self.stop_strings
        if len(stops) > MAX_STOP_STRINGS:
            raise invalid_argument("stop", f"stop has {len(stops)} strings; at most {MAX_STOP_STRINGS} are allowed")
        for i, s in enumerate(stops):
            where = "stop" if isinstance(self.stop, str) else f"stop[{i}]"
            if not isinstance(s, str):
                raise invalid_argument(where, f"stop strings must be str, got {s!r}")
            if not 1 <= len(s) <= MAX_STOP_LENGTH:
                raise invalid_argument(where, f"each stop string must have 1..{MAX_STOP_LENGTH} characters, got {len(s)}")
        if self.speculative is not None and not isinstance(self.speculative, str):
            raise invalid_argument("speculative", f"speculative must be a string such as \"ngram:4\", got {self.speculative!r}")
        if self.logprobs is not None:
            _check_number("logprobs", self.logprobs, integer=True)
            if self.logprobs < 0:
                raise invalid_argument("logprobs", f"logprobs must be in [0, {MAX_LOGPROBS}], got {self.logprobs}")
        if self.prefix_choices is not None:
            choices = self.prefix_choices
            # Checked here against the core's limits rather than sent to check_sampling: the gateway
            # sends tens of thousands of them, and add_sequence converts (and checks) them again.
            if not isinstance(choices, (list, tuple)) or not 1 <= len(choices) <= MAX_PREFIX_CHOICES:
                raise invalid_argument("prefix_choices", f"prefix_choices must be a list of 1..{MAX_PREFIX_CHOICES} token-id lists")
            for choice in choices:
                if (not isinstance(choice, (list, tuple)) or not 1 <= len(choice) <= MAX_PREFIX_CHOICE_TOKENS
                        or any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in choice)):
                    raise invalid_argument("prefix_choices", "each of prefix_choices must be a list of 1.."
                                           f"{MAX_PREFIX_CHOICE_TOKENS} non-negative token ids, got {choice!r:.80}")
        for name in ("top_k", "repeat_last_n", "max_tokens", "logprobs"):  # the core's integers are 32/64-bit
            v = getattr(self, name)
            if v is not None and not -(2**31) <= v < 2**31:
                raise invalid_argument(name, f"{name} must be in the 32-bit range, got {v}")
        values = self._native_values(seed=0)
        values.pop("prefix_choices", None)
        if self.max_tokens is not None:
            values["max_tokens"] = self.max_tokens
        problem = _native.check_sampling(values)
        if problem is not None:
            param, reason = problem
            name = _PYTHON_NAMES.get(param, param)
            raise invalid_argument(name, f"{name}: {reason}")

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> SamplingParams:
        """Builds and validates parameters from keyword arguments (``None`` values mean default).

        Raises:
            fak.InvalidArgumentError (a ValueError): a value out of range or of the wrong type,
                naming the parameter in ``.param``.
            TypeError: a keyword that is not a sampling parameter.
        """
        unknown = set(kwargs) - set(cls.__struct_fields__)
        if unknown:
            raise TypeError(f"unknown sampling parameter(s): {', '.join(sorted(unknown))}; "
                            f"known: {', '.join(cls.__struct_fields__)}")
        given = {k: v for k, v in kwargs.items() if v is not None}
        return cls(**given)

    @property
    def stop_strings(self) -> tuple[str, ...]:
        """``stop`` as a tuple (empty when there is none)."""
        if self.stop is None:
            return ()
        if isinstance(self.stop, str):
            return (self.stop,)
        return tuple(self.stop)

    @property
    def greedy(self) -> bool:
        """Whether this is greedy decoding (temperature 0)."""
        return self.temperature == 0

    def to_native(self) -> dict[str, Any]:
        """The ``sampling`` dict of ``fak._native.EngineCore.add_sequence`` (ARCHITECTURE.md), without
        ``max_tokens`` and ``stop_ids``: ``fak.Engine`` adds those (the budget it checked against
        the context window, the tokenizer's end-of-generation set).

        The seed is always an unsigned 64-bit integer: a negative seed is taken modulo 2**64, and a
        missing one is drawn from the OS.
        """
        seed = self.seed if self.seed is not None else int.from_bytes(os.urandom(8), "little")
        return self._native_values(seed)

    def _native_values(self, seed: int) -> dict[str, Any]:
        return {
            "temperature": float(self.temperature),
            "top_k": int(self.top_k),
            "top_p": float(self.top_p),
            "min_p": float(self.min_p),
            "repeat_penalty": float(self.repeat_penalty),
            "repeat_last_n": int(self.repeat_last_n),
            "presence_penalty": float(self.presence_penalty),
            "frequency_penalty": float(self.frequency_penalty),
            "seed": seed % (2**64),
            "n_logprobs": int(self.logprobs or 0),
            # only when set: a native module built before the key existed still takes the rest
            **({"prefix_choices": [list(c) for c in self.prefix_choices]} if self.prefix_choices else {}),
            **({"speculative": self.speculative} if self.speculative is not None else {}),
        }
