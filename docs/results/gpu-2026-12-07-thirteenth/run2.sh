#!/usr/bin/env bash
# Thirteenth session, second and third calls: one-warp page programs (WARP_PAGES, warp-pages.diff here,
# applied to the tree) against the shipped 4-warp programs, any GPU, no vLLM. From the repository root:
#   [WP="..."] bash docs/results/gpu-2026-12-07-thirteenth/run2.sh /root/wp   (about 4 minutes)
# Each configuration is checked against the reference on the bench's inputs, then timed with
# `python3 -m s4kv.kernels.bench --contexts 8192,32768 --batches 32,8 --breakdown`, from DRAM and with
# the pages in L2 (--alias-blocks 128), two passes, configurations alternating.
set -u
O=${1:?DIR}
mkdir -p "$O"
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c 'import torch, triton; print(torch.__version__, triton.__version__)'; date -u; } >"$O/versions.txt" 2>&1
wp() {  # SUB STAGES MAXNREG PROGRAMS_PER_SM
  echo "[{\"kernel\":\"decode\",\"head_size\":128,\"options\":{\"WARP_PAGES\":true,\"num_warps\":1,\"SUB\":$1,\"PAGE_STAGES\":$2,\"maxnreg\":$3}},
         {\"kernel\":\"decode-grid\",\"head_size\":0,\"options\":{\"programs_per_sm\":$4,\"max_splits\":64}}]"
}
echo '[]' >"$O/shipped.json"
# WP="name:SUB:STAGES:MAXNREG:PROGRAMS_PER_SM ..." (the first call's, the default; the second call's
# was "wp32s5:32:5:128:16 wp64s5:64:5:128:12 wp32s5-r168:32:5:168:12")
WP=${WP:-wp16:16:1:128:16 wp32:32:1:128:16 wp16-r168:16:1:168:12 wp16-2waves:16:1:128:32}
NAMES=shipped
for spec in $WP; do
  IFS=: read -r n sub st reg pps <<<"$spec"
  wp "$sub" "$st" "$reg" "$pps" >"$O/$n.json"
  NAMES="$NAMES $n"
done
for n in $NAMES; do
  t0=$SECONDS
  S4KV_KERNEL_CONFIG=$O/$n.json PYTHONPATH=$PWD:$PWD/tests timeout 150 python3 -m pytest -q -x -p no:cacheprovider \
    tests/test_kernels.py -k decode_bench_inputs >"$O/check-$n.log" 2>&1
  echo "check $n: exit $? after $((SECONDS - t0)) s: $(tail -1 "$O/check-$n.log")" >>"$O/progress"
done
for pass in 1 2; do
  for a in 0 128; do
    for n in $NAMES; do
      t0=$SECONDS
      S4KV_KERNEL_CONFIG=$O/$n.json timeout 90 python3 -m s4kv.kernels.bench --contexts 8192,32768 --batches 32,8 \
        --breakdown $( [ "$a" = 0 ] || echo --alias-blocks "$a" ) --json "$O/$n-alias$a-pass$pass.json" \
        >"$O/$n-alias$a-pass$pass.log" 2>&1
      echo "$n-alias$a-pass$pass: exit $? after $((SECONDS - t0)) s" >>"$O/progress"
    done
  done
done
python3 tools/kernel_bench_table.py "$O"/*-pass?.json >"$O/table.txt" 2>&1
tar -czf /tmp/wp.tgz -C "$O" . && mv /tmp/wp.tgz "$O/wp.tgz"
echo done >>"$O/progress"
