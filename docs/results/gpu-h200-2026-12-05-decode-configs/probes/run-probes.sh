#!/usr/bin/env bash
# The decode page-loop probes (make-probes.sh), timed beside this tree (cur), PASSES passes
# (default 1), detached-friendly: the table lands in /root/probeout/table.txt, then "done".
# Each tree with its own Triton cache (before be5a99d, Triton's cache key did not see
# s4kv.kernels.code_ptx's PTX text, and the probes are from before it).
OUT=/root/probeout; mkdir -p $OUT
cd "$(dirname "$0")/../.."
nvidia-smi -L >$OUT/gpu.txt
for pass in $(seq 1 "${PASSES:-1}"); do
  for spec in cur=. unpack4=.gpu/probes/unpack4 noconst=.gpu/probes/noconst nomax=.gpu/probes/nomax all3=.gpu/probes/all3; do
    name=${spec%%=*}; dir=$(cd "${spec#*=}" && pwd)
    (cd "$dir" && TRITON_CACHE_DIR=/root/tc-$name PYTHONPATH="$dir" python3 -m s4kv.kernels.bench \
      --contexts 8192,32768,1024 --batches 32,8,64 --breakdown --json $OUT/probe-$name-$pass.json) \
      >$OUT/probe-$name-$pass.log 2>&1
    echo "== $name pass $pass"; grep -v "^device\|flash-attn\|Warning\|_warn_once\|^ *context" $OUT/probe-$name-$pass.log
  done
done >$OUT/table.txt 2>&1
echo done >$OUT/done
