"""Speculative decoding on replayed agent traffic (issue 32, docs/speculative.md): acceptance,
tokens per forward and decode tokens/s of each draft source against decoding without
speculation, with the outputs checked identical.

**Replay.** The committed SWE-bench agent trajectories (``benches/results/swebench-cpu-1.5b/
trajectories/``: the text and tools protocols of the 1.5B's CPU runs; ``benches/results/
fleet-gpu-2026-12-06/j1-fleet-w14.tar.xz``: the GPU fleet's 14 tools-protocol runs) hold each
agent step's conversation. For ``--steps`` of each trajectory's assistant turns (spread over the
run: the first, the last, and between), the conversation before that turn is rendered with the
served model's chat template (the tools protocol with the agent's tool schemas,
``fak.agent.tools.tool_schemas``), and the model's own reply is generated greedily (``max_tokens``
``--max-tokens``, its end-of-generation ids) under each condition of ``--conditions``, one
request at a time (concurrency 1), on one ``fak._native.EngineCore`` with the prefix cache on (a
step's prompt extends the previous step's, so only its new part is prefilled, once; the
conditions then hit it whole). The recorded replies were the 1.5B's; the model here writes its
own, so acceptance is measured on the replayed model's outputs given real agent prompts.

Per request and condition: tokens generated, forwards after the first token (decode/verify
steps), draft tokens, accepted tokens, decode seconds (wall time of those forwards), and whether
the tokens and log-probabilities equal those without speculation. Reported per condition:
acceptance rate (accepted / drafted), tokens per forward ((tokens − 1) / forwards), decode
tokens/s and its ratio to ``none``, and the count of requests whose output differed (must be 0).

Run: ``PYTHONPATH=python python benches/bench_speculative.py --json out.json`` (``--model`` a
GGUF, default the real Qwen2.5-Coder-0.5B through ``../shared/models/fetch-model``; ``--model
tiny`` writes the tiny synthetic model). Results: ``benches/results/speculative.md``.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))
from machine import machine  # noqa: E402  (benches/machine.py, beside this script)

TRAJ_DIR = REPO / "benches" / "results" / "swebench-cpu-1.5b" / "trajectories"
FLEET_TAR = REPO / "benches" / "results" / "fleet-gpu-2026-12-06" / "j1-fleet-w14.tar.xz"
MODEL_05B = "qwen2.5-coder-0.5b-instruct-mixed"




def load_trajectories(sources: list[str]) -> list[tuple[str, dict[str, Any]]]:
    """``(name, trajectory)`` of every ``*.traj.json`` in the given folders and ``.tar.xz`` files."""
    out: list[tuple[str, dict[str, Any]]] = []
    for src in sources:
        p = Path(src)
        if p.is_dir():
            for f in sorted(p.glob("*.traj.json")):
                out.append((f"{p.parent.name}/{f.name}", json.loads(f.read_text())))
        else:
            with tarfile.open(p) as tar:
                for m in sorted(tar.getmembers(), key=lambda m: m.name):
                    if m.name.endswith(".traj.json"):
                        data = tar.extractfile(m)
                        assert data is not None
                        out.append((f"{p.name}:{Path(m.name).name}", json.load(io.TextIOWrapper(data))))
    return out


def requests_of(traj: dict[str, Any], n_steps: int) -> list[tuple[int, list[dict[str, Any]]]]:
    """``(turn index, messages before it)`` for ``n_steps`` assistant turns spread over the run."""
    msgs = traj["messages"]
    turns = [i for i, m in enumerate(msgs) if m.get("role") == "assistant"]
    if not turns:
        return []
    if len(turns) <= n_steps:
        pick = turns
    else:
        pick = sorted({turns[round(j * (len(turns) - 1) / (n_steps - 1))] for j in range(n_steps)}) if n_steps > 1 \
            else [turns[0]]
    return [(i, msgs[:i]) for i in pick]


def run_request(model: Any, seq_id: int, prompt: list[int], sampling: dict[str, Any]) -> dict[str, Any]:
    """One request alone through ``model``: its tokens, log-probabilities, forwards after the
    first token, decode seconds, and the speculation counters' deltas."""
    before = model.stats()
    model.add_sequence(seq_id, prompt, sampling)
    toks: list[int] = []
    lps: list[float] = []
    forwards = 0
    t_first = None
    t_end = None
    while True:
        t0 = time.perf_counter()
        out = model.step()
        t1 = time.perf_counter()
        if t_first is not None:
            forwards += 1
        done = False
        for sid, tok, lp, _top, fin in out:
            assert sid == seq_id
            toks.append(tok)
            lps.append(lp)
            done = done or fin is not None
        if out and t_first is None:
            t_first = t1
        if done:
            t_end = t1
            break
        if not out and model.n_running == 0 and model.n_waiting == 0:
            raise RuntimeError("the sequence vanished")
        _ = t0
    after = model.stats()
    return {
        "tokens": toks,
        "logprobs": lps,
        "forwards": forwards,
        "decode_s": (t_end or 0.0) - (t_first or 0.0),
        "drafted": after["spec_draft_tokens"] - before["spec_draft_tokens"],
        "accepted": after["spec_accepted_tokens"] - before["spec_accepted_tokens"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="GGUF path, or 'tiny' [default: the real 0.5B]")
    ap.add_argument("--sources", nargs="*", default=[str(TRAJ_DIR), str(FLEET_TAR)])
    ap.add_argument("--steps", type=int, default=3, help="assistant turns replayed per trajectory")
    ap.add_argument("--limit", type=int, default=None, help="first N trajectories only")
    ap.add_argument("--every", type=int, default=1, help="every N-th trajectory only (sorted by name)")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--max-prompt", type=int, default=6144, help="skip requests with longer prompts (tokens)")
    ap.add_argument("--conditions", default="none,ngram:4,ngram:8,suffix:8,suffix:16")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", dest="json_out", default=None)
    args = ap.parse_args()

    from fak import _native
    from fak.agent.tools import tool_schemas
    from fak.engine.client import _template_or_none
    from fak.tokenizer import Tokenizer, read_gguf_metadata

    if args.model == "tiny":
        from fak import synth

        path = synth.write_tiny_model(Path(tempfile.mkdtemp()) / "tiny.gguf", "qwen2")
    elif args.model:
        path = Path(args.model)
    else:
        fetch = REPO.parent / "shared" / "models" / "fetch-model"
        path = Path(subprocess.run([str(fetch), MODEL_05B], check=True, capture_output=True, text=True).stdout.strip())
    metadata = read_gguf_metadata(path)
    tok = Tokenizer.from_gguf_metadata(metadata)
    template = _template_or_none(metadata, None)
    assert template is not None, "the model needs a chat template"
    stop_ids = sorted(tok.eog_ids)
    conditions = args.conditions.split(",")
    n_ctx = args.max_prompt + args.max_tokens + 64
    model = _native.EngineCore(str(path), n_ctx=n_ctx, threads=args.threads, max_batch=4,
                          kv_cache_tokens=4 * n_ctx)
    trajs = load_trajectories(args.sources)[:: args.every][: args.limit]
    tools = tool_schemas(True)
    rows: list[dict[str, Any]] = []
    seq = 0
    t_start = time.time()
    for name, traj in trajs:
        protocol = traj.get("protocol", "text")
        for turn, msgs in requests_of(traj, args.steps):
            text = template.render(msgs, tools=tools if protocol == "tools" else None, add_generation_prompt=True)
            prompt = tok.encode(text, add_special=False, parse_special=True)
            if len(prompt) > args.max_prompt:
                print(f"skip {name} turn {turn}: {len(prompt)} tokens", file=sys.stderr)
                continue
            base = None
            for cond in conditions:
                seq += 1
                r = run_request(model, seq, prompt, {"temperature": 0.0, "max_tokens": args.max_tokens,
                                                     "stop_ids": stop_ids, "speculative": cond})
                if base is None:
                    base = r
                r["identical"] = (r["tokens"], r["logprobs"]) == (base["tokens"], base["logprobs"])
                rows.append({"trajectory": name, "protocol": protocol, "turn": turn, "prompt_tokens": len(prompt),
                             "condition": cond, **{k: v for k, v in r.items() if k not in ("tokens", "logprobs")},
                             "n_tokens": len(r["tokens"])})
                print(f"{name} turn {turn} ({len(prompt)} tok) {cond:>10}: {len(r['tokens'])} tokens, "
                      f"{r['forwards']} forwards, {r['accepted']}/{r['drafted']} accepted, "
                      f"{r['decode_s']:.2f} s, identical={r['identical']}", file=sys.stderr, flush=True)
    summary: dict[str, Any] = {}
    base_tps = None
    for cond in conditions:
        rs = [r for r in rows if r["condition"] == cond]
        toks = sum(r["n_tokens"] - 1 for r in rs)
        fw = sum(r["forwards"] for r in rs)
        secs = sum(r["decode_s"] for r in rs)
        drafted = sum(r["drafted"] for r in rs)
        accepted = sum(r["accepted"] for r in rs)
        tps = toks / secs if secs else 0.0
        base_tps = base_tps or tps
        by_proto = {}
        for proto in sorted({r["protocol"] for r in rs}):
            ps = [r for r in rs if r["protocol"] == proto]
            pt, pf = sum(r["n_tokens"] - 1 for r in ps), sum(r["forwards"] for r in ps)
            pd, pa = sum(r["drafted"] for r in ps), sum(r["accepted"] for r in ps)
            by_proto[proto] = {"requests": len(ps), "tokens_per_forward": pt / pf if pf else 0.0,
                               "acceptance": pa / pd if pd else 0.0}
        summary[cond] = {
            "requests": len(rs), "decode_tokens": toks, "forwards": fw, "draft_tokens": drafted,
            "accepted_tokens": accepted, "acceptance": accepted / drafted if drafted else 0.0,
            "tokens_per_forward": toks / fw if fw else 0.0, "decode_seconds": secs, "decode_tok_s": tps,
            "speedup_vs_none": tps / base_tps if base_tps else 0.0,
            "median_request_speedup": statistics.median(
                [b["decode_s"] / r["decode_s"] for r, b in zip(rs, [x for x in rows if x["condition"] == conditions[0]])
                 if r["decode_s"] > 0]) if rs else 0.0,
            "not_identical": sum(not r["identical"] for r in rs),
            "by_protocol": by_proto,
        }
    result = {"provenance": "MEASURED", "date": time.strftime("%Y-%m-%d"), "model": str(path.name),
              "machine": machine(), "threads": model.config["threads"], "max_tokens": args.max_tokens,
              "steps_per_trajectory": args.steps, "trajectories": len(trajs), "wall_s": time.time() - t_start,
              "summary": summary, "rows": rows}
    print(json.dumps(summary, indent=1))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
