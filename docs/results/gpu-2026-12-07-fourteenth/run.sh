#!/usr/bin/env bash
# Fourteenth session, any GPU (an H200 wanted), no vLLM: two pages per page-loop iteration (PAIR_PAGES)
# against the shipped loop. From the repository root, with pair-pages.diff (this folder) applied to the
# tree (`git apply docs/results/gpu-2026-12-07-fourteenth/pair-pages.diff`; the option is not in s4kv),
# detached (a call ends at 10 min):
#   (setsid nohup bash docs/results/gpu-2026-12-07-fourteenth/run.sh /root/t14 >/root/t14.log 2>&1 </dev/null &)
# then `cat /root/t14/progress` until "done" and copy /root/t14/t14.tgz and table.txt to $OUT.
#   1. tools/gpu/decode_configs.sh: each configuration checked against the reference on the bench's
#      inputs, then `python3 -m s4kv.kernels.bench --contexts 8192,32768 --batches 32,8 --breakdown`
#      from DRAM and with the pages in L2 (--alias-blocks 128), two passes, configurations alternating;
#   2. Nsight Compute's stall samples of the page kernel at 8k x 32 (shipped, then the pair loop) for
#      tools/ncu_stalls.py on the CPU machine.
# Configurations: the shipped kernel; PAIR_PAGES with an accumulator per page and half (pair) or one
# per half (pair1), at 168 registers, three programs per SM (their 72.8 KB of page buffers allow three).
set -u
O=${1:?DIR}
mkdir -p "$O"
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c 'import torch, triton; print(torch.__version__, triton.__version__)'; date -u; } >"$O/versions.txt" 2>&1
pair() {  # name, extra decode options
  echo "$1=[{\"kernel\":\"decode\",\"head_size\":128,\"options\":{\"PAIR_PAGES\":true,\"maxnreg\":168$2}},{\"kernel\":\"decode-grid\",\"head_size\":0,\"options\":{\"programs_per_sm\":3}}]"
}
CONFIGS="shipped=[] $(pair pair '') $(pair pair1 ',"PAIR_ONE_ACC":true')"
echo "configs: $CONFIGS" >>"$O/progress"
CONFIGS=$CONFIGS OUT=$O ALIASES="0 128" PASSES=2 POINTS="8192,32768 32,8" \
  bash tools/gpu/decode_configs.sh >"$O/table.txt" 2>&1
echo "configs: exit $? after $SECONDS s" >>"$O/progress"
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
for spec in "shipped=[]" "$(pair pair1 ',"PAIR_ONE_ACC":true')"; do
  name=${spec%%=*}; echo "${spec#*=}" >"$O/$name.ncu-config.json"; t0=$SECONDS
  S4KV_KERNEL_CONFIG=$O/$name.ncu-config.json timeout 200 "$NCU" --clock-control none --graph-profiling node \
    --kernel-name regex:_decode_kernel --launch-skip 3 --launch-count 1 --section SpeedOfLight \
    --section SchedulerStats --section WarpStateStats --section SourceCounters -f -o "/tmp/t14-$name" \
    python3 -m s4kv.kernels.bench --contexts 8192 --batches 32 >"$O/ncu-$name.log" 2>&1 \
    && "$NCU" -i "/tmp/t14-$name.ncu-rep" --page source --csv --print-source sass | gzip >"$O/profile-source-$name.csv.gz" \
    && "$NCU" -i "/tmp/t14-$name.ncu-rep" --page details >"$O/profile-details-$name.txt"
  echo "ncu $name: exit $? after $((SECONDS - t0)) s" >>"$O/progress"
done
tar -czf "$O/t14.tgz" -C "$O" --exclude t14.tgz .
echo done >>"$O/progress"
