#!/usr/bin/env bash
# Fifteenth session, any GPU (an H200 wanted), no vLLM: code variants of the decode page loop beside
# the shipped tree and launch options, through tools/gpu/decode_configs.sh (each configuration first
# checked against the reference on the bench's inputs, then `python3 -m s4kv.kernels.bench --contexts
# 8192,32768 --batches 32,8 --breakdown` from DRAM and with the pages in L2 (--alias-blocks 128), two
# passes, configurations alternating).
#   bash docs/results/gpu-2026-12-07-fifteenth/run.sh trees          # here: the variant trees, .gpu/t15/NAME
# then on the device (carry .gpu/t15), EXPERIMENT sweep (shipped, int8k, keysplit, int8k-r96p5) or more
# (shipped, int8, early, r96p5), detached (a call ends at 10 minutes):
#   (setsid nohup bash docs/results/gpu-2026-12-07-fifteenth/run.sh sweep /root/t15 >/root/t15.log 2>&1 </dev/null &)
# and copy /root/t15/decode-configs.tgz and table.txt to $OUT once table.txt holds the table.
#   keysplit  the key dots as two independent MMA chains (channel halves) summed by an inline add
#   int8k     the key dots on int8 operands: code bytes by one and (or shift and and) per 4 codes,
#             q * s rounded to int8 with one scale per query head and page, mma m16n8k32, int32 sums
#   int8      int8k and the value dots on int8 too (p * vs rounded with one scale per head and page)
#   early     the fourteenth session's early-value-codes.diff (value codes read before the page's max)
#   r96p5     the shipped tree at 96 registers (24 bytes spilled), five programs per SM
#   int8k-r96p5  int8k at 96 registers (24 bytes spilled), five programs per SM
set -u
D=docs/results/gpu-2026-12-07-fifteenth
X=${1:?EXPERIMENT}
dec() { echo "{\"kernel\":\"decode\",\"head_size\":128,\"options\":{$1}}"; }
grid() { echo "{\"kernel\":\"decode-grid\",\"head_size\":0,\"options\":{$1}}"; }
tree() {  # NAME DIFF: 8285ac5's s4kv and tests (the session's base) with DIFF applied, in .gpu/t15/NAME
  rm -rf ".gpu/t15/$1" && mkdir -p ".gpu/t15/$1" && git archive 8285ac5 s4kv tests | tar -x -C ".gpu/t15/$1"
  patch -s -d ".gpu/t15/$1" -p1 <"$2"
}
if [ "$X" = trees ]; then
  for n in keysplit int8k int8; do tree "$n" "$D/$n.diff"; done
  tree early docs/results/gpu-2026-12-07-fourteenth/early-value-codes.diff
  exit
fi
O=${2:?DIR}
mkdir -p "$O"
case $X in
  sweep) CONFIGS="shipped=[] int8k@.gpu/t15/int8k=[] keysplit@.gpu/t15/keysplit=[]
                  int8k-r96p5@.gpu/t15/int8k=[$(dec '"maxnreg":96'),$(grid '"programs_per_sm":5')]"
         PROFILE=${PROFILE:-} ;;
  more) CONFIGS="shipped=[] int8@.gpu/t15/int8=[] early@.gpu/t15/early=[]
                 r96p5=[$(dec '"maxnreg":96'),$(grid '"programs_per_sm":5')]"
        PROFILE=${PROFILE:-} ;;
  *) echo "unknown experiment $X" >&2; exit 2 ;;
esac
CONFIGS=$CONFIGS PROFILE=$PROFILE OUT=$O ALIASES="0 128" PASSES=2 POINTS="8192,32768 32,8" \
  bash tools/gpu/decode_configs.sh >"$O/table.txt" 2>&1
