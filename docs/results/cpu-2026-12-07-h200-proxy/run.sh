#!/usr/bin/env bash
# On an H100 (no vLLM; about 12 minutes, so detached), after make-trees.sh here and with carry [".gpu/proxy"]:
#   mkdir -p /root/proxy && OUT=/root/proxy setsid nohup bash docs/results/cpu-2026-12-07-h200-proxy/run.sh \
#     >/root/proxy/table.txt 2>&1 &
# then collect /root/proxy/table.txt and /root/proxy/decode-configs.tgz.
# tools/gpu/decode_configs.sh over a sweep of the bench's --alias-blocks (the pool of complete pages the rows
# share: 128 blocks are 8.9 MB and stay in L2, 1,024 blocks are 71 MB, more than the H100's 50 MB L2), for
#   shipped9 / fo9: the two trees the ninth session timed on the H200 (make-trees.sh), so that each alias size's
#                   FIRST_OFFSET gain can be set against the H200's: 1.8 us from L2, 0.5-0.6 us from DRAM;
#   now / int8:     this tree's kernel and its INT8_KEYS option, the change an H200 has not timed.
set -u
OPT='[{"kernel":"decode","head_size":128,"options":{"FIRST_OFFSET":true}}]'
INT8='[{"kernel":"decode","head_size":128,"options":{"INT8_KEYS":1}}]'
CONFIGS="shipped9@.gpu/proxy/shipped-9=[] fo9@.gpu/proxy/fo-9=$OPT now=[] int8=$INT8" \
  ALIASES=${ALIASES:-0 128 384 768 1024} PASSES=${PASSES:-2} POINTS="8192,32768 32,8" \
  OUT=${OUT:?OUT=DIR} bash tools/gpu/decode_configs.sh
