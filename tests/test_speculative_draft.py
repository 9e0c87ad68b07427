"""The ``draft`` source of speculative decoding (issue 32, docs/speculative.md): a second model
of the same vocabulary in the same engine proposes ``k`` tokens greedily, the target verifies
them as any draft.

Drafts tested (tiny synthetic models of ``fak.synth``): the target itself (its greedy tokens are
the target's, so nearly every draft token is accepted), the target's first layer alone (same
seed, one layer: some accepted, some rejected, at every position of the draft), and a model of
another seed (almost nothing accepted). Greedy requests must give the output of decoding without
speculation token for token and log-probability for log-probability, with every KV block of both
models returned; sampled requests keep the target's distribution.

Add a case: a job to ``JOBS`` or a draft to the ``draft`` fixture's params.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import fak
from fak import _native, synth

from test_speculative import PROMPTS, assert_same_distribution, end_of_request_jobs, run_all, sample_seeds


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("draft")
    return {
        "target": str(synth.write_tiny_model(d / "target.gguf", "qwen2", seed=3)),
        "layer0": str(synth.write_tiny_model(d / "layer0.gguf", "qwen2", n_layer=1, seed=3)),
        "other": str(synth.write_tiny_model(d / "other.gguf", "qwen2", seed=7)),
        "llama": str(synth.write_tiny_model(d / "llama.gguf", "llama", seed=3)),
        "wide": str(synth.write_tiny_model(d / "wide.gguf", "qwen2", n_vocab=768, seed=3)),
        "hybrid": str(synth.write_tiny_model(d / "qwen35.gguf", "qwen35", weight_type="Q8_0", seed=11)),
    }


def run(models: dict[str, str], jobs: list[tuple[list[int], dict[str, Any]]], draft: str | None,
        speculative: str | None = None, **kw: Any) -> tuple[dict[int, list[tuple]], dict[str, Any]]:
    """``run_all`` on the target with ``draft`` (a key of ``models``) as its draft model; checks
    that the draft model's KV blocks are all returned too."""
    if draft is not None:
        kw["draft_model"] = models[draft]
    out, stats = run_all(models["target"], jobs, speculative=speculative, **kw)
    assert stats["draft_kv_blocks_free"] == stats["draft_kv_blocks_total"], "every draft KV block returned"
    assert (stats["draft_kv_blocks_total"] > 0) == (draft is not None)
    return out, stats


GREEDY = [(p, {"temperature": 0.0, "max_tokens": 48}) for p in PROMPTS]


@pytest.mark.parametrize("k", [None, 1, 3, 8])
def test_self_draft_is_identical_and_accepts_everything(models: dict[str, str], k: int | None) -> None:
    base, base_stats = run(models, GREEDY, None)
    spec, stats = run(models, GREEDY, "target", speculative=None if k is None else f"draft:{k}")
    assert spec == base, "tokens, log-probabilities and finishes"
    assert stats["spec_draft_tokens"] > 0
    assert stats["spec_accepted_tokens"] == stats["spec_draft_tokens"], stats
    assert stats["steps"] < base_stats["steps"] and stats["spec_draft_forwards"] > 0
    # each verification drafts at most k, and the draft model computes each token at most once
    # (the prompts, the tokens generated, the draft tokens: no recomputation but of what a
    # roll-back drops)
    assert stats["spec_draft_tokens"] <= stats["spec_steps"] * (k or 4)
    n_in = sum(len(p) for p, _ in GREEDY) + sum(len(v) for v in spec.values())
    assert stats["spec_draft_model_tokens"] <= n_in + stats["spec_draft_tokens"], stats


@pytest.mark.parametrize("draft", ["layer0", "other"])
@pytest.mark.parametrize("spec_k", ["draft:1", "draft:6"])
def test_poor_drafts_change_nothing(models: dict[str, str], draft: str, spec_k: str) -> None:
    """Rejections anywhere (with ``draft:1`` every rejection is of the draft's last token)."""
    base, _ = run(models, GREEDY, None)
    spec, stats = run(models, GREEDY, draft, speculative=spec_k)
    assert spec == base
    assert stats["spec_draft_tokens"] > 0
    assert stats["spec_accepted_tokens"] < stats["spec_draft_tokens"], "rejections happen"
    if draft == "layer0":
        assert stats["spec_accepted_tokens"] > 0, stats


@pytest.mark.parametrize("draft", ["target", "layer0"])
def test_end_of_request_inside_a_draft(models: dict[str, str], draft: str) -> None:
    """max_tokens, a stop id and the context window cut a verified run at the same token as
    decoding one token a step does, with drafts accepted or rejected at any position (the last
    included)."""
    jobs = end_of_request_jobs(models["target"])
    base, _ = run(models, jobs, None)
    for spec_k in ["draft:2", "draft:8"]:
        spec, stats = run(models, jobs, draft, speculative=spec_k)
        assert spec == base, spec_k
        assert stats["spec_draft_tokens"] > 0
    # the context window: 43-token prompt, n_ctx 64 → 21 tokens, the last "length"
    base, _ = run(models, [(PROMPTS[0], {"temperature": 0.0})], None, n_ctx=64)
    spec, _ = run(models, [(PROMPTS[0], {"temperature": 0.0})], draft, speculative="draft:8", n_ctx=64)
    assert spec == base and len(base[0]) == 64 - len(PROMPTS[0]) and base[0][-1][3] == "length"


def test_logprobs_penalties_and_small_budgets(models: dict[str, str]) -> None:
    """Host-side verification (top log-probabilities, penalties) and tight budgets: a step of
    64 rows shared with chunked prefills, a small KV cache (preemptions: the draft state of a
    preempted sequence is dropped and recomputed), shared prompt prefixes; outputs unchanged."""
    jobs = [
        (PROMPTS[0], {"temperature": 0.0, "max_tokens": 40, "n_logprobs": 5}),
        (PROMPTS[1], {"temperature": 0.0, "max_tokens": 40, "repeat_penalty": 1.3, "repeat_last_n": 8}),
        (PROMPTS[3], {"temperature": 0.0, "max_tokens": 40, "frequency_penalty": 0.4, "n_logprobs": 2}),
    ]
    base, _ = run(models, jobs, None)
    spec, stats = run(models, jobs, "layer0", speculative="draft:4")
    assert spec == base and stats["spec_draft_tokens"] > 0
    shared = PROMPTS[0] + PROMPTS[1]
    jobs = [(shared + [i], {"temperature": 0.0, "max_tokens": 80}) for i in range(6)]
    jobs += [(p, {"temperature": 0.0, "max_tokens": 80}) for p in PROMPTS]
    kw: dict[str, Any] = dict(max_batch=4, max_tokens_per_step=64, kv_cache_tokens=256)
    base, _ = run(models, jobs, None, **kw)
    for draft in ["target", "layer0"]:
        spec, stats = run(models, jobs, draft, speculative="draft:8", **kw)
        assert spec == base, draft
        assert stats["spec_accepted_tokens"] > 0
        assert stats["preemptions"] > 0, "the small cache preempts"
        if draft == "target":
            assert stats["spec_accepted_tokens"] == stats["spec_draft_tokens"], stats


def test_per_request_sources(models: dict[str, str]) -> None:
    """A draft model loaded, requests pick their source (the engine's default draft, ngram,
    none); without a draft model a request for it is refused."""
    jobs = [(p, {"temperature": 0.0, "max_tokens": 32, "speculative": s})
            for p, s in zip(PROMPTS, ["draft:3", "ngram", "none", {"method": "draft", "k": 5}])]
    base, _ = run(models, [(p, {"temperature": 0.0, "max_tokens": 32}) for p in PROMPTS], None)
    spec, stats = run(models, jobs, "target", speculative="none")
    assert spec == base and stats["spec_accepted_tokens"] > 0
    m = _native.EngineCore(models["target"], n_ctx=64, threads=1)
    with pytest.raises(fak.InvalidArgumentError, match="draft model") as e:
        m.add_sequence(1, [1, 2, 3], {"speculative": "draft"})
    assert e.value.param == "speculative"


def test_quarantined_span_rolls_the_draft_back(models: dict[str, str]) -> None:
    """A span cut out of a running sequence changes its tokens other than by appending: the draft
    model's state rolls back to the common prefix, and the rest of the output is that of a
    sequence that never held the span (prompt without the span, then the tokens so far)."""
    prompt = PROMPTS[1]
    cut = prompt[:10] + prompt[16:]
    for draft in ["target", "layer0"]:
        m = _native.EngineCore(models["target"], n_ctx=256, threads=1, draft_model=models[draft])
        m.add_sequence(1, prompt, {"temperature": 0.0, "max_tokens": 40})
        got: list[int] = []
        while len(got) < 8:
            got += [t for _, t, *_ in m.step()]
        n = len(got)
        m.quarantine_span(1, 10, 16)
        done = False
        while not done:
            for _, t, _lp, _top, fin in m.step():
                got.append(t)
                done = done or fin is not None
        st = m.stats()
        assert m.kv_blocks_free == m.kv_blocks_total
        assert st["draft_kv_blocks_free"] == st["draft_kv_blocks_total"]
        assert st["spec_accepted_tokens"] > 0
        if draft == "target":  # a state rolled back exactly drafts the target's own tokens
            assert st["spec_accepted_tokens"] == st["spec_draft_tokens"], st
        want, _ = run(models, [(cut + got[:n], {"temperature": 0.0, "max_tokens": 40 - n})], None)
        assert got[n:] == [t for t, *_ in want[0]], draft


def test_a_full_draft_cache_stops_drafting(models: dict[str, str]) -> None:
    """A windowed target's KV cache holds windows (4 blocks here), the draft model's as many plus
    one per sequence, and the draft keeps whole sequences: past 5 blocks of tokens the draft
    cannot grow, the sequence decodes without drafts, and the output and the returned blocks are
    unchanged."""
    kw: dict[str, Any] = dict(n_ctx=512, threads=1, max_batch=1, max_tokens_per_step=64, sliding_window=16)

    def go(draft: str | None) -> tuple[list[int], list[tuple[int, int]]]:
        m = _native.EngineCore(models["target"], **kw, **({"draft_model": models[draft]} if draft else {}))
        m.add_sequence(1, PROMPTS[0], {"temperature": 0.0, "max_tokens": 300})
        toks: list[int] = []
        drafted: list[tuple[int, int]] = []  # (tokens held, draft tokens so far) after each step
        done = False
        while not done:
            out = m.step()
            toks += [t for _, t, *_ in out]
            done = any(f is not None for *_, f in out)
            drafted.append((len(PROMPTS[0]) + len(toks), m.stats()["spec_draft_tokens"]))
        st = m.stats()
        assert m.kv_blocks_free == m.kv_blocks_total
        assert st["draft_kv_blocks_free"] == st["draft_kv_blocks_total"] == (5 if draft else 0)
        return toks, drafted

    base, _ = go(None)
    spec, drafted = go("target")
    assert spec == base and len(base) == 300
    assert drafted[3][1] > 0, "drafts while the draft's cache has room"
    late = [n for held, n in drafted if held > 5 * 32 + 8]
    assert late and len(set(late)) == 1, "none once it is full"


def test_sampled_distribution_unchanged(models: dict[str, str]) -> None:
    """Over 1024 seeds, each generated position has the distribution of plain sampling (the
    rejection rule with the draft model's one-hot proposal); the same seed twice gives the same
    tokens."""
    prompt = PROMPTS[0]
    n_gen = 12
    sampling = {"temperature": 0.04, "max_tokens": n_gen}
    base, _ = sample_seeds(models["target"], prompt, sampling)
    spec, stats = sample_seeds(models["target"], prompt, sampling, draft_model=models["target"], speculative_max_batch=64)
    assert stats["spec_accepted_tokens"] > 500 and stats["spec_draft_tokens"] > stats["spec_accepted_tokens"], stats
    assert_same_distribution(base, spec, n_gen)
    once, _ = run(models, [(prompt, {**sampling, "seed": 77})], "layer0")
    twice, _ = run(models, [(prompt, {**sampling, "seed": 77})], "layer0")
    assert once == twice


def test_mismatched_drafts_are_refused(models: dict[str, str]) -> None:
    """A draft of another vocabulary (another size, or the same size with other tokens), a hybrid
    (target or draft), tensor parallelism, and ``speculative="draft"`` without a draft model:
    fak.InvalidArgumentError naming the parameter."""
    cases: list[tuple[str, str, dict[str, Any], str]] = [
        (models["target"], "wide", {}, "vocabulary has 768 tokens"),
        (models["target"], "llama", {}, "tokenizer differs"),
        (models["target"], "hybrid", {}, "hybrid"),
        (models["hybrid"], "target", {}, "hybrid"),
        (models["target"], "target", {"tensor_parallel": 2}, "tensor_parallel"),
    ]
    for target, draft, kw, msg in cases:
        with pytest.raises(fak.InvalidArgumentError, match=msg) as e:
            _native.EngineCore(target, n_ctx=64, threads=2, draft_model=models[draft], **kw)
        assert e.value.param == "draft_model", (draft, kw)
    with pytest.raises(fak.InvalidArgumentError, match="draft model") as e:
        _native.EngineCore(models["target"], n_ctx=64, threads=1, speculative="draft")
    assert e.value.param == "speculative"
    ok = _native.EngineCore(models["target"], n_ctx=64, threads=1, draft_model=models["layer0"])
    assert ok.config["speculative"] == "draft:4" and ok.config["draft_model"] == models["layer0"]


def test_real_half_billion_drafts_for_the_one_and_a_half(model_05b: Path, model_15b: Path) -> None:
    """The pair the source is for: Qwen2.5-Coder-0.5B (mixed quants) drafting for the 1.5B
    (Q4_K_M), the same tokenizer: a chat reply of 48 greedy tokens is the one without
    speculation, token for token and log-probability for log-probability, and most draft tokens
    are accepted (about nine in ten when written; the bound leaves room)."""
    messages = [{"role": "user", "content": "Here is a function:\n\ndef add(a, b):\n    return a + b\n\n"
                                            "Rewrite it with type hints and a docstring, and show the full function."}]
    runs = []
    for kw in [{}, {"draft_model": str(model_05b)}]:
        with fak.Engine(model_15b, backend="cpu", n_ctx=512, threads=2, **kw) as engine:
            c = engine.generate(engine.apply_chat_template(messages), max_tokens=48, temperature=0, logprobs=1)
        runs.append((c, engine.stats()))
    (want, _), (got, stats) = runs
    assert got.token_ids == want.token_ids and got.text == want.text
    assert [lp.logprob for lp in got.logprobs or []] == [lp.logprob for lp in want.logprobs or []]
    assert stats["native_spec_accepted_tokens"] > 0.6 * stats["native_spec_draft_tokens"] > 0, stats
    assert stats["native_steps"] < 30, "several tokens a step"
