#!/usr/bin/env bash
# FIRST_OFFSET (s4kv.kernels.decode._page_loop: one offset per split instead of the running max)
# against the default, on whatever GPU the device tool lends, no vLLM needed (one call, about 3 min):
#   1. the decode kernel bench at 8k x 32 and 32k x 8, from DRAM and with the pages in L2
#      (--alias-blocks 128), default and FIRST_OFFSET alternating, two passes
#   2. tools/gpu/diag_tail.py: both against the PyTorch path on the bench's inputs
#   3. the kernel tests of the option on the GPU (pytest from wheels carried in .gpu/pytest-wheels)
# From the repository root: OUT=DIR bash docs/results/gpu-2026-12-06-first-offset/run.sh
set -u
O=${OUT:?OUT=DIR}
mkdir -p "$O"
export PYTHONPATH="$PWD"
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c 'import torch, triton; print(torch.__version__, triton.__version__)'; date -u; } > "$O/versions.txt" 2>&1
for _ in 1 2 3; do python3 -c 'import s4kv.kernels.bench' 2>/dev/null && break; sleep 2; done
echo '[{"kernel": "decode", "head_size": 128, "options": {"FIRST_OFFSET": true}}]' > /tmp/first-offset.json
for pass in 1 2; do
  for cfg in default first-offset; do
    for a in 0 128; do
      t0=$SECONDS
      name="bench-$cfg-alias$a-pass$pass"
      if [ "$cfg" = first-offset ]; then cfgenv="S4KV_KERNEL_CONFIG=/tmp/first-offset.json"; else cfgenv="S4KV_NO_CONFIG=1"; fi
      env "$cfgenv" timeout 90 python3 -m s4kv.kernels.bench --contexts 8192,32768 --batches 32,8 --breakdown \
        $( [ "$a" = 0 ] || echo --alias-blocks "$a" ) --json "$O/$name.json" > "$O/$name.log" 2>&1
      echo "$name: exit $? after $((SECONDS - t0)) s" >> "$O/progress"
    done
  done
done
t0=$SECONDS
timeout 90 python3 tools/gpu/diag_tail.py --variants default,FIRST_OFFSET \
  --shapes 8192x32,32768x8,8256x32,33023x8,320x2 --repeats 1 > "$O/diag.log" 2>&1
echo "diag: exit $? after $((SECONDS - t0)) s" >> "$O/progress"
pip install -q --no-index --find-links .gpu/pytest-wheels pytest > "$O/pip.log" 2>&1
t0=$SECONDS
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py -k "first_offset or first-offset" > "$O/tests.log" 2>&1
echo "tests: exit $? after $((SECONDS - t0)) s" >> "$O/progress"
