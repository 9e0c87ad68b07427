"""Speculative decoding in the engine core (issue 32, docs/speculative.md): drafts from the
sequence's own text (``ngram``, ``suffix``) verified in one forward of ``1 + k`` rows.

Greedy requests must give the output of decoding without speculation token for token and
log-probability for log-probability (the CPU backend's rows do not depend on the batch), including
the core's end-of-request rules inside an accepted run (stop ids, ``max_tokens``, the context
window), top log-probabilities and penalties, with every KV block returned. Sampled requests keep
the target distribution (the rejection rule): token frequencies over many seeds match those of
non-speculative sampling within a chi-square bound. Several tokens for one sequence in one
``step()`` reach ``fak.Engine``'s streams and stop strings intact.

Add a case: a prompt (token ids) and sampling dict to ``CASES``; ``run_all`` compares both runs.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import pytest

import fak
from fak import _native, synth

METHODS = ["ngram", "ngram:1", "ngram:8", "suffix", "suffix:16"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(synth.write_tiny_model(tmp_path_factory.mktemp("spec") / "qwen2.gguf", "qwen2", seed=3))


def periodic(n: int, period: list[int]) -> list[int]:
    return [period[i % len(period)] for i in range(n)]


# Prompts with repeats (something for a draft to match) and without.
PROMPTS = [
    periodic(40, [11, 12, 13, 14, 15, 16, 17]) + [3, 4, 5],
    [7, 8, 9, 10] * 3 + list(range(30, 60)) + [7, 8, 9],
    list(range(100, 137)),
    [5] * 20,
]


def run_all(path: str, jobs: list[tuple[list[int], dict[str, Any]]], speculative: str | None = None,
            n_ctx: int = 256, max_steps: int = 400, **kw: Any) -> tuple[dict[int, list[tuple]], dict[str, Any]]:
    """Runs every job concurrently through ``_native.EngineCore`` until all finish; returns each
    sequence's ``(token, logprob, top, finish)`` list and the model's stats."""
    m = _native.EngineCore(path, n_ctx=n_ctx, threads=1, speculative=speculative, **kw)
    for i, (prompt, sampling) in enumerate(jobs):
        m.add_sequence(i, prompt, sampling)
    out: dict[int, list[tuple]] = {i: [] for i in range(len(jobs))}
    done: set[int] = set()
    for _ in range(max_steps):
        for sid, tok, lp, top, fin in m.step():
            assert sid not in done, "a token after the finish"
            out[sid].append((tok, lp, top, fin))
            if fin is not None:
                done.add(sid)
        if len(done) == len(jobs):
            break
    assert len(done) == len(jobs), "every job finishes"
    assert m.n_running == 0 and m.kv_blocks_free == m.kv_blocks_total, "every KV block returned"
    return out, m.stats()


@pytest.mark.parametrize("method", METHODS)
def test_greedy_identical_to_no_speculation(tiny: str, method: str) -> None:
    jobs = [(p, {"temperature": 0.0, "max_tokens": 48}) for p in PROMPTS]
    base, base_stats = run_all(tiny, jobs)
    spec, stats = run_all(tiny, jobs, speculative=method)
    assert spec == base, "tokens, log-probabilities and finishes"
    assert base_stats["spec_steps"] == 0
    assert stats["spec_draft_tokens"] > 0 and stats["spec_accepted_tokens"] > 0, stats
    assert stats["steps"] < base_stats["steps"], "fewer forwards"


def test_off_switch_past_max_batch(tiny: str) -> None:
    """``speculative_max_batch``: a step with more decoding sequences than it drafts nothing (the
    same outputs, no verification); at or under it the same jobs draft."""
    jobs = [(p, {"temperature": 0.0, "max_tokens": 40}) for p in PROMPTS]
    base, _ = run_all(tiny, jobs)
    off, stats = run_all(tiny, jobs, speculative="ngram:8", speculative_max_batch=len(jobs) - 1)
    assert off == base
    # the prompts finish prefill in the same step, so every decode step has all four decoding
    assert stats["spec_steps"] == 0, stats
    on, stats = run_all(tiny, jobs, speculative="ngram:8", speculative_max_batch=len(jobs))
    assert on == base and stats["spec_steps"] > 0


def test_adaptive_length_drafts_less_where_drafts_fail(tiny: str) -> None:
    """Each sequence's draft length follows its acceptance: on a prompt whose repeats the model
    does not continue, drafts shrink and pause, so fewer draft tokens are computed than a fixed
    K would, with the same output."""
    jobs = [(p, {"temperature": 0.0, "max_tokens": 48}) for p in PROMPTS]
    base, _ = run_all(tiny, jobs)
    spec, stats = run_all(tiny, jobs, speculative="ngram:16")
    assert spec == base
    assert stats["spec_draft_tokens"] < 16 * stats["spec_steps"], stats
    assert stats["spec_accepted_tokens"] > 0


def test_per_request_setting_overrides_the_default(tiny: str) -> None:
    jobs = [(p, {"temperature": 0.0, "max_tokens": 32, "speculative": s})
            for p, s in zip(PROMPTS, ["suffix:6", {"method": "ngram", "k": 3}, "none", {"method": "suffix"}])]
    base, _ = run_all(tiny, [(p, {"temperature": 0.0, "max_tokens": 32}) for p in PROMPTS])
    spec, stats = run_all(tiny, jobs)  # no engine default: the requests ask
    assert spec == base and stats["spec_accepted_tokens"] > 0
    off, stats = run_all(tiny, [(p, {"temperature": 0.0, "max_tokens": 32, "speculative": "none"}) for p in PROMPTS],
                         speculative="ngram")
    assert off == base and stats["spec_steps"] == 0


@pytest.mark.parametrize("method", ["ngram", "suffix:8"])
def test_logprobs_and_penalties_identical(tiny: str, method: str) -> None:
    """Greedy with top log-probabilities and penalties reads whole rows on the host: the
    verification samples each row given the tokens before it, as decoding one at a time does."""
    jobs = [
        (PROMPTS[0], {"temperature": 0.0, "max_tokens": 40, "n_logprobs": 5}),
        (PROMPTS[1], {"temperature": 0.0, "max_tokens": 40, "repeat_penalty": 1.3, "repeat_last_n": 8}),
        (PROMPTS[3], {"temperature": 0.0, "max_tokens": 40, "frequency_penalty": 0.4, "n_logprobs": 2}),
    ]
    base, _ = run_all(tiny, jobs)
    spec, stats = run_all(tiny, jobs, speculative=method)
    assert spec == base
    assert stats["spec_draft_tokens"] > 0


def end_of_request_jobs(path: str) -> list[tuple[list[int], dict[str, Any]]]:
    """Greedy jobs on ``PROMPTS[0]`` that end at each ``max_tokens`` 1..11 and at each of six
    stop ids the model of ``path`` writes (its tokens 3..30)."""
    free, _ = run_all(path, [(PROMPTS[0], {"temperature": 0.0, "max_tokens": 60})])
    toks = [t for t, *_ in free[0]]
    jobs: list[tuple[list[int], dict[str, Any]]] = []
    for m in range(1, 12):
        jobs.append((PROMPTS[0], {"temperature": 0.0, "max_tokens": m}))
    for stop in sorted(set(toks[3:30]))[:6]:
        jobs.append((PROMPTS[0], {"temperature": 0.0, "max_tokens": 60, "stop_ids": [stop]}))
    return jobs


def test_end_of_request_inside_an_accepted_run(tiny: str) -> None:
    """max_tokens, a stop id and the context window cut a verified run at the same token as
    decoding one token a step does."""
    jobs = end_of_request_jobs(tiny)
    base, _ = run_all(tiny, jobs)
    for method in ["ngram:8", "suffix:16"]:
        spec, stats = run_all(tiny, jobs, speculative=method)
        assert spec == base, method
        assert stats["spec_accepted_tokens"] > 0
    # the context window: 43-token prompt, n_ctx 64 → 21 tokens, the last "length"
    base, _ = run_all(tiny, [(PROMPTS[0], {"temperature": 0.0})], n_ctx=64)
    spec, _ = run_all(tiny, [(PROMPTS[0], {"temperature": 0.0})], speculative="ngram:8", n_ctx=64)
    assert spec == base and len(base[0]) == 64 - len(PROMPTS[0]) and base[0][-1][3] == "length"


def test_small_budgets_and_shared_prefixes(tiny: str) -> None:
    """Drafts fit in what the decodes leave of a step's rows (max_tokens_per_step at its floor,
    chunked prefills beside them), a small KV cache (drafts dropped rather than anyone preempted
    for them; preemptions recompute), and prompts shared through the prefix cache."""
    shared = PROMPTS[0] + PROMPTS[1]
    jobs = [(shared + [i], {"temperature": 0.0, "max_tokens": 40}) for i in range(6)]
    jobs += [(p, {"temperature": 0.0, "max_tokens": 40}) for p in PROMPTS]
    kw = dict(max_batch=4, max_tokens_per_step=64, kv_cache_tokens=384)
    base, _ = run_all(tiny, jobs, **kw)
    spec, stats = run_all(tiny, jobs, speculative="suffix:8", **kw)
    assert spec == base
    assert stats["spec_accepted_tokens"] > 0


def chi2_two_sample(a: Counter, b: Counter, min_count: int = 10) -> tuple[float, int]:
    """Two-sample chi-square over the tokens seen at least ``min_count`` times in both samples
    together (the rest pooled); returns (statistic, degrees of freedom). Equal sample sizes."""
    keys = [k for k in set(a) | set(b) if a[k] + b[k] >= min_count]
    rest_a = sum(a.values()) - sum(a[k] for k in keys)
    rest_b = sum(b.values()) - sum(b[k] for k in keys)
    cells = [(a[k], b[k]) for k in keys] + ([(rest_a, rest_b)] if rest_a + rest_b > 0 else [])
    stat = sum((x - y) ** 2 / (x + y) for x, y in cells if x + y > 0)
    return stat, len(cells) - 1


def chi2_critical(df: int) -> float:
    """Upper 1e-4 quantile of chi-square with ``df`` degrees of freedom (Wilson-Hilferty)."""
    z = 3.719  # standard normal, 1e-4 upper tail
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def sample_seeds(path: str, prompt: list[int], sampling: dict[str, Any], n_seeds: int = 1024,
                 **kw: Any) -> tuple[list[list[int]], dict[str, Any]]:
    """``prompt`` sampled with ``sampling`` under ``n_seeds`` seeds, 64 sequences at a time
    (``run_all`` with ``kw``); returns each seed's tokens and the ``spec_*`` counters summed."""
    rows: list[list[int]] = []
    stats: dict[str, Any] = {}
    for batch in range(0, n_seeds, 64):
        jobs = [(prompt, {**sampling, "seed": 1_000_003 * (s + 1)}) for s in range(batch, batch + 64)]
        out, st = run_all(path, jobs, max_batch=64, **kw)
        rows += [[t for t, *_ in out[i]] for i in range(len(jobs))]
        for k, v in st.items():
            if k.startswith("spec_"):
                stats[k] = stats.get(k, 0) + v
    return rows, stats


def assert_same_distribution(base: list[list[int]], spec: list[list[int]], n_gen: int) -> None:
    """The tokens at each position 1..n_gen-1 of ``spec`` and ``base`` pass the two-sample
    chi-square test at 1e-4."""
    for pos in range(1, n_gen):
        a = Counter(r[pos] for r in base)
        b = Counter(r[pos] for r in spec)
        stat, df = chi2_two_sample(a, b)
        assert df >= 1 and stat < chi2_critical(df), f"position {pos}: chi2 {stat:.1f} on {df} df"


@pytest.mark.parametrize("sampling", [{"temperature": 0.04}, {"temperature": 0.05, "top_k": 8}])
def test_sampled_distribution_unchanged(tiny: str, sampling: dict[str, Any]) -> None:
    """Over 1024 seeds, the token at each generated position 1..11 of speculative sampling has the
    distribution of plain sampling (the rejection rule with a deterministic draft); the same seed
    gives the same tokens twice. (The tiny model's logits are flat: low temperatures make its
    output loop, so drafts are proposed and some accepted.)"""
    prompt = PROMPTS[0]
    n_gen = 12
    sampling = {**sampling, "max_tokens": n_gen}
    base, _ = sample_seeds(tiny, prompt, sampling)
    # 64 sequences a step: past the default off-switch (16), so it is raised
    spec, stats = sample_seeds(tiny, prompt, sampling, speculative="ngram:4", speculative_max_batch=64)
    assert stats["spec_accepted_tokens"] > 500 and stats["spec_draft_tokens"] > stats["spec_accepted_tokens"], stats
    assert_same_distribution(base, spec, n_gen)
    again, _ = run_all(tiny, [(prompt, {**sampling, "seed": 77})], speculative="ngram:4")
    twice, _ = run_all(tiny, [(prompt, {**sampling, "seed": 77})], speculative="ngram:4")
    assert again == twice


def test_bad_settings_are_refused(tiny: str) -> None:
    with pytest.raises(ValueError, match="speculative"):
        _native.EngineCore(tiny, n_ctx=64, threads=1, speculative="eagle")
    m = _native.EngineCore(tiny, n_ctx=64, threads=1)
    for bad in ["ngram:0", "suffix:99", {"method": "ngram", "k": "x"}, {"k": 3}, 7]:
        with pytest.raises(ValueError, match="speculative"):
            m.add_sequence(1, [1, 2, 3], {"speculative": bad})
    assert _native.check_sampling({"speculative": "ngram:40"})[0] == "speculative"
    assert _native.check_sampling({"speculative": "suffix:8"}) is None
    assert m.config["speculative"] == "none"
    assert _native.EngineCore(tiny, n_ctx=64, threads=1, speculative="suffix:6").config["speculative"] == "suffix:6"


def test_hybrid_models_do_not_speculate(tmp_path: Any) -> None:
    """A hybrid's recurrent state cannot roll back: speculation is off (its outputs unchanged)."""
    path = str(synth.write_tiny_model(tmp_path / "qwen35.gguf", "qwen35", weight_type="Q8_0", seed=11))
    jobs = [(PROMPTS[0], {"temperature": 0.0, "max_tokens": 12, "speculative": "ngram"})]
    base, _ = run_all(path, jobs)
    spec, stats = run_all(path, jobs, speculative="ngram")
    assert spec == base and stats["spec_steps"] == 0
    assert _native.EngineCore(path, n_ctx=64, threads=1, speculative="ngram").config["speculative"] == "none"


@pytest.mark.parametrize("source", ["suffix:8", "draft"])
def test_engine_streams_several_tokens_per_step(tiny: str, source: str) -> None:
    """``fak.Engine(speculative=...)`` (``draft``: ``draft_model=``, the model itself as its
    draft): generate and stream give the text, tokens, finish and stop-string cut of the engine
    without speculation, though one step yields several tokens."""
    kw = {"draft_model": tiny} if source == "draft" else {"speculative": source}
    with fak.Engine(tiny, n_ctx=256, threads=1) as plain, \
            fak.Engine(tiny, n_ctx=256, threads=1, **kw) as fast:
        for prompt in PROMPTS[:2]:
            want = plain.generate(prompt, max_tokens=40, temperature=0, logprobs=2)
            got = fast.generate(prompt, max_tokens=40, temperature=0, logprobs=2)
            assert (got.token_ids, got.text, got.finish_reason) == (want.token_ids, want.text, want.finish_reason)
            assert [lp.logprob for lp in got.logprobs or []] == [lp.logprob for lp in want.logprobs or []]
            deltas = list(fast.stream(prompt, max_tokens=40, temperature=0))
            assert [t for d in deltas for t in d.token_ids] == want.token_ids
            assert deltas[-1].finish_reason == want.finish_reason
            # a stop string inside the text: the same cut
            text = want.text
            if len(text) > 12:
                stop = text[8:11]
                w = plain.generate(prompt, max_tokens=40, temperature=0, stop=stop)
                g = fast.generate(prompt, max_tokens=40, temperature=0, stop=stop)
                assert (g.text, g.finish_reason, g.token_ids) == (w.text, w.finish_reason, w.token_ids)
        assert fast.stats()["native_spec_accepted_tokens"] > 0


def test_conversation_outputs_feed_later_drafts(tiny: str) -> None:
    """With ``suffix``, a sequence of a conversation also drafts from the outputs of the
    conversation's earlier requests: a second request whose prompt does not hold the first one's
    output but which writes much the same accepts more draft tokens with the conversation than
    without it, and its tokens are the same."""
    jobs = [(PROMPTS[2], {"temperature": 0.0, "max_tokens": 40}),
            ([1, 2] + PROMPTS[2], {"temperature": 0.0, "max_tokens": 40})]

    def run(conversation: str | None) -> tuple[list[int], int]:
        m = _native.EngineCore(tiny, n_ctx=256, threads=1, speculative="suffix:8")
        second: list[int] = []
        gained = 0
        for i, (prompt, sampling) in enumerate(jobs):  # one after the other
            m.add_sequence(i, prompt, sampling, conversation=conversation)
            before = m.stats()["spec_accepted_tokens"]
            finished = False
            while not finished:
                for _sid, t, _lp, _top, fin in m.step():
                    if i == 1:
                        second.append(t)
                    finished = finished or fin is not None
            gained = m.stats()["spec_accepted_tokens"] - before
        return second, gained

    alone, gained_alone = run(None)
    shared, gained_shared = run("conv-1")
    assert alone == shared and len(alone) == 40
    assert gained_shared > gained_alone, (gained_shared, gained_alone)


@pytest.mark.parametrize("source", ["ngram:8", "draft"])
def test_cancelled_stream_returns_every_block(tiny: str, source: str) -> None:
    """Closing a stream mid-run (its sequence verified drafts) frees its KV blocks (and its draft
    model's, with ``draft_model=``); the next request's output is unchanged."""
    kw = {"draft_model": tiny} if source == "draft" else {"speculative": source}
    with fak.Engine(tiny, n_ctx=256, threads=1, **kw) as engine:
        want = engine.generate(PROMPTS[0], max_tokens=40, temperature=0)
        it = engine.stream(PROMPTS[0], max_tokens=200, temperature=0)
        got: list[int] = []
        for d in it:
            got += d.token_ids
            if len(got) >= 12:
                break
        it.close()
        assert got[:12] == want.token_ids[:12]
        again = engine.generate(PROMPTS[0], max_tokens=40, temperature=0)
        assert again.token_ids == want.token_ids
        stats = engine.stats()
        assert stats["kv_blocks_used"] == 0 and stats["running"] == 0
    stats = engine.stats()  # the native counters as the loop ended: none was running
    assert stats["native_draft_kv_blocks_free"] == stats["native_draft_kv_blocks_total"]
    assert (stats["native_draft_kv_blocks_total"] > 0) == (source == "draft")
