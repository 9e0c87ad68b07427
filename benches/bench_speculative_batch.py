"""Where speculation stops paying as the batch grows (issue 32's off-switch): the agent-trace
prompts of ``bench_speculative.py`` decoded C at a time, with and without drafts, on one engine.

For each concurrency C and condition: the requests (real agent prompts rendered with the served
model's template, as ``bench_speculative.py`` builds them) go in groups of C; each group is added at
once, prefilled, then decoded together until every one ends (greedy, ``--max-tokens``). Measured:
decode tokens / decode wall time (from the step after the group's last first token to its last
token), summed over groups. One engine serves every run (the prefix cache keeps the prompts after
their first prefill; each request names its condition), with ``speculative_max_batch`` above the
largest C so that drafts are never switched off: this measures the raw effect the off-switch's
default is chosen from. Outputs are checked identical to the condition ``none``.

Run: ``PYTHONPATH=python python benches/bench_speculative_batch.py --model M.gguf
--concurrency 1,4,16 --conditions none,ngram:4 [--every 3 --steps 2] --json out.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_speculative import FLEET_TAR, TRAJ_DIR, load_trajectories, requests_of  # noqa: E402
from machine import machine  # noqa: E402


def decode_group(model: Any, first_id: int, prompts: list[list[int]], sampling: dict[str, Any]) -> tuple[dict[int, list[int]], int, float]:
    """Adds ``prompts`` at once and steps until all end: ``(tokens by id, decode tokens, decode seconds)``,
    decode counted from the first step after every sequence has its first token."""
    ids = list(range(first_id, first_id + len(prompts)))
    for i, p in zip(ids, prompts):
        model.add_sequence(i, p, sampling)
    toks: dict[int, list[int]] = {i: [] for i in ids}
    done: set[int] = set()
    t_dec = None
    n_dec = 0
    while len(done) < len(ids):
        out = model.step()
        if not out and model.n_running == 0 and model.n_waiting == 0:
            raise RuntimeError("sequences vanished")
        for sid, tok, _lp, _top, fin in out:
            toks[sid].append(tok)
            if t_dec is not None:
                n_dec += 1
            if fin is not None:
                done.add(sid)
        if t_dec is None and all(toks[i] for i in ids):
            t_dec = time.perf_counter()
    return toks, n_dec, time.perf_counter() - (t_dec or time.perf_counter())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--conditions", default="none,ngram:4")
    ap.add_argument("--every", type=int, default=3)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--max-prompt", type=int, default=4096)
    ap.add_argument("--limit", type=int, default=16, help="requests used (the first N)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", dest="json_out", default=None)
    a = ap.parse_args()

    from fak import _native
    from fak.agent.tools import tool_schemas
    from fak.engine.client import _template_or_none
    from fak.tokenizer import Tokenizer, read_gguf_metadata

    path = Path(a.model)
    metadata = read_gguf_metadata(path)
    tok = Tokenizer.from_gguf_metadata(metadata)
    template = _template_or_none(metadata, None)
    assert template is not None, "the model needs a chat template"
    tools = tool_schemas(True)
    prompts: list[list[int]] = []
    for _name, traj in load_trajectories([str(TRAJ_DIR), str(FLEET_TAR)])[:: a.every]:
        for _turn, msgs in requests_of(traj, a.steps):
            text = template.render(msgs, tools=tools if traj.get("protocol") == "tools" else None, add_generation_prompt=True)
            p = tok.encode(text, add_special=False, parse_special=True)
            if len(p) <= a.max_prompt:
                prompts.append(p)
    prompts = prompts[: a.limit]
    concs = [int(c) for c in a.concurrency.split(",")]
    conds = a.conditions.split(",")
    n_ctx = a.max_prompt + a.max_tokens + 64
    sampling = {"temperature": 0.0, "max_tokens": a.max_tokens, "stop_ids": sorted(tok.eog_ids)}
    results: list[dict[str, Any]] = []
    # One engine for every run: the prefix cache holds the prompts after their first prefill, the
    # condition is each request's own "speculative" setting.
    c_max = max(concs)
    model = _native.EngineCore(str(path), n_ctx=n_ctx, threads=a.threads, max_batch=c_max,
                               kv_cache_tokens=(len(prompts) + c_max) * n_ctx, speculative_max_batch=c_max + 1)
    next_id = 0
    for c in concs:
        base: dict[int, list[int]] | None = None
        base_tps = None
        for cond in conds:
            before = model.stats()
            all_toks: dict[int, list[int]] = {}
            n_tok = 0
            secs = 0.0
            for g in range(0, len(prompts), c):
                toks, n, s = decode_group(model, next_id, prompts[g:g + c], {**sampling, "speculative": cond})
                all_toks.update({k - next_id + g: v for k, v in toks.items()})
                next_id += len(toks)
                n_tok += n
                secs += s
            after = model.stats()
            st = {k: after[k] - before[k] for k in ("spec_draft_tokens", "spec_accepted_tokens")}
            if base is None:
                base = all_toks
            tps = n_tok / secs if secs else 0.0
            base_tps = base_tps or tps
            row = {"concurrency": c, "condition": cond, "requests": len(prompts), "decode_tokens": n_tok, "decode_seconds": secs,
                   "decode_tok_s": tps, "speedup_vs_none": tps / base_tps if base_tps else 0.0,
                   "draft_tokens": st["spec_draft_tokens"], "accepted_tokens": st["spec_accepted_tokens"],
                   "identical": all_toks == base}
            results.append(row)
            print(json.dumps(row), flush=True)
    print("| concurrency | condition | decode tok/s | × none | accepted / drafted | outputs identical |\n|---:|---|---:|---:|---:|---|")
    for r in results:
        print(f"| {r['concurrency']} | {r['condition']} | {r['decode_tok_s']:.1f} | {r['speedup_vs_none']:.2f} "
              f"| {r['accepted_tokens']} / {r['draft_tokens']} | {r['identical']} |")
    if a.json_out:
        Path(a.json_out).write_text(json.dumps({"provenance": "MEASURED", "date": time.strftime("%Y-%m-%d"), "model": path.name,
                                                "machine": machine(), "max_tokens": a.max_tokens, "results": results}, indent=1))


if __name__ == "__main__":
    main()
