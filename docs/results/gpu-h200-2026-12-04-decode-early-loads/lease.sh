#!/usr/bin/env bash
# One device call (no vLLM needed): the decode kernel bench of the tree before (.gpu/var/base, `git
# archive 47c53e6 s4kv`) and of this tree, two passes each, one after the other; then this tree and
# the late-trigger variant (.gpu/var/late) with programmatic dependent launch on, two passes each;
# then Nsight Compute on the split reduction at 32k x 8, both trees. Everything lands in $OUT as one
# archive (the device tool returns at most 8 files).
set -u
W=/tmp/lease; rm -rf $W; mkdir -p $W
PTS="--contexts 1024,8192,32768,8256,32704 --batches 64,32,8,32,8"
echo '[{"kernel": "decode-grid", "head_size": 0, "options": {"pdl": true}}]' >$W/pdl.json
bench() {  # bench NAME TREE [ENV=VALUE...]
  local name=$1 dir=$2; shift 2
  (cd "$dir" && env PYTHONPATH="$PWD" "$@" timeout 240 python3 -m s4kv.kernels.bench $PTS --breakdown \
    --json "$W/$name.json") >"$W/$name.log" 2>&1
  echo "== $name rc=$?"; grep -E "^ +[0-9]+ +[0-9]+ +[0-9]+ |_decode_kernel" "$W/$name.log"
}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader >$W/gpu.txt
python3 -c 'import torch, triton; print(torch.__version__, triton.__version__)' >>$W/gpu.txt
for pass in 1 2; do
  bench "base-$pass" .gpu/var/base
  bench "cur-$pass" .
done
for pass in 1 2; do
  bench "cur-pdl-$pass" . S4KV_KERNEL_CONFIG=$W/pdl.json
  bench "late-pdl-$pass" .gpu/var/late S4KV_KERNEL_CONFIG=$W/pdl.json
done
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
for t in base cur; do
  dir=.; [ $t = base ] && dir=.gpu/var/base
  (cd $dir && PYTHONPATH=$PWD timeout 120 "$NCU" --clock-control none --graph-profiling node \
    --kernel-name regex:'_reduce_kernel|_rotate_queries_kernel' --launch-skip 6 --launch-count 2 \
    --section SpeedOfLight --section LaunchStats --section WarpStateStats --section SchedulerStats \
    python3 -m s4kv.kernels.bench --contexts 32768 --batches 8) >$W/ncu-$t.log 2>&1
  echo "== ncu $t rc=$?"; grep -E "_kernel|Duration|Warp Cycles Per Issued|No Eligible" $W/ncu-$t.log | head -20
done
tar -C $W -czf "$OUT/lease.tgz" .
