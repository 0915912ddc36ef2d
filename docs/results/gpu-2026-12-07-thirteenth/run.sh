#!/usr/bin/env bash
# Thirteenth session, any GPU (an H200 wanted: there the page loop, not DRAM, bounds the kernel), no vLLM.
# Here first: bash docs/results/gpu-2026-12-07-thirteenth/make-trees.sh; call with carry [".gpu/t13"]:
#   (setsid nohup bash docs/results/gpu-2026-12-07-thirteenth/run.sh /root/t13 >/root/t13.log 2>&1 </dev/null &)
# then copy /root/t13/decode-configs.tgz and table.txt to $OUT once table.txt ends with the profiles.
# Through tools/gpu/decode_configs.sh (NAME@DIR runs a configuration from the trees make-trees.sh built):
#   1. each configuration checked against the reference on the bench's inputs (tests -k decode_bench_inputs);
#   2. the decode kernel bench at 8k x 32 and 32k x 8, from DRAM and with the pages in L2 (--alias-blocks 128),
#      two passes, configurations alternating: the shipped kernel with bf16 operands (the default) and with
#      fp16 operands (the option), and the twelfth session's fp16 unpacks (a70: 6 instructions per 8 codes,
#      b6a: 5 for the value tiles) with fp16 operands. On the H100 of 2026-12-07 they were timed from DRAM
#      only, where that GPU's DRAM, not the loop, bounds the page kernel;
#   3. Nsight Compute's per-instruction stall samples of each configuration's page kernel at 8k x 32 from
#      DRAM (for tools/ncu_stalls.py on the CPU machine; the shipped one's is NAME shipped-bf16-profile0).
# The lease ran an earlier form of this script (at 3bdd2d4 in git history), with its own tree loop and one
# Nsight Compute run, of the shipped kernel; its records are raw/ (raw/profile-source.csv.gz the export).
set -u
O=${1:?DIR}
mkdir -p "$O"
fp16='[{"kernel":"decode-grid","head_size":0,"options":{"fp16_operands":true}}]'
CONFIGS="shipped-bf16=[] shipped-fp16=$fp16 a70-fp16@.gpu/t13/a70=$fp16 b6a-fp16@.gpu/t13/b6a=$fp16" \
  PROFILE=0 OUT=$O ALIASES="0 128" PASSES=2 POINTS="8192,32768 32,8" \
  bash tools/gpu/decode_configs.sh >"$O/table.txt" 2>&1
