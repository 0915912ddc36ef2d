#!/usr/bin/env bash
# The decode call with the split reduction merged into the page kernel (MERGE, unroll 4 and 8)
# against the shipped separate reduction, and the page-loop probes
# (../gpu-h200-2026-12-05-decode-configs/probes/, built into .gpu/probes), in one detached call;
# no vLLM needed. First the GPU kernel tests that touch the decode kernel (MERGE included), then
# PASSES passes of `python3 -m s4kv.kernels.bench --contexts 8192,32768,1024 --batches 32,8,64
# --breakdown`, each tree / configuration with its own Triton cache. Table: /root/mergeout/table.txt.
OUT=/root/mergeout; mkdir -p $OUT
cd "$(dirname "$0")/../../.."  # the repository root
root=$PWD
nvidia-smi -L >$OUT/gpu.txt
python3 -c 'import torch, triton; print(torch.__version__, triton.__version__)' >>$OUT/gpu.txt
m() { echo "[{\"kernel\":\"decode\",\"head_size\":128,\"options\":{\"MERGE\":$1}},{\"kernel\":\"decode\",\"head_size\":64,\"options\":{\"MERGE\":$1}}]" >$OUT/merge$1.json; }
m 4; m 8
{
  python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py -k "merge or decode_bench_inputs or peaky or launch_variants or fp32 or cuda_graph or reduction" 2>&1 | tail -15
  for cfg in merge4 merge8; do
    S4KV_KERNEL_CONFIG=$OUT/$cfg.json python3 -m pytest -q -x -p no:cacheprovider tests/test_kernels.py -k decode_bench_inputs 2>&1 | tail -1 | sed "s/^/$cfg check: /"
  done
} >$OUT/tests.txt 2>&1
echo tests-done >$OUT/progress
for pass in $(seq 1 "${PASSES:-2}"); do
  for spec in cur=.: merge4=.:merge4 merge8=.:merge8 unpack4=.gpu/probes/unpack4: noconst=.gpu/probes/noconst: nomax=.gpu/probes/nomax: all3=.gpu/probes/all3:; do
    name=${spec%%=*}; rest=${spec#*=}; dir=$(cd "$root/${rest%%:*}" && pwd); cfg=${rest#*:}
    [ -d "$dir/s4kv" ] || continue
    (cd "$dir" && TRITON_CACHE_DIR=/root/tc-$name PYTHONPATH="$dir" S4KV_KERNEL_CONFIG=${cfg:+$OUT/$cfg.json} \
      python3 -m s4kv.kernels.bench --contexts 8192,32768,1024 --batches 32,8,64 --breakdown \
      --json $OUT/bench-$name-$pass.json) >$OUT/bench-$name-$pass.log 2>&1
    echo "== $name pass $pass"; grep -v "^device\|flash-attn\|Warning\|_warn_once\|^ *context" $OUT/bench-$name-$pass.log
    echo "$name-$pass" >>$OUT/progress
  done >>$OUT/table.txt 2>&1
done
echo done >$OUT/done
