#!/usr/bin/env bash
# Fourteenth session, third call, any GPU, no vLLM, the shipped tree: the page kernel's tail. With the
# pages in L2 the shipped kernel keeps 3.55 of 4 warps per scheduler active (Nsight Compute, run2.sh):
# its one wave of equal splits ends with the slowest program. More page programs than fit at once
# (programs_per_sm 8 and 12: two and three waves of shorter splits, the hardware starting each as
# another ends) against the shipped one wave, through tools/gpu/decode_configs.sh as run2.sh.
set -u
O=${1:?DIR}
mkdir -p "$O"
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c 'import torch, triton; print(torch.__version__, triton.__version__)'; date -u; } >"$O/versions.txt" 2>&1
grid() { echo "[{\"kernel\":\"decode-grid\",\"head_size\":0,\"options\":{\"programs_per_sm\":$1,\"max_splits\":64}}]"; }
CONFIGS="shipped=[] waves2=$(grid 8) waves3=$(grid 12)"
echo "configs: $CONFIGS" >>"$O/progress"
CONFIGS=$CONFIGS OUT=$O ALIASES="0 128" PASSES=2 POINTS="8192,32768 32,8" \
  bash tools/gpu/decode_configs.sh >"$O/table.txt" 2>&1
echo "configs: exit $? after $SECONDS s" >>"$O/progress"
tar -czf "$O/t14c.tgz" -C "$O" --exclude t14c.tgz .
echo done >>"$O/progress"
