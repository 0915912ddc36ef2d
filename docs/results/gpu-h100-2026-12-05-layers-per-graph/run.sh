#!/usr/bin/env bash
# The decode call timed per call of 8 layers' calls in one CUDA graph (s4kv.kernels.bench --layers 8,
# each layer on its own cache) beside the one-call graph, bf16 FlashAttention the same way (vLLM
# 0.24.0 from the bundle), for this tree and two page-loop probes (../gpu-h200-2026-12-05-decode-configs/probes/,
# with this tree's bench.py copied in), two passes; then the GPU kernel tests. Detached;
# table: /root/layersout/table.txt. BENCH_CONFIG (an S4KV_KERNEL_CONFIG file, benches only): since
# 2026-12-06 this tree launches with programmatic dependent launch on sm90 and the probes (older
# trees) do not, so pass one with {"decode-grid": {"pdl": false}} to compare them alike.
OUT=/root/layersout; mkdir -p $OUT
cd "$(dirname "$0")/../../.."  # the repository root
root=$PWD
[ -f /root/s4kv-env.sh ] && source /root/s4kv-env.sh  # vLLM's FlashAttention, when the bundle is installed
nvidia-smi -L >$OUT/gpu.txt
python3 -c 'import torch, triton; print(torch.__version__, triton.__version__)' >>$OUT/gpu.txt 2>&1
python3 -c 'import vllm; print("vllm", vllm.__version__)' >>$OUT/gpu.txt 2>&1 || echo "no vLLM: no FlashAttention column" >>$OUT/gpu.txt
for pass in $(seq 1 "${PASSES:-2}"); do
  for spec in cur=. noconst=.gpu/probes/noconst all3=.gpu/probes/all3; do
    name=${spec%%=*}; dir=$(cd "$root/${spec#*=}" && pwd)
    (cd "$dir" && TRITON_CACHE_DIR=/root/tc-$name PYTHONPATH="$dir:/tmp/site" S4KV_KERNEL_CONFIG=${BENCH_CONFIG:-} \
      python3 -m s4kv.kernels.bench --contexts 8192,32768,1024 --batches 32,8,64 --breakdown --layers 8 \
      --json $OUT/bench-$name-$pass.json) >$OUT/bench-$name-$pass.log 2>&1
    echo "== $name pass $pass"; grep -v "flash-attn\|Warning\|_warn_once\|WARNING" $OUT/bench-$name-$pass.log
    echo "$name-$pass" >>$OUT/progress
  done >>$OUT/table.txt 2>&1
done
[ -f /root/s4kv-env.sh ] && OUT=$OUT/tests bash tools/gpu/run-on-device.sh tests >/dev/null 2>&1
echo tests >>$OUT/progress
echo done >$OUT/done
