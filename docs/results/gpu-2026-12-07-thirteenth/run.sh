#!/usr/bin/env bash
# Thirteenth session, any GPU (an H200 wanted: there the page loop, not DRAM, bounds the kernel), no vLLM.
# Here first: bash docs/results/gpu-2026-12-07-thirteenth/make-trees.sh; call with carry [".gpu/t13"]:
#   (setsid nohup bash docs/results/gpu-2026-12-07-thirteenth/run.sh /root/t13 >/root/t13.log 2>&1 </dev/null &)
# then `cat /root/t13/progress` until "done", and copy /root/t13/t13.tgz, table.txt, progress to $OUT.
#   1. each configuration checked against the reference on the bench's inputs (tests -k decode_bench_inputs);
#   2. the decode kernel bench at 8k x 32 and 32k x 8, from DRAM and with the pages in L2 (--alias-blocks 128),
#      two passes, configurations alternating: the shipped kernel with bf16 operands (the default) and with
#      fp16 operands (the option), and the twelfth session's fp16 unpacks (a70: 6 instructions per 8 codes,
#      b6a: 5 for the value tiles) with fp16 operands. On the H100 of 2026-12-07 they were timed from DRAM
#      only, where that GPU's DRAM, not the loop, bounds the page kernel;
#   3. Nsight Compute's per-instruction stall samples of the shipped page kernel at 8k x 32 (for
#      tools/ncu_stalls.py on the CPU machine).
set -u
O=${1:?DIR}
mkdir -p "$O"
HERE=$PWD
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c 'import torch, triton; print(torch.__version__, triton.__version__)'; date -u; } >"$O/versions.txt" 2>&1
echo '[{"kernel":"decode-grid","head_size":0,"options":{"fp16_operands":true}}]' >"$O/fp16.json"
echo '[]' >"$O/default.json"
# name:tree:config
CONFIGS="shipped-bf16:$HERE:$O/default.json shipped-fp16:$HERE:$O/fp16.json a70-fp16:$HERE/.gpu/t13/a70:$O/fp16.json b6a-fp16:$HERE/.gpu/t13/b6a:$O/fp16.json"
for c in $CONFIGS; do
  IFS=: read -r name tree cfg <<<"$c"; t0=$SECONDS
  (cd "$tree" && PYTHONPATH="$tree:$tree/tests" S4KV_KERNEL_CONFIG=$cfg timeout 150 python3 -m pytest -q -x \
    -p no:cacheprovider tests/test_kernels.py -k decode_bench_inputs) >"$O/check-$name.log" 2>&1
  echo "check $name: exit $? after $((SECONDS - t0)) s: $(tail -1 "$O/check-$name.log")" >>"$O/progress"
done
for pass in 1 2; do
  for a in 0 128; do
    for c in $CONFIGS; do
      IFS=: read -r name tree cfg <<<"$c"; t0=$SECONDS
      (cd "$tree" && PYTHONPATH="$tree" S4KV_KERNEL_CONFIG=$cfg timeout 90 python3 -m s4kv.kernels.bench \
        --contexts 8192,32768 --batches 32,8 --breakdown $( [ "$a" = 0 ] || echo --alias-blocks "$a" ) \
        --json "$O/$name-alias$a-pass$pass.json") >"$O/$name-alias$a-pass$pass.log" 2>&1
      echo "$name-alias$a-pass$pass: exit $? after $((SECONDS - t0)) s" >>"$O/progress"
    done
  done
done
python3 tools/kernel_bench_table.py "$O"/*-pass?.json >"$O/table.txt" 2>&1
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
t0=$SECONDS
timeout 240 "$NCU" --clock-control none --graph-profiling node --kernel-name regex:_decode_kernel \
  --launch-skip 3 --launch-count 1 --section SpeedOfLight --section SchedulerStats --section WarpStateStats \
  --section SourceCounters -f -o /tmp/t13-source python3 -m s4kv.kernels.bench --contexts 8192 --batches 32 \
  >"$O/ncu.log" 2>&1 \
  && "$NCU" -i /tmp/t13-source.ncu-rep --page source --csv --print-source sass | gzip >"$O/profile-source.csv.gz" \
  && "$NCU" -i /tmp/t13-source.ncu-rep --page details >"$O/profile-details.txt"
echo "ncu: exit $? after $((SECONDS - t0)) s" >>"$O/progress"
tar -czf "$O/t13.tgz" -C "$O" --exclude t13.tgz .
echo done >>"$O/progress"
