W=/root/tout
for c in pp16 pp8; do
  (cd /root/$c && S4KV_KERNEL_CONFIG=$W/always.json TRITON_CACHE_DIR=/root/tc-$c PYTHONPATH=/root/$c timeout 120 python3 -m s4kv.kernels.bench --contexts 8192,32768 --batches 32,8 --breakdown --alias-blocks 128 --json $W/bench-$c-128-3.json > $W/bench-$c-128-3.log 2>&1)
  echo "bench $c alias 128 pass 3: exit $?" >> $W/progress
done
echo done3 >> $W/progress
