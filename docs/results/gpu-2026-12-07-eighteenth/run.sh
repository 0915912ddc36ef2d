#!/usr/bin/env bash
# Eighteenth session, plan A of docs/results/kernel-static-2026-12-04-triton38/next-lease.sh on an H200,
# no vLLM: the page kernel's candidate options and code variants, from DRAM and L2, two passes, then
# Nsight Compute stall profiles of four of them. Detached, from a copy of the tree (the call's checkout
# is re-synced by every call):
#   here:    bash docs/results/cpu-2026-12-07-tma-pages/make-tree.sh
#            bash docs/results/cpu-2026-12-07-one-tile-rotation/make-tree.sh
#   device:  carry [".gpu/tma", ".gpu/rot", ".gpu/rot2"];
#            bash docs/results/gpu-2026-12-07-eighteenth/run.sh start /root/a   (or: start /root/a proxy, on an
#            H100, after docs/results/cpu-2026-12-07-h200-proxy/make-trees.sh, carry .gpu/proxy as well)
#   later:   cat /root/a/progress; then tar the folder's table*.txt and *.tgz into $OUT
set -u
# an S4KV_KERNEL_CONFIG list with one decode entry for head size 128: d OPTIONS_JSON
d() { echo "[{\"kernel\":\"decode\",\"head_size\":128,\"options\":$1}]"; }
case $1 in
start)
  out=$2; rm -rf /root/src "$out"; mkdir -p /root/src "$out"
  tar --exclude='./.gpu/c?' --exclude=__pycache__ -cf - . | tar -C /root/src -xf -
  cd /root/src && setsid nohup bash docs/results/gpu-2026-12-07-eighteenth/run.sh "${3:-configs}" "$out" \
    >"$out/log" 2>&1 </dev/null &
  echo "started $!" ;;
configs)
  out=$2
  fp16ops='[{"kernel":"decode-grid","head_size":0,"options":{"fp16_operands":true}}]'
  shipped="shipped=[]"; int8="int8=$(d '{"INT8_KEYS":1}')"; s7="stages7=$(d '{"PAGE_STAGES":7}')"
  tma="tma@.gpu/tma=$(d '{"TMA_PAGES":1}')"
  echo "timing $(date -u +%T)" >"$out/progress"
  CONFIGS="$shipped $int8 $s7 int8s7=$(d '{"INT8_KEYS":1,"PAGE_STAGES":7}') fp16ops=$fp16ops $tma rot@.gpu/rot=[] rot2@.gpu/rot2=[]" \
    OUT=$out/timing ALIASES="0 128" PASSES=2 POINTS="8192,32768 32,8" \
    bash tools/gpu/decode_configs.sh >"$out/table.txt" 2>&1
  echo "profiles $(date -u +%T)" >>"$out/progress"
  CONFIGS="$shipped $int8 $s7 $tma" OUT=$out/profiles PASSES=0 PROFILE="0 128" POINTS="8192 32" \
    bash tools/gpu/decode_configs.sh >"$out/table-profiles.txt" 2>&1
  echo "done $(date -u +%T)" >>"$out/progress" ;;
proxy)  # on an H100: the seventeenth session's proxy calibration (docs/results/cpu-2026-12-07-h200-proxy/,
        # its make-trees.sh here, carry .gpu/proxy too) with the third page buffer and TMA_PAGES beside it
  out=$2
  echo "proxy $(date -u +%T)" >"$out/progress"
  CONFIGS="shipped9@.gpu/proxy/shipped-9=[] fo9@.gpu/proxy/fo-9=$(d '{"FIRST_OFFSET":true}') now=[] \
int8=$(d '{"INT8_KEYS":1}') stages7=$(d '{"PAGE_STAGES":7}') tma@.gpu/tma=$(d '{"TMA_PAGES":1}')" \
    ALIASES="0 128 384 768 1024" PASSES=2 POINTS="8192,32768 32,8" OUT=$out/proxy \
    bash tools/gpu/decode_configs.sh >"$out/table-proxy.txt" 2>&1
  echo "done $(date -u +%T)" >>"$out/progress" ;;
esac
