W=/root/tout
run() { # name dir cfg alias
  (cd $2 && S4KV_KERNEL_CONFIG=$3 TRITON_CACHE_DIR=/root/tc-$1 PYTHONPATH=$2 timeout 120 python3 -m s4kv.kernels.bench --contexts 8192,32768 --batches 32,8 --breakdown $( [ $4 = 0 ] || echo --alias-blocks $4 ) --json $W/bench-$1-$4-4.json > $W/bench-$1-$4-4.log 2>&1)
  echo "bench $1 alias $4 pass 4: exit $?" >> $W/progress
}
run pp8 /root/pp8 $W/always.json 0
run default /work/main "" 0
run pp8ta /root/pp8 $W/ta.json 128
run pp8 /root/pp8 $W/always.json 128
echo done4 >> $W/progress
