source /root/s4kv-env.sh 2>/dev/null; export PYTHONPATH=$PWD
W=/root/tout
while ! grep -q done $W/progress; do sleep 2; done
for c in always never default; do
  cfg=$W/$c.json; [ $c = default ] && cfg=""
  S4KV_KERNEL_CONFIG=$cfg TRITON_CACHE_DIR=/root/tc-$c timeout 120 python3 -m s4kv.kernels.bench --contexts 8192,32768 --batches 32,8 --breakdown --alias-blocks 128 --json $W/bench-$c-128-2.json > $W/bench-$c-128-2.log 2>&1
  echo "bench $c alias 128 pass 2: exit $?" >> $W/progress
done
echo done2 >> $W/progress
