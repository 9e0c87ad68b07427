import json, sys, glob
for mode in ("off", "on"):
    rows = []
    for f in sorted(glob.glob(f"/work/runs/inline-{mode}/run/trajectories/*.traj.json")):
        t = json.load(open(f))
        tok = t.get("tokens") or {}
        calls = sum(len(s.get("actions") or []) for s in t["steps"])
        inline = t.get("n_inline_reads", 0) or sum(len(s.get("inline_reads") or []) for s in t["steps"])
        rows.append((t["instance_id"], t["n_steps"], calls, inline, t["n_repeated"], t["n_resampled"],
                     tok.get("prompt", tok.get("prompt_tokens")), tok.get("completion", tok.get("completion_tokens")), t["exit_reason"]))
    print(mode, "tokens keys:", list((t.get("tokens") or {}).keys()) if rows else None)
    for r in rows: print("  ", r)
    if rows:
        print("  total steps", sum(r[1] for r in rows), "calls", sum(r[2] for r in rows), "inline", sum(r[3] for r in rows),
              "repeated", sum(r[4] for r in rows), "prompt", sum(r[6] or 0 for r in rows), "completion", sum(r[7] or 0 for r in rows))
