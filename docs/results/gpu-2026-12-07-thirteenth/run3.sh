#!/usr/bin/env bash
# Thirteenth session, fourth call: the page's query terms computed one page ahead (TERMS_NEXT,
# terms-next.diff here, applied to the tree) against the shipped loop, any GPU, no vLLM. From the
# repository root: bash docs/results/gpu-2026-12-07-thirteenth/run3.sh /root/tn   (about 3 minutes)
# Each configuration is checked against the reference on the bench's inputs, then timed with
# `python3 -m s4kv.kernels.bench --contexts 8192,32768 --batches 32,8 --breakdown`, from DRAM and with
# the pages in L2 (--alias-blocks 128), two passes, configurations alternating. (The lease's run also
# selected the launch-variant tests, which need vLLM: they failed on its import and, under -x, stopped
# the check; the bench-input check alone was run again by hand in the next call: 2 passed each.)
set -u
O=${1:?DIR}
mkdir -p "$O"
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c 'import torch, triton; print(torch.__version__, triton.__version__)'; date -u; } >"$O/versions.txt" 2>&1
echo '[]' >"$O/shipped.json"
echo '[{"kernel":"decode","head_size":128,"options":{"TERMS_NEXT":true}}]' >"$O/tn.json"
echo '[{"kernel":"decode","head_size":128,"options":{"TERMS_NEXT":true,"maxnreg":168}},
       {"kernel":"decode-grid","head_size":0,"options":{"programs_per_sm":3}}]' >"$O/tn-r168.json"
NAMES="shipped tn tn-r168"
for n in $NAMES; do
  t0=$SECONDS
  S4KV_KERNEL_CONFIG=$O/$n.json PYTHONPATH=$PWD:$PWD/tests timeout 150 python3 -m pytest -q -x -p no:cacheprovider \
    tests/test_kernels.py -k decode_bench_inputs >"$O/check-$n.log" 2>&1
  echo "check $n: exit $? after $((SECONDS - t0)) s: $(tail -1 "$O/check-$n.log")" >>"$O/progress"
done
for pass in 1 2; do
  for a in 0 128; do
    for n in $NAMES; do
      t0=$SECONDS
      S4KV_KERNEL_CONFIG=$O/$n.json timeout 90 python3 -m s4kv.kernels.bench --contexts 8192,32768 --batches 32,8 \
        --breakdown $( [ "$a" = 0 ] || echo --alias-blocks "$a" ) --json "$O/$n-alias$a-pass$pass.json" \
        >"$O/$n-alias$a-pass$pass.log" 2>&1
      echo "$n-alias$a-pass$pass: exit $? after $((SECONDS - t0)) s" >>"$O/progress"
    done
  done
done
python3 tools/kernel_bench_table.py "$O"/*-pass?.json >"$O/table.txt" 2>&1
tar -czf /tmp/tn.tgz -C "$O" . && mv /tmp/tn.tgz "$O/tn.tgz"
echo done >>"$O/progress"
