#!/usr/bin/env bash
# head_dim-64 diagnosis on the device (one launch configuration per process), then the decode sweep.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
T=tools/gpu/tune_kernels.py
OUT=${OUT:-/tmp/out}
CUDA_LAUNCH_BLOCKING=1 timeout 100 python3 $T d64 > "$OUT/d64-default-blocking.log" 2>&1
for cfg in "--store num_warps=8" "--prefill num_stages=1" "--prefill num_warps=2" "--prefill num_warps=8,num_stages=1"; do
  echo "### $cfg"; timeout 90 python3 $T d64 $cfg 2>&1 | grep -v -E "^(CUDA|For |Compile|Search)"
done > "$OUT/d64-configs.log" 2>&1
timeout 150 compute-sanitizer --tool racecheck --print-limit 10 python3 -c "
import sys, torch; sys.path[:0] = ['tests', 'tools/gpu']
import tune_kernels as t; t.first_key_mismatch(torch.bfloat16)" > "$OUT/racecheck-store.log" 2>&1
timeout 150 compute-sanitizer --tool memcheck --print-limit 10 python3 -c "
import sys, torch; sys.path[:0] = ['tests', 'tools/gpu']
import debug_kernels as dk; dk.check_steps(9, 3, 64, torch.bfloat16)" > "$OUT/memcheck-steps.log" 2>&1
timeout 200 python3 $T decode --json "$OUT/decode.json" > "$OUT/decode.log" 2>&1
grep -E "best|copy" "$OUT/decode.log"
