#!/usr/bin/env bash
# The end-to-end run of this lease, detached, after the bundle's setup. From the repository root:
#   setsid nohup bash docs/results/gpu-2026-12-06-first-offset-timed/engine.sh shipped|first-offset /root/acc \
#     >/root/engine.log 2>&1 </dev/null &
# 1. patch: the S4 KV series onto the bundle's vLLM 0.24.0 (this tree's forklayer)
# 2. bench-speed, all four dtypes in one run (the README's decode command, issue 14's end-to-end
#    targets): with `first-offset`, from the variant tree (.gpu/first-offset, run.sh's) with the option
#    on through S4KV_KERNEL_CONFIG (the decode kernel's only launch entry: nothing else replaced)
set -u
WHICH=${1:?shipped or first-offset}
W=${2:-/root/acc}
mkdir -p "$W"
HERE=$PWD
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; date -u; echo "tree: $WHICH"
  python3 -c 'import torch, triton; print(torch.__version__, triton.__version__)'; } >>"$W/versions.txt" 2>&1
t0=$SECONDS
OUT="$W" bash tools/gpu/run-on-device.sh patch >>"$W/steps.log" 2>&1
echo "patch: exit $? after $((SECONDS - t0)) s" >>"$W/progress"
t0=$SECONDS
if [ "$WHICH" = first-offset ]; then
  echo '[{"kernel": "decode", "head_size": 128, "options": {"FIRST_OFFSET": true}}]' > /tmp/first-offset.json
  (cd "$HERE/.gpu/first-offset" && OUT="$W" KVS="${KVS_SPEED:-auto,int4_kivi,fp8,turboquant_4bit_nc}" \
    S4KV_KERNEL_CONFIG=/tmp/first-offset.json bash tools/gpu/run-on-device.sh bench-speed) >>"$W/steps.log" 2>&1
else
  OUT="$W" KVS="${KVS_SPEED:-auto,int4_kivi,fp8,turboquant_4bit_nc}" bash tools/gpu/run-on-device.sh bench-speed \
    >>"$W/steps.log" 2>&1
fi
echo "bench-speed ($WHICH): exit $? after $((SECONDS - t0)) s" >>"$W/progress"
echo "engine done" >>"$W/progress"
