#!/bin/bash
# exploratory kernel-only lease 2: decode variants and reduction options timed in one call, a source-level profile
set -u
export PYTHONUNBUFFERED=1
R=$PWD
FINAL=$OUT; OUT=/tmp/l2; mkdir -p $OUT
trap 'tar -C /tmp -czf $FINAL/lease2.tgz l2; ls -la $FINAL' EXIT
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee $OUT/gpu.txt
P="--contexts 1024,8192,32768,8256 --batches 64,32,8,32"
run() {  # name dir [config]
  local name=$1 d=$2 cfg=${3:-}
  echo "=== $name ($d ${cfg})"; local t0=$SECONDS
  (cd $d && PYTHONPATH=$d S4KV_KERNEL_CONFIG=$cfg python3 -m s4kv.kernels.bench $P --breakdown --json $OUT/k-$name.json) > $OUT/k-$name.log 2>&1
  grep -E "^ +[0-9]+ +[0-9]+ |_decode_kernel" $OUT/k-$name.log | sed 's/_rotate_queries_kernel/rot/;s/_decode_kernel/page/;s/_reduce_kernel/red/;s/beside them in the graph/gaps/'; echo "($((SECONDS-t0)) s)"
}
run base $R/.gpu/var/base
run v1 $R/.gpu/var/v1
run v3 $R
run base-b $R/.gpu/var/base
run v3-b $R
for c in r6w4 r12w4 r6w2; do run v3-$c $R $R/.gpu/cfg/$c.json; done
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
t0=$SECONDS
PYTHONPATH=$R timeout 240 $NCU --clock-control none --graph-profiling node --kernel-name regex:_decode_kernel --launch-skip 3 --launch-count 1 \
  --section WarpStateStats --section SourceCounters --section SchedulerStats --section SpeedOfLight -f -o $OUT/prof-v3 \
  python3 -m s4kv.kernels.bench --contexts 8192 --batches 32 > $OUT/ncu.log 2>&1
echo "ncu rc $? ($((SECONDS-t0)) s)"
$NCU -i $OUT/prof-v3.ncu-rep --page source --csv --print-source sass | gzip > $OUT/src-v3.csv.gz
$NCU -i $OUT/prof-v3.ncu-rep --page details > $OUT/prof-details.txt 2>&1; grep -E "Duration|DRAM Through|Issued Warp|No Eligible" $OUT/prof-details.txt
rm -f $OUT/prof-v3.ncu-rep
t0=$SECONDS; PYTHONPATH=$R timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py -k "decode or many_splits" > $OUT/tests.log 2>&1; echo "tests rc $? ($((SECONDS-t0)) s)"; tail -3 $OUT/tests.log
