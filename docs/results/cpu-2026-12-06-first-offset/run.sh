#!/usr/bin/env bash
# FIRST_OFFSET (first-offset.diff: one offset per split, its first page's first exact score, instead
# of the running max) against the shipped decode kernel, on whatever GPU the device tool lends, no
# vLLM needed (one call, about 3 minutes). Here first: bash docs/results/cpu-2026-12-06-first-offset/make-tree.sh
# Call: carry [".gpu/first-offset", ".gpu/pytest-wheels"], command
#   OUT=$OUT bash docs/results/cpu-2026-12-06-first-offset/run.sh
#   1. the decode kernel bench at 8k x 32 and 32k x 8, from DRAM and with the pages in L2
#      (--alias-blocks 128), the shipped kernel (this tree) and FIRST_OFFSET (.gpu/first-offset,
#      the option on) alternating, two passes
#   2. tools/gpu/diag_tail.py in the variant tree: both against the PyTorch path on the bench's inputs
#   3. the variant tree's kernel tests of the option on the GPU (pytest from .gpu/pytest-wheels)
set -u
O=${OUT:?OUT=DIR}
mkdir -p "$O"
HERE=$PWD
V=$HERE/.gpu/first-offset
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c 'import torch, triton; print(torch.__version__, triton.__version__)'; date -u; } > "$O/versions.txt" 2>&1
for _ in 1 2 3; do PYTHONPATH=$HERE python3 -c 'import s4kv.kernels.bench' 2>/dev/null && break; sleep 2; done
echo '[{"kernel": "decode", "head_size": 128, "options": {"FIRST_OFFSET": true}}]' > /tmp/first-offset.json
bench() {  # NAME TREE ALIAS [ENV=VALUE]
  local name=$1 tree=$2 a=$3 t0=$SECONDS; shift 3
  (cd "$tree" && env PYTHONPATH="$tree" "$@" timeout 90 python3 -m s4kv.kernels.bench --contexts 8192,32768 \
    --batches 32,8 --breakdown $( [ "$a" = 0 ] || echo --alias-blocks "$a" ) --json "$O/$name.json") > "$O/$name.log" 2>&1
  echo "$name: exit $? after $((SECONDS - t0)) s" >> "$O/progress"
}
for pass in 1 2; do
  for a in 0 128; do
    bench "shipped-alias$a-pass$pass" "$HERE" "$a"
    bench "first-offset-alias$a-pass$pass" "$V" "$a" S4KV_KERNEL_CONFIG=/tmp/first-offset.json
  done
done
t0=$SECONDS
(cd "$V" && PYTHONPATH="$V" timeout 90 python3 tools/gpu/diag_tail.py --variants default,FIRST_OFFSET \
  --shapes 8192x32,32768x8,8256x32,33023x8,320x2 --repeats 1) > "$O/diag.log" 2>&1
echo "diag: exit $? after $((SECONDS - t0)) s" >> "$O/progress"
pip install -q --no-index --find-links "$HERE/.gpu/pytest-wheels" pytest > "$O/pip.log" 2>&1
t0=$SECONDS
# node ids, not -k: the variant tree's folder name would match every test
T=tests/test_kernels.py
(cd "$V" && PYTHONPATH="$V:$V/tests" timeout 150 python3 -m pytest -q -p no:cacheprovider \
  "$T::test_first_offset_falls_back_where_p_would_overflow" "$T::test_decode_launch_variants_against_reference[first-offset]" \
  "$T::test_peaky_queries_against_reference[1-first-offset]" "$T::test_peaky_queries_against_reference[8-first-offset]" \
  "$T::test_peaky_queries_against_reference[16-first-offset]") > "$O/tests.log" 2>&1
echo "tests: exit $? after $((SECONDS - t0)) s" >> "$O/progress"
