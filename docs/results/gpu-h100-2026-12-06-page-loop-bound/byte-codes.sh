#!/usr/bin/env bash
# Ran at 5f6f525 (BYTE_CODES is gone since da4be8b: byte-codes.diff in this folder has it).
# The decode kernel with BYTE_CODES against the shipped one, one call on a fresh machine (no vLLM: the
# kernel bench needs torch and Triton only), one pass each: the pages from a pool that stays in L2
# first (where the page loop's instructions bound it), then from DRAM; then BYTE_CODES' GPU tests.
set -u
OUT=${OUT:-/tmp/out}
export PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >"$OUT/versions.txt"
python3 -c 'import torch, triton; print(torch.__version__, triton.__version__)' >>"$OUT/versions.txt"
echo '[{"kernel": "decode", "head_size": 128, "options": {"BYTE_CODES": true}}]' >/tmp/bytes.json
for a in 128 0; do
  for c in cur bytes; do
    cfg=""; [ $c = bytes ] && cfg=/tmp/bytes.json
    S4KV_KERNEL_CONFIG=$cfg timeout 100 python3 -m s4kv.kernels.bench --contexts 8192,32768 --batches 32,8 --breakdown \
      $( [ $a = 0 ] || echo --alias-blocks $a ) --json "$OUT/bytes-$c-$a.json" >"$OUT/bytes-$c-$a.log" 2>&1
    echo "== $c alias $a: exit $?"; grep -E "^ +(8192|32768) |_rotate" "$OUT/bytes-$c-$a.log" | cut -c1-150
  done
done
timeout 70 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py tests/test_code_unpack.py -k "byte or bytes" >"$OUT/tests.log" 2>&1
echo "tests exit $?"; tail -n 2 "$OUT/tests.log"
