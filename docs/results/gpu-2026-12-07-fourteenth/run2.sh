#!/usr/bin/env bash
# Fourteenth session, second call, any GPU, no vLLM, with lag-values.diff (this folder) applied to the
# tree (`git apply docs/results/gpu-2026-12-07-fourteenth/lag-values.diff`; the option is not in s4kv).
# From the repository root, detached as run.sh; results in DIR/t14b.tgz.
#   1. Nsight Compute's stall samples of the page kernel at 8k x 32 with the pages in L2
#      (--alias-blocks 128: the regime that bounds the H200's kernel), shipped and LAG_VALUES;
#   2. tools/gpu/decode_configs.sh (check against the reference, then the bench from DRAM and from L2,
#      two passes, alternating): the shipped kernel; LAG_VALUES (the value dots one page behind the
#      key dots) with the lagged dots before (lag) or after (lag-late) the page's key dots, and lag
#      without a register cap (168, three programs per SM); a third page buffer (PAGE_STAGES 7).
set -u
O=${1:?DIR}
mkdir -p "$O"
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c 'import torch, triton; print(torch.__version__, triton.__version__)'; date -u; } >"$O/versions.txt" 2>&1
dec() { echo "{\"kernel\":\"decode\",\"head_size\":128,\"options\":{$1}}"; }
grid3='{"kernel":"decode-grid","head_size":0,"options":{"programs_per_sm":3}}'
LAG="[$(dec '"LAG_VALUES":true')]"
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
for spec in "shipped=[]" "lag=$LAG"; do
  name=${spec%%=*}; echo "${spec#*=}" >"$O/$name.ncu-config.json"; t0=$SECONDS
  S4KV_KERNEL_CONFIG=$O/$name.ncu-config.json timeout 200 "$NCU" --clock-control none --graph-profiling node \
    --kernel-name regex:_decode_kernel --launch-skip 3 --launch-count 1 --section SpeedOfLight \
    --section SchedulerStats --section WarpStateStats --section SourceCounters -f -o "/tmp/t14b-$name" \
    python3 -m s4kv.kernels.bench --contexts 8192 --batches 32 --alias-blocks 128 >"$O/ncu-$name-l2.log" 2>&1 \
    && "$NCU" -i "/tmp/t14b-$name.ncu-rep" --page source --csv --print-source sass | gzip >"$O/profile-source-$name-l2.csv.gz" \
    && "$NCU" -i "/tmp/t14b-$name.ncu-rep" --page details >"$O/profile-details-$name-l2.txt"
  echo "ncu $name-l2: exit $? after $((SECONDS - t0)) s" >>"$O/progress"
done
CONFIGS="shipped=[] lag=$LAG lag-late=[$(dec '"LAG_VALUES":true,"LAG_LATE":true')]"
CONFIGS="$CONFIGS lag-r168=[$(dec '"LAG_VALUES":true,"maxnreg":null'),$grid3] stages7=[$(dec '"PAGE_STAGES":7')]"
echo "configs: $CONFIGS" >>"$O/progress"
CONFIGS=$CONFIGS OUT=$O ALIASES="0 128" PASSES=2 POINTS="8192,32768 32,8" \
  bash tools/gpu/decode_configs.sh >"$O/table.txt" 2>&1
echo "configs: exit $? after $SECONDS s" >>"$O/progress"
tar -czf "$O/t14b.tgz" -C "$O" --exclude t14b.tgz .
echo done >>"$O/progress"
