#!/usr/bin/env bash
# A/B: the fleet agent through fak serve (0.5B, CPU) without and with --serve-inline-reads.
set -u
source /work/venv/bin/activate
M=$HOME/.cache/fak/models/qwen2.5-coder-0.5b-instruct-mixed.gguf
POLICY=$(python -c 'import fak.swebench.serve as s; print(s.default_policy_path())')
IDS=psf__requests-2931,pytest-dev__pytest-7236,sympy__sympy-12481,sympy__sympy-14711,sympy__sympy-17655,sympy__sympy-24539
for mode in off on; do
  out=/work/runs/inline-$mode; rm -rf $out; mkdir -p $out
  flag=; [ $mode = on ] && flag=--serve-inline-reads
  fak serve --gguf $M --backend cpu --addr 127.0.0.1:8210 --n-ctx 8192 --max-concurrency 2 \
      --policy $POLICY --audit-log $out/audit.jsonl $flag > $out/serve.log 2>&1 &
  SP=$!
  for i in $(seq 120); do curl -sf 127.0.0.1:8210/health > /dev/null && break; sleep 1; done
  s=$(date +%s)
  fak swebench run --agent fleet --gateway 127.0.0.1:8210 --dataset /work/runs/smoke14.jsonl \
      --filter $IDS --repos /tmp/mirror --workers 2 --max-steps 12 --max-tokens 256 --no-live \
      --output $out/run > $out/run.log 2>&1
  echo "$mode: exit $? in $(( $(date +%s) - s )) s"
  kill $SP; wait $SP 2>/dev/null
done
