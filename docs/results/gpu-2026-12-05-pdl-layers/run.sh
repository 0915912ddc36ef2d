#!/usr/bin/env bash
# Programmatic dependent launch (launch option {"decode-grid": {"pdl": true}}, off by default) against
# stream order, timed per call of 8 layers in one CUDA graph (s4kv.kernels.bench --layers 8): its
# earlier timings (0.985-1.028x, 2026-12-02) were one call per graph, whose figures carry ~10 us of
# the benchmark's own (../gpu-h100-2026-12-05-layers-per-graph/). Each configuration first checked
# against the reference on the bench's inputs; two passes. No vLLM needed. Detached;
# table: /root/pdlout/table.txt.
OUT=/root/pdlout; mkdir -p $OUT
cd "$(dirname "$0")/../../.."  # the repository root
nvidia-smi -L >$OUT/gpu.txt
python3 -c 'import torch, triton; print(torch.__version__, triton.__version__)' >>$OUT/gpu.txt 2>&1
echo '[]' >$OUT/cur.json
echo '[{"kernel":"decode-grid","head_size":0,"options":{"pdl":true}}]' >$OUT/pdl.json
for cfg in cur pdl; do
  S4KV_KERNEL_CONFIG=$OUT/$cfg.json python3 -m pytest -q -x -p no:cacheprovider tests/test_kernels.py \
    -k decode_bench_inputs 2>&1 | tail -1 | sed "s/^/$cfg check: /"
done >$OUT/checks.txt
for pass in $(seq 1 "${PASSES:-2}"); do
  for cfg in cur pdl; do
    S4KV_KERNEL_CONFIG=$OUT/$cfg.json python3 -m s4kv.kernels.bench --contexts 8192,32768,1024 --batches 32,8,64 \
      --breakdown --layers 8 --json $OUT/bench-$cfg-$pass.json >$OUT/bench-$cfg-$pass.log 2>&1
    echo "== $cfg pass $pass"; grep -v "flash-attn\|Warning\|_warn_once\|WARNING" $OUT/bench-$cfg-$pass.log
    echo "$cfg-$pass" >>$OUT/progress
  done >>$OUT/table.txt 2>&1
done
echo done >$OUT/done
