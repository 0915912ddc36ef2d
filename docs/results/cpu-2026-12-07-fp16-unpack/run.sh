#!/usr/bin/env bash
# Two device calls, any GPU, no vLLM, from the repository root (each under 10 minutes):
#   OUT=$OUT bash docs/results/cpu-2026-12-07-fp16-unpack/run.sh time    (about 6 minutes)
#   OUT=$OUT bash docs/results/cpu-2026-12-07-fp16-unpack/run.sh tests   (about 5 minutes)
# time: the Gluon probe's split-keeping versions against the shipped kernel (gluon-pages run3.sh),
#   then the shipped decode kernel with bf16 operands (the default) and with fp16 operands (the
#   option, now with the 6-instruction unpack), each first checked against the reference, two
#   passes (tools/gpu/decode_configs.sh).
# tests: the GPU kernel tests (an fp16 model's page loop takes the new unpack by default) and the
#   unpack's emulator tests.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/device.txt"
case "${1:-time}" in
  time)
    (cd docs/results/gpu-2026-12-07-gluon-pages && OUT=$OUT timeout 300 bash run3.sh) >"$OUT/gluon.log" 2>&1
    grep -h '{' "$OUT/gluon.log" | cut -c1-600
    FP16='[{"kernel":"decode-grid","head_size":0,"options":{"fp16_operands":true}}]'
    CONFIGS="bf16-operands=[] fp16-operands=$FP16" PASSES=2 POINTS="8192,32768,1024 32,8,64" OUT=$OUT \
      timeout 250 bash tools/gpu/decode_configs.sh 2>&1 | tee "$OUT/decode-configs.log" ;;
  tests)
    timeout 560 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py tests/test_code_unpack.py \
      2>&1 | tail -25 | tee "$OUT/tests.log" ;;
esac
