#!/usr/bin/env bash
# Fourteenth session, any GPU (an H200 wanted), no vLLM: one experiment per call, each through
# tools/gpu/decode_configs.sh (every configuration checked against the reference on the bench's
# inputs, then `python3 -m s4kv.kernels.bench --contexts 8192,32768 --batches 32,8 --breakdown` from
# DRAM and with the pages in L2, --alias-blocks 128, two passes, configurations alternating; then
# Nsight Compute's stall samples of each configuration's page kernel at 8k x 32). From the
# repository root, detached (a call ends at 10 minutes):
#   (setsid nohup bash docs/results/gpu-2026-12-07-fourteenth/run.sh EXPERIMENT /root/DIR >/root/DIR.log 2>&1 </dev/null &)
# then copy /root/DIR/decode-configs.tgz and table.txt to $OUT once table.txt ends with the profiles.
#   pair  (call 1, with pair-pages.diff applied: `git apply docs/results/gpu-2026-12-07-fourteenth/pair-pages.diff`):
#         PAIR_PAGES at 168 registers and three programs per SM, an accumulator per page and half
#         (pair) or one per half (pair1); profiled from DRAM.
#   lag   (call 2, with lag-values.diff applied): LAG_VALUES with the lagged dots before (lag) or after
#         (lag-late) the page's key dots, lag without a register cap (168, three per SM), and a third
#         page buffer (PAGE_STAGES 7, the shipped tree's option); profiled with the pages in L2.
#   waves (call 3, the shipped tree): programs_per_sm 8 and 12 (two and three waves of shorter splits).
#   early (call 4, the shipped tree beside .gpu/t14/early, carried: the shipped tree with
#         early-value-codes.diff, built here by `bash docs/results/gpu-2026-12-07-fourteenth/run.sh tree`):
#         the value codes' shared-memory load issued before the page's max instead of after p;
#         profiled with the pages in L2.
# The lease ran the same steps from three scripts of their own (this run.sh, run2.sh, run3.sh at
# b206c42 in git history), which wrote versions.txt themselves and ran Nsight Compute for two
# configurations per call (shipped and pair1; shipped and lag); their records are raw/, raw2/, raw3/.
set -u
X=${1:?EXPERIMENT}
dec() { echo "{\"kernel\":\"decode\",\"head_size\":128,\"options\":{$1}}"; }
grid() { echo "{\"kernel\":\"decode-grid\",\"head_size\":0,\"options\":{$1}}"; }
if [ "$X" = tree ]; then  # here, before call 4
  rm -rf .gpu/t14/early && mkdir -p .gpu/t14/early && git archive HEAD s4kv tests | tar -x -C .gpu/t14/early
  patch -d .gpu/t14/early -p1 <docs/results/gpu-2026-12-07-fourteenth/early-value-codes.diff
  exit
fi
O=${2:?DIR}
mkdir -p "$O"
case $X in
  pair) CONFIGS="shipped=[] pair=[$(dec '"PAIR_PAGES":true,"maxnreg":168'),$(grid '"programs_per_sm":3')]
                 pair1=[$(dec '"PAIR_PAGES":true,"maxnreg":168,"PAIR_ONE_ACC":true'),$(grid '"programs_per_sm":3')]"
        PROFILE=0 ;;
  lag) CONFIGS="shipped=[] lag=[$(dec '"LAG_VALUES":true')] lag-late=[$(dec '"LAG_VALUES":true,"LAG_LATE":true')]
                lag-r168=[$(dec '"LAG_VALUES":true,"maxnreg":null'),$(grid '"programs_per_sm":3')]
                stages7=[$(dec '"PAGE_STAGES":7')]"
       PROFILE=128 ;;
  waves) CONFIGS="shipped=[] waves2=[$(grid '"programs_per_sm":8,"max_splits":64')]
                  waves3=[$(grid '"programs_per_sm":12,"max_splits":64')]"
         PROFILE= ;;
  early) CONFIGS="shipped=[] early@.gpu/t14/early=[]" PROFILE=128 ;;
  *) echo "unknown experiment $X" >&2; exit 2 ;;
esac
CONFIGS=$CONFIGS PROFILE=$PROFILE OUT=$O ALIASES="0 128" PASSES=2 POINTS="8192,32768 32,8" \
  bash tools/gpu/decode_configs.sh >"$O/table.txt" 2>&1
