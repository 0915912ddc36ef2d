#!/usr/bin/env bash
# Thirteenth session, calls 2-4: decode kernel launch configurations against the shipped kernel, any
# GPU, no vLLM, through tools/gpu/decode_configs.sh: each configuration checked against the reference
# on the bench's inputs, then `python3 -m s4kv.kernels.bench --contexts 8192,32768 --batches 32,8
# --breakdown` from DRAM and with the pages in L2 (--alias-blocks 128), two passes, configurations
# alternating. From the repository root, with the call's diff from this folder applied to the tree:
#   [WP="..."] [TN=1] bash docs/results/gpu-2026-12-07-thirteenth/run-configs.sh /root/DIR   (3-4 minutes)
# call 2, warp-pages-v1.diff: WP="wp16:16:1:128:16 wp32:32:1:128:16 wp16-r168:16:1:168:12 wp16-2waves:16:1:128:32"
# call 3, warp-pages.diff:    WP="wp32s5:32:5:128:16 wp64s5:64:5:128:12 wp32s5-r168:32:5:168:12"
# call 4, terms-next.diff:    TN=1
# (WP: name:SUB:PAGE_STAGES:maxnreg:programs_per_sm of one-warp page programs.) The lease ran these
# steps from two scripts of their own, run2.sh and run3.sh (at 14bb393 in git history);
# their records are raw/warp-pages/, raw/warp-pages-v2/ and raw/terms-next/.
set -u
O=${1:?DIR}
mkdir -p "$O"  # versions.txt is in decode_configs.sh's archive (the lease's scripts wrote it here)
CONFIGS="shipped=[]"
for spec in ${WP:-}; do
  IFS=: read -r n sub st reg pps <<<"$spec"
  CONFIGS="$CONFIGS $n=[{\"kernel\":\"decode\",\"head_size\":128,\"options\":{\"WARP_PAGES\":true,\"num_warps\":1,\"SUB\":$sub,\"PAGE_STAGES\":$st,\"maxnreg\":$reg}},{\"kernel\":\"decode-grid\",\"head_size\":0,\"options\":{\"programs_per_sm\":$pps,\"max_splits\":64}}]"
done
if [ -n "${TN:-}" ]; then
  CONFIGS="$CONFIGS tn=[{\"kernel\":\"decode\",\"head_size\":128,\"options\":{\"TERMS_NEXT\":true}}]"
  CONFIGS="$CONFIGS tn-r168=[{\"kernel\":\"decode\",\"head_size\":128,\"options\":{\"TERMS_NEXT\":true,\"maxnreg\":168}},{\"kernel\":\"decode-grid\",\"head_size\":0,\"options\":{\"programs_per_sm\":3}}]"
fi
CONFIGS=$CONFIGS OUT=$O ALIASES="0 128" PASSES=2 POINTS="8192,32768 32,8" \
  bash tools/gpu/decode_configs.sh >"$O/table.txt" 2>&1
