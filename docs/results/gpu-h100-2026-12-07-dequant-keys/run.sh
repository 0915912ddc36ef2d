#!/usr/bin/env bash
# DEQUANT_KEYS (dequant-keys.diff) against the shipped decode kernel, on whatever GPU the device tool
# lends, no vLLM needed (one call, about 4 minutes). Here first: bash <this folder>/make-tree.sh
# Call: carry [".gpu/dq", ".gpu/dqnc", ".gpu/pytest-wheels"], command
#   OUT=$OUT bash docs/results/gpu-h100-2026-12-07-dequant-keys/run.sh
#   1. the decode kernel bench at 8k x 32 and 32k x 8, from DRAM (two passes) and with the pages in L2
#      (--alias-blocks 128, one pass): the shipped kernel (this tree) and the variant (.gpu/dq),
#      alternating; in the first DRAM pass also the variant without its clamp (.gpu/dqnc, a timing probe)
#   2. tools/gpu/diag_tail.py in both trees: the decode call against the PyTorch path on the bench's inputs
#   3. the variant tree's decode kernel tests on the GPU (pytest from .gpu/pytest-wheels), where vLLM is
#      importable (after the bundle and `source /root/s4kv-env.sh`); skipped otherwise
set -u
O=${OUT:?OUT=DIR}
mkdir -p "$O"
HERE=$PWD
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c 'import torch, triton; print(torch.__version__, triton.__version__)'; date -u; } > "$O/versions.txt" 2>&1
bench() {  # NAME TREE ALIAS
  local name=$1 tree=$2 a=$3 t0=$SECONDS
  (cd "$tree" && PYTHONPATH="$tree" timeout 120 python3 -m s4kv.kernels.bench --contexts 8192,32768 \
    --batches 32,8 --breakdown $( [ "$a" = 0 ] || echo --alias-blocks "$a" ) --json "$O/$name.json") > "$O/$name.log" 2>&1
  echo "$name: exit $? after $((SECONDS - t0)) s" >> "$O/progress"
}
for run in 0-pass1 128-pass1 0-pass2; do
  bench "shipped-alias$run" "$HERE" "${run%-*}"
  bench "dq-alias$run" "$HERE/.gpu/dq" "${run%-*}"
  [ $run = 0-pass1 ] && bench "dqnc-alias$run" "$HERE/.gpu/dqnc" "${run%-*}"
done
python3 tools/kernel_bench_table.py "$O"/*-alias0-pass1.json "$O"/*-alias0-pass2.json "$O"/*-alias128-pass1.json \
  > "$O/summary.txt" 2>&1
for t in shipped dq; do
  tree=$HERE; [ $t = dq ] && tree=$HERE/.gpu/dq
  t0=$SECONDS
  (cd "$tree" && PYTHONPATH="$tree" timeout 100 python3 tools/gpu/diag_tail.py --variants default \
    --shapes 8192x32,32768x8,8256x32,33023x8,320x2 --repeats 1) > "$O/diag-$t.log" 2>&1
  echo "diag-$t: exit $? after $((SECONDS - t0)) s" >> "$O/progress"
done
# the decode tests import vLLM's FlashAttention (s4kv/kernels/flash.py): without the bundle they are no
# result (40 of 45 failed on that import in the tenth session's run)
if python3 -c 'import vllm' 2>/dev/null; then
  pip install -q --no-index --find-links "$HERE/.gpu/pytest-wheels" pytest > "$O/pip.log" 2>&1
  t0=$SECONDS
  (cd "$HERE/.gpu/dq" && PYTHONPATH="$HERE/.gpu/dq:$HERE/.gpu/dq/tests:${PYTHONPATH:-}" timeout 200 python3 -m pytest -q \
    -p no:cacheprovider tests/test_kernels.py -k "decode or peaky or fp16_operands or fp32_model") > "$O/tests-dq.log" 2>&1
  echo "tests-dq: exit $? after $((SECONDS - t0)) s" >> "$O/progress"
else
  echo "tests-dq: skipped, no vLLM (source /root/s4kv-env.sh after the bundle)" >> "$O/progress"
fi
echo done >> "$O/progress"
# the device returns at most 8 files from $OUT (the tenth session's run lacked this line and lost the
# shipped kernel's records)
bash "$HERE/tools/gpu/fit_out.sh" "$O"
