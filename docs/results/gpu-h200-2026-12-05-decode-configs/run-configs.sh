#!/usr/bin/env bash
# the decode launch configurations timed in this lease (tools/gpu/decode_configs.sh), detached
export CONFIGS='cur=[] bound=[{"kernel":"decode","head_size":128,"options":{"PAGE_BOUND":true}},{"kernel":"decode","head_size":64,"options":{"PAGE_BOUND":true}}] w2r200p5=[{"kernel":"decode","head_size":128,"options":{"num_warps":2,"maxnreg":200}},{"kernel":"decode-grid","head_size":0,"options":{"programs_per_sm":5}}] w2s64p6=[{"kernel":"decode","head_size":128,"options":{"num_warps":2,"maxnreg":168,"SUB":64}},{"kernel":"decode-grid","head_size":0,"options":{"programs_per_sm":6}}] w2r255=[{"kernel":"decode","head_size":128,"options":{"num_warps":2,"maxnreg":255}}] w1s64p6=[{"kernel":"decode","head_size":128,"options":{"num_warps":1,"maxnreg":255,"SUB":64}},{"kernel":"decode-grid","head_size":0,"options":{"programs_per_sm":6}}] w1s64p8=[{"kernel":"decode","head_size":128,"options":{"num_warps":1,"maxnreg":255,"SUB":64,"PAGE_STAGES":3}},{"kernel":"decode-grid","head_size":0,"options":{"programs_per_sm":8}}] w2r200p5b=[{"kernel":"decode","head_size":128,"options":{"num_warps":2,"maxnreg":200,"PAGE_BOUND":true}},{"kernel":"decode-grid","head_size":0,"options":{"programs_per_sm":5}}]'
export PASSES=2 POINTS="8192,32768,1024 32,8,64" OUT=/root/cfgout
mkdir -p $OUT
cd "$(dirname "$0")/../../.."  # the repository root (it ran from docs/results/<folder>/)
bash tools/gpu/decode_configs.sh >$OUT/table.txt 2>&1
echo done >$OUT/done
