#!/usr/bin/env bash
# (The change it timed is reverted: to run it again, `git apply fp16-unpack.diff` on d2602ea first.)
# The lease plan, any GPU, from the repository root (vLLM only for the tests step). Detached, so that it outlives a call:
#   call 1: (setsid nohup bash docs/results/gpu-h100-2026-12-07-fp16-unpack/run.sh all /root/fp16 \
#             >/root/fp16.log 2>&1 </dev/null &); sleep 540; cat /root/fp16/progress
#   call 2 (within 30 s): while ! grep -q done /root/fp16/progress; do sleep 5; done; cp /root/fp16/* $OUT/
# or one step alone: run.sh STEP DIR (STEP: time, tests, gluon). In order of priority:
# time: the shipped decode kernel with bf16 operands (the default) and with fp16 operands (the option,
#   now with the 6/5-instruction unpacks), each first checked against the reference, two passes
#   (tools/gpu/decode_configs.sh; about 2.5 minutes);
# tests: the GPU kernel tests (an fp16 model's page loop takes the new unpacks by default) and the
#   unpack's emulator tests (about 3.5 minutes); 62 of them need vLLM's FlashAttention, so the vLLM
#   bundle first (without it, on 2026-12-07: 62 failed on the import, 27 passed);
# gluon: the Gluon probe's split-keeping versions against the shipped kernel (gluon-pages run3.sh,
#   about 3 minutes).
set -u
step=${1:-all}
dir=${2:-${OUT:-/tmp/out}}
mkdir -p "$dir"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >"$dir/device.txt"
run_step() {
  echo "$(date +%T) $1 start" >>"$dir/progress"
  case "$1" in
    time)
      FP16='[{"kernel":"decode-grid","head_size":0,"options":{"fp16_operands":true}}]'
      CONFIGS="bf16-operands=[] fp16-operands=$FP16" PASSES=2 POINTS="8192,32768,1024 32,8,64" OUT=$dir \
        timeout 300 bash tools/gpu/decode_configs.sh >"$dir/decode-configs.log" 2>&1 ;;
    tests)
      timeout 400 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py tests/test_code_unpack.py \
        >"$dir/tests.log" 2>&1 ;;
    gluon)
      (cd docs/results/gpu-2026-12-07-gluon-pages && OUT=$dir timeout 300 bash run3.sh) >"$dir/gluon.log" 2>&1 ;;
  esac
  echo "$(date +%T) $1 end rc $?" >>"$dir/progress"
}
if [ "$step" = all ]; then
  for s in time tests gluon; do run_step $s; done
  echo done >>"$dir/progress"
else
  run_step "$step"
fi
