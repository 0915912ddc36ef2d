#!/usr/bin/env bash
# Issue 14's acceptance on the current default, in one detached run after the bundle's setup
# (2026-12-06, seventh session). From the repository root:
#   setsid nohup bash docs/results/gpu-2026-12-06-acceptance/run.sh /root/acc >/root/acc.log 2>&1 </dev/null &
# progress in /root/acc/progress; each step's log and archive in /root/acc (run-on-device.sh's OUT).
#   1. patch: the S4 KV series onto the bundle's vLLM 0.24.0
#   2. bench-speed: `s4kv bench speed` at 1k x 64, 8k x 32, 32k x 8 and saturated 32k, bf16, fp8 and
#      int4_kivi in one run (the README's decode table; issue 14's end-to-end targets). turboquant_4bit_nc,
#      the fourth dtype (0.29-0.50x bf16 in every run so far), adds about 6 minutes: KVS_SPEED overrides
#   3. profile-decode: an engine's decode step kernel by kernel at 32,704 x 8, int4_kivi and bf16 (what
#      the step spends outside attention: tools/decode_ceiling.py's bound on the 32k x 8 target)
#   4. tests: the GPU kernel tests (8 workers)
# The kernel bench (no vLLM) ran before it: docs/results/gpu-2026-12-06-terms-ahead/run.sh, default
# and TERMS_AHEAD, from L2 and from DRAM.
set -u
W=${1:-/root/acc}
mkdir -p "$W"
# the kernel bench started in the first call must be done before anything is timed here
for _ in $(seq 120); do { [ ! -f /root/tout/progress ] || grep -q done /root/tout/progress; } && break; sleep 5; done
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; date -u; } >"$W/versions.txt"
run() {  # STEP [ENV=VALUE...]: one run-on-device.sh step into $W
  local t0=$SECONDS step=$1; shift
  env OUT="$W" "$@" bash tools/gpu/run-on-device.sh "$step" >>"$W/steps.log" 2>&1
  echo "$step: exit $? after $((SECONDS - t0)) s" >>"$W/progress"
}
run patch
run bench-speed KVS="${KVS_SPEED:-auto,fp8,int4_kivi}"
run profile-decode KVS=int4_kivi,auto PROFILE_POINTS="${PROFILE_POINTS:-32704x8}"
run tests PYTEST_ADDOPTS="-n 8"
echo done >>"$W/progress"
