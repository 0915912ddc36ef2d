#!/usr/bin/env bash
# Issue 14's acceptance on the current default (2026-12-06, seventh session). From the repository root:
#   bash docs/results/gpu-2026-12-06-acceptance/run.sh kernels /root/acc   (no vLLM: the first call, detached,
#       while the bundle's chunks are copied)
#   bash docs/results/gpu-2026-12-06-acceptance/run.sh engine /root/acc    (after the bundle's setup, detached)
# detached: setsid nohup bash ... >/root/acc-MODE.log 2>&1 </dev/null &
# progress in /root/acc/progress; each step's log and archive in /root/acc (run-on-device.sh's OUT).
# kernels: the decode kernel bench at 8k x 32 and 32k x 8 (the decode call per layer with 8 layers per CUDA
#   graph against the copy bandwidth of the same run: issue 14's kernel target), from DRAM, then with
#   every row's complete pages in an L2-resident pool (--alias-blocks 128: the page loop's own bound)
# engine:
#   1. patch: the S4 KV series onto the bundle's vLLM 0.24.0
#   2. bench-speed: `s4kv bench speed` at 1k x 64, 8k x 32, 32k x 8 and saturated 32k, bf16, fp8 and
#      int4_kivi in one run (the README's decode table; issue 14's end-to-end targets). turboquant_4bit_nc,
#      the fourth dtype (0.29-0.50x bf16 in every run so far), adds about 6 minutes: KVS_SPEED overrides
#   3. profile-decode: an engine's decode step kernel by kernel at 32,704 x 8, int4_kivi and bf16 (what
#      the step spends outside attention: tools/decode_ceiling.py's bound on the 32k x 8 target)
#   4. tests: the GPU kernel tests (8 workers)
# STEPS="bench-speed" (or any of bench-speed profile-decode tests) runs only those after the patch
set -u
MODE=${1:?kernels or engine}
W=${2:-/root/acc}
mkdir -p "$W"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; date -u
  python3 -c 'import torch, triton; print(torch.__version__, triton.__version__)'; } >>"$W/versions.txt" 2>&1
if [ "$MODE" = kernels ]; then
  export PYTHONPATH="$PWD:${PYTHONPATH:-}"
  for a in 0 128; do
    t0=$SECONDS
    timeout 300 python3 -m s4kv.kernels.bench --contexts 8192,32768 --batches 32,8 --breakdown \
      $( [ $a = 0 ] || echo --alias-blocks $a ) --json "$W/kernels-alias$a.json" >"$W/kernels-alias$a.log" 2>&1
    echo "kernels alias $a: exit $? after $((SECONDS - t0)) s" >>"$W/progress"
  done
  echo "kernels done" >>"$W/progress"
  exit 0
fi
# the kernel bench of the first call must be done before anything is timed here
for _ in $(seq 120); do { [ ! -f "$W/progress" ] || grep -q "kernels done" "$W/progress"; } && break; sleep 5; done
run() {  # STEP [ENV=VALUE...]: one run-on-device.sh step into $W
  local t0=$SECONDS step=$1; shift
  env OUT="$W" "$@" bash tools/gpu/run-on-device.sh "$step" >>"$W/steps.log" 2>&1
  echo "$step: exit $? after $((SECONDS - t0)) s" >>"$W/progress"
}
STEPS=" ${STEPS:-bench-speed profile-decode tests} "
run patch
case $STEPS in *" bench-speed "*) run bench-speed KVS="${KVS_SPEED:-auto,fp8,int4_kivi}" ;; esac
case $STEPS in *" profile-decode "*) run profile-decode KVS=int4_kivi,auto PROFILE_POINTS="${PROFILE_POINTS:-32704x8}" ;; esac
case $STEPS in *" tests "*) run tests PYTEST_ADDOPTS="-n 8" ;; esac
echo "engine done" >>"$W/progress"
