#!/bin/bash
# exploratory kernel-only lease: decode variants timed in one call, a source-level profile of the working tree
set -u
export PYTHONUNBUFFERED=1
R=$PWD
FINAL=$OUT; OUT=/tmp/l1; mkdir -p $OUT
trap 'tar -C /tmp -czf $FINAL/lease1.tgz l1; ls -la $FINAL' EXIT
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee $OUT/gpu.txt
python3 -c "import torch,triton;print(torch.__version__,triton.__version__)" | tee -a $OUT/gpu.txt
P="--contexts 1024,8192,32768,8256 --batches 64,32,8,32"
for v in base cur v2 base2 cur2; do
  case $v in cur|cur2) d=$R;; base2) d=$R/.gpu/var/base;; *) d=$R/.gpu/var/$v;; esac
  echo "=== $v ($d)"; t0=$SECONDS
  (cd $d && PYTHONPATH=$d python3 -m s4kv.kernels.bench $P --breakdown --json $OUT/k-$v.json) > $OUT/k-$v.log 2>&1
  grep -E "^ *[0-9]+ x|us|copy" $OUT/k-$v.log | tail -8; echo "($((SECONDS-t0)) s)"
done
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
t0=$SECONDS
PYTHONPATH=$R timeout 240 $NCU --clock-control none --graph-profiling node --kernel-name regex:_decode_kernel --launch-skip 3 --launch-count 1 \
  --section WarpStateStats --section SourceCounters --section SchedulerStats --section SpeedOfLight -f -o $OUT/prof-cur \
  python3 -m s4kv.kernels.bench --contexts 8192 --batches 32 > $OUT/ncu.log 2>&1
echo "ncu rc $? ($((SECONDS-t0)) s)"; tail -3 $OUT/ncu.log
$NCU -i $OUT/prof-cur.ncu-rep --page source --csv --print-source sass > $OUT/src-cur.csv 2>$OUT/src-err.txt; echo "src rc $?"; head -c 600 $OUT/src-cur.csv; cat $OUT/src-err.txt | head
$NCU -i $OUT/prof-cur.ncu-rep --page details > $OUT/prof-details.txt 2>&1
gzip -f $OUT/src-cur.csv
t0=$SECONDS; PYTHONPATH=$R timeout 200 python3 tools/gpu/tune_kernels.py pdl --json $OUT/pdl.json > $OUT/pdl.log 2>&1; echo "pdl rc $? ($((SECONDS-t0)) s)"; tail -12 $OUT/pdl.log
t0=$SECONDS; PYTHONPATH=$R timeout 240 python3 -m pytest -q -x -p no:cacheprovider tests/test_kernels.py -k "decode or mixed or prefix or many_splits" > $OUT/tests.log 2>&1; echo "tests rc $? ($((SECONDS-t0)) s)"; tail -3 $OUT/tests.log
