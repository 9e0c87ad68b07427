"""Automatic prefix caching (rust/src/engine/kv_cache.rs, scheduler.rs) through ``fak._native.EngineCore``
and ``fak.Engine``: outputs are the same bits with the cache on and off, the hit counters count
exactly the full 32-token blocks that were reused, and the cache survives concurrency, KV pressure
(preemption, eviction) and cancellation with the pool's blocks all accounted for.

Every comparison is exact (greedy tokens, logprobs, top logprobs): the engine computes each row of
a forward independently of the other rows in the batch, so K/V taken from the cache is the K/V the
sequence would have computed itself. To add a case, build the token lists, run them through
``_run`` on a cache-on and a cache-off model, and compare.
"""

from __future__ import annotations

import numpy as np
import pytest

from fak import _native
from fak.synth import write_tiny_model

BLOCK = 32
SAMPLING = {"temperature": 0.0, "n_logprobs": 4}

#: Tiny models (n_embd 256 so that K-quants are real) mixing every kind of matmul kernel:
#: name → (architecture, weight kind → type).
MODELS = {
    "qwen2-mixed": ("qwen2", {"attn_q": "Q5_0", "attn_k": "Q8_0", "attn_v": "Q6_K", "attn_output": "Q4_K",
                              "ffn_gate": "Q4_K", "ffn_up": "Q4_0", "ffn_down": "Q6_K", "token_embd": "Q8_0",
                              "output": "Q6_K"}),
    "llama-float": ("llama", {"attn_q": "F16", "attn_k": "BF16", "attn_v": "Q5_0", "attn_output": "Q8_0",
                              "ffn_gate": "Q4_K", "ffn_up": "F32", "ffn_down": "Q5_K", "token_embd": "Q4_K"}),
}
N_LAYER = 2


@pytest.fixture(scope="module", params=list(MODELS))
def tiny(request, tmp_path_factory):
    """``(n_vocab, path)`` of a tiny synthetic model."""
    arch, kinds = MODELS[request.param]
    types = {}
    for kind, dtype in kinds.items():
        if kind in ("token_embd", "output"):
            types[f"{kind}.weight"] = dtype
        else:
            types.update({f"blk.{i}.{kind}.weight": dtype for i in range(N_LAYER)})
    path = write_tiny_model(tmp_path_factory.mktemp("pc") / f"{request.param}.gguf", arch, n_layer=N_LAYER,
                            n_embd=256, n_head=8, n_head_kv=2, n_ff=512, tensor_types=types, seed=3)
    return _native.EngineCore(str(path), threads=1).n_vocab, path


def _tokens(n: int, n_vocab: int, seed: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, n_vocab, size=n)]


Step = tuple[int, float, tuple[tuple[int, float], ...]]


def _run(model, prompts: dict[int, list[int]], n_new: int | dict[int, int],
         arrivals: dict[int, int] | None = None) -> dict[int, list[Step]]:
    """Steps ``model`` until each sequence has ``n_new`` tokens (then removes it); returns every
    sequence's ``(token, logprob, top_logprobs)`` list. ``arrivals[id]``: the step it is added at."""
    want = n_new if isinstance(n_new, dict) else {sid: n_new for sid in prompts}
    arrivals = arrivals or {}
    out: dict[int, list[Step]] = {}
    step = 0
    while len(out) < len(prompts) or any(len(out[s]) < want[s] for s in out):
        for sid, p in prompts.items():
            if arrivals.get(sid, 0) == step:
                model.add_sequence(sid, p, dict(SAMPLING))
                out[sid] = []
        for sid, tok, lp, top, _fin in model.step():
            out[sid].append((tok, lp, tuple(top or ())))
            if len(out[sid]) == want[sid]:
                model.remove_sequence(sid)
        step += 1
        assert step < 20_000
    return out


def _ids(steps: list[Step]) -> list[int]:
    return [t for t, _, _ in steps]


def _pair(path, **kw):
    """The same model with the prefix cache on and off."""
    return (_native.EngineCore(str(path), prefix_cache=True, **kw),
            _native.EngineCore(str(path), prefix_cache=False, **kw))


def _conversation(model, first: list[int], user_turns: list[list[int]], n_new: int) -> list[list[Step]]:
    """A chat extended turn by turn: each prompt is the previous prompt, its reply, and the next
    user turn (what an agent sends every step). Returns each turn's steps."""
    prompt, replies = list(first), []
    for i, user in enumerate([[]] + user_turns):
        prompt = prompt + user
        steps = _run(model, {100 + i: prompt}, n_new)[100 + i]
        replies.append(steps)
        prompt = prompt + _ids(steps)
    return replies


def test_conversation_turn_by_turn_is_identical_and_counted(tiny):
    n_vocab, path = tiny
    on, off = _pair(path, n_ctx=1024, threads=2)
    assert on.config["prefix_cache"] is True and off.config["prefix_cache"] is False
    first = _tokens(150, n_vocab, 1)  # a "system prompt" of 4.7 blocks
    users = [_tokens(n, n_vocab, 10 + n) for n in (37, 5, 64, 90)]
    n_new = 13
    got = _conversation(on, first, users, n_new)
    want = _conversation(off, first, users, n_new)
    assert got == want  # tokens, logprobs and top logprobs, bit for bit

    # Hits: at turn t the cache holds the full blocks of everything turn t-1 computed (its prompt
    # and all generated tokens but the last, whose K/V is never computed), and the new prompt may
    # take those of them strictly before its last token.
    s = on.stats()
    prompt_lens, hits, computed_before = [], 0, 0
    prompt_len = len(first)
    for i, user in enumerate([[]] + users):
        prompt_len += len(user)
        prompt_lens.append(prompt_len)
        hits += BLOCK * min(computed_before // BLOCK, (prompt_len - 1) // BLOCK)
        computed_before = prompt_len + n_new - 1
        prompt_len += n_new
    assert s["prefix_cache_query_tokens"] == sum(prompt_lens)
    assert s["prefix_cache_hit_tokens"] == hits
    assert hits >= 0.6 * sum(prompt_lens[1:]), "the growing conversation is mostly cached"
    # Skipped tokens are exactly the hits; nothing else changes.
    o = off.stats()
    assert (o["prefix_cache_hit_tokens"], o["prefix_cache_blocks"]) == (0, 0)
    assert o["prefix_cache_query_tokens"] == sum(prompt_lens)
    assert s["prefill_tokens"] == o["prefill_tokens"] - hits
    assert s["decode_tokens"] == o["decode_tokens"]
    assert s["prefix_cache_blocks"] > 0
    assert on.kv_blocks_free == on.kv_blocks_total and s["kv_blocks_used"] == 0
    on.reset_stats()
    assert on.stats()["prefix_cache_hit_tokens"] == 0
    assert on.stats()["prefix_cache_blocks"] == s["prefix_cache_blocks"], "a gauge, not a counter"


def test_identical_prompt_recomputes_only_its_last_block(tiny):
    n_vocab, path = tiny
    model = _native.EngineCore(str(path), n_ctx=512, threads=2)
    prompt = _tokens(3 * BLOCK, n_vocab, 5)
    a = _run(model, {1: prompt}, 4)[1]
    b = _run(model, {2: prompt}, 4)[2]
    assert a == b
    s = model.stats()
    # The third block holds the last prompt token: it is recomputed, the first two are hits.
    assert s["prefix_cache_hit_tokens"] == 2 * BLOCK
    assert s["prefill_tokens"] == 2 * len(prompt) - 2 * BLOCK


def test_concurrent_sequences_sharing_a_system_prompt(tiny):
    """Sixteen requests with one system prompt arrive together and while others decode; each
    gets exactly the tokens it gets alone on a cache-off model."""
    n_vocab, path = tiny
    on, off = _pair(path, n_ctx=512, threads=2, max_batch=16)
    system = _tokens(200, n_vocab, 7)
    prompts = {i: system + _tokens(5 + 7 * i, n_vocab, 100 + i) for i in range(16)}
    arrivals = {i: (0 if i < 10 else 3 * i) for i in prompts}
    got = _run(on, prompts, 12, arrivals)
    alone = {sid: _run(off, {sid: p}, 12)[sid] for sid, p in prompts.items()}
    assert got == alone
    s = on.stats()
    total = sum(len(p) for p in prompts.values())
    assert s["prefix_cache_query_tokens"] == total
    assert s["preemptions"] == 0
    assert s["prefill_tokens"] == total - s["prefix_cache_hit_tokens"]
    # The 6 full blocks of the system prompt are computed once, by the first request scheduled
    # (later ones arrive after it finished; the first ten are chunked behind it).
    assert s["prefix_cache_hit_tokens"] >= 15 * 6 * BLOCK
    assert on.kv_blocks_free == on.kv_blocks_total


def test_kv_pressure_preemption_and_eviction(tiny):
    """A cache of 12 blocks: sequences sharing a prefix grow until they are preempted and
    recomputed (finding their own blocks), and a later unrelated prompt evicts the cache; the
    tokens are those of each sequence alone, and every block comes back."""
    n_vocab, path = tiny
    kw = dict(n_ctx=12 * BLOCK, threads=2, kv_cache_tokens=12 * BLOCK, max_batch=4)
    on, off = _pair(path, **kw)
    shared = _tokens(2 * BLOCK + 3, n_vocab, 21)
    prompts = {i: shared + _tokens(4 + i, n_vocab, 30 + i) for i in range(4)}
    got = _run(on, prompts, 90)
    alone = {sid: _run(off, {sid: p}, 90)[sid] for sid, p in prompts.items()}
    assert got == alone
    s = on.stats()
    assert s["preemptions"] > 0
    assert s["prefix_cache_hit_tokens"] > 0
    assert on.kv_blocks_free == on.kv_blocks_total == 12
    cached = s["prefix_cache_blocks"]
    assert 0 < cached <= 12
    # An unrelated prompt filling the whole cache evicts every cached block...
    big = _tokens(11 * BLOCK + 5, n_vocab, 40)
    assert _run(on, {10: big}, 2)[10] == _run(off, {10: big}, 2)[10]
    assert on.stats()["prefix_cache_blocks"] == 11, "only the big prompt's own full blocks remain"
    # ...so the shared prefix is computed again, with the same result.
    before = on.stats()["prefix_cache_hit_tokens"]
    assert _run(on, {11: prompts[0]}, 5)[11] == alone[0][:5]
    assert on.stats()["prefix_cache_hit_tokens"] == before
    assert on.kv_blocks_free == on.kv_blocks_total


def test_cancel_mid_prefill(tiny):
    """A prompt longer than one prefill chunk (512 tokens) removed after its first chunk: every
    block comes back, the finished chunk stays cached, and the next request for it starts there."""
    n_vocab, path = tiny
    on, off = _pair(path, n_ctx=1024, threads=2)
    prompt = _tokens(700, n_vocab, 50)
    on.add_sequence(1, prompt, dict(SAMPLING))
    assert on.step() == [], "the first chunk produces no token"
    assert on.kv_blocks_free < on.kv_blocks_total
    on.remove_sequence(1)
    assert on.kv_blocks_free == on.kv_blocks_total
    assert on.stats()["prefix_cache_blocks"] == 512 // BLOCK
    got = _run(on, {2: prompt}, 6)[2]
    assert got == _run(off, {2: prompt}, 6)[2]
    assert on.stats()["prefix_cache_hit_tokens"] == 512
    # Cancelling a sequence that shares blocks with a running one leaves the other intact.
    on.add_sequence(3, prompt, dict(SAMPLING))
    on.add_sequence(4, prompt, dict(SAMPLING))
    rest = [t for sid, t, *_ in on.step() if sid == 4]
    on.remove_sequence(3)
    while len(rest) < 6:
        rest += [t for sid, t, *_ in on.step() if sid == 4]
    on.remove_sequence(4)
    assert rest == _ids(got)
    assert on.kv_blocks_free == on.kv_blocks_total


def test_prefix_cache_off_reuses_nothing(tiny):
    n_vocab, path = tiny
    model = _native.EngineCore(str(path), n_ctx=512, threads=1, prefix_cache=False)
    prompt = _tokens(100, n_vocab, 3)
    _run(model, {1: prompt}, 3)
    _run(model, {2: prompt}, 3)
    s = model.stats()
    assert (s["prefix_cache_hit_tokens"], s["prefix_cache_blocks"]) == (0, 0)
    assert s["prefill_tokens"] == 2 * len(prompt)


# --------------------------------------------------------------------------------------------
# Real model
# --------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_real_05b_agent_conversation(model_05b):
    """The real 0.5B through ``fak.Engine``: a chat extended turn by turn (system prompt, user,
    assistant reply, tool output, ...) gives the same tokens and logprobs with the cache on and
    off, and the hit counter covers the previous turns."""
    import fak

    system = ("You are a careful coding agent. You fix bugs in Python repositories. Think step by "
              "step, run one shell command per turn in a ```bash block, read the output, and stop "
              "with `submit` when the tests pass. ") * 4
    turns = ["The function `parse_date` in utils/dates.py crashes on '2024-02-30'. Fix it.",
             "$ grep -n parse_date -r .\n./utils/dates.py:12:def parse_date(s):\n./tests/test_dates.py:3:from utils.dates import parse_date",
             "$ sed -n 1,30p utils/dates.py\nimport datetime\n\ndef parse_date(s):\n    y, m, d = map(int, s.split('-'))\n    return datetime.date(y, m, d)"]
    results = {}
    for cache in (True, False):
        with fak.Engine(model_05b, backend="cpu", n_ctx=2048, threads=2, prefix_cache=cache) as engine:
            messages = [{"role": "system", "content": system}]
            out = []
            for turn in turns:
                messages.append({"role": "user", "content": turn})
                c = engine.chat(messages, max_tokens=16, temperature=0.0, logprobs=3)
                out.append((c.token_ids, c.logprobs))
                messages.append({"role": "assistant", "content": c.text})
            results[cache] = (out, engine.stats())
    (got, s_on), (want, s_off) = results[True], results[False]
    assert got == want
    assert s_off["native_prefix_cache_hit_tokens"] == 0
    hits = s_on["native_prefix_cache_hit_tokens"]
    queried = s_on["native_prefix_cache_query_tokens"]
    assert queried == s_off["native_prefix_cache_query_tokens"]
    # Turns 2 and 3 find (almost) all of the previous prompt: everything but the partial blocks.
    assert hits >= 0.5 * queried, (hits, queried)
    assert s_on["native_prefill_tokens"] == s_off["native_prefill_tokens"] - hits
