#!/usr/bin/env bash
# Issue 14, 2026-12-06 (fifth session). Ran at 83c4917 (pass 3: ENGINES_ONLY=1 PASSES=3 CONFIGS="prri
# default pr", into /root/rout3); PREFETCH_PAGES and ROTATE_IN_PAGES are gone since da4be8b (their
# diffs are in this folder: apply them to run prpf and prri again). Run from the repository root after the bundle's setup and
# `run-on-device.sh patch`, detached (about 20 min on an H100):
#   setsid nohup bash docs/results/gpu-h100-2026-12-06-page-loop-bound/run.sh /root/rout >/root/r.log 2>&1 </dev/null &
# progress in /root/rout/progress. Three parts, one after the other (nothing else on the GPU):
#
# 1. An engine's decode step at 32,511 x 8 (Qwen2.5-7B shape, dummy weights, vLLM 0.24.0, CUDA graphs,
#    prefix caching on; tools/gpu/profile_decode.py), one engine per run, configurations alternating:
#      default  what ships
#      pr       {"decode-grid": {"pdl_rows": true}}: the row kernel and the block store let the page
#               kernel start while they run (s4kv.kernels.decode.programmatic_rows); since c6ccbf1
#               only the store's programs that store (and one more) wait for the row kernel
#      prpf     pr, and each page program asks L2 for its first 2 pages before it waits
#      prri     pr, and the page programs rotate their queries themselves ({"decode": {"ROTATE_IN_PAGES":
#               true}}), so that they wait for the row kernel and the store only where they read a
#               unit completed this step: the page loop runs beside those two kernels
# 2. The decode kernel bench with every row's complete pages in a pool of 128 blocks that stays in L2
#    (--alias-blocks 128) beside the normal inputs, for the shipped kernel and the page-loop probes
#    noconst and all3 (built from this tree: docs/results/gpu-h200-2026-12-05-decode-configs/probes/,
#    carried in .gpu/probes-head): what bounds the page loop where DRAM does not, the H200's regime.
set -u
W=${1:-/root/rout}
mkdir -p "$W"
# shellcheck disable=SC1091
source /root/s4kv-env.sh
export PYTHONPATH="$PWD:${PYTHONPATH:-/tmp/site}"
echo '[{"kernel": "decode-grid", "head_size": 0, "options": {"pdl_rows": true}}]' >"$W/pr.json"
echo '[{"kernel": "decode-grid", "head_size": 0, "options": {"pdl_rows": true}},
 {"kernel": "decode", "head_size": 128, "options": {"PREFETCH_PAGES": 2}}]' >"$W/prpf.json"
echo '[{"kernel": "decode-grid", "head_size": 0, "options": {"pdl_rows": true}},
 {"kernel": "decode", "head_size": 128, "options": {"ROTATE_IN_PAGES": true}}]' >"$W/prri.json"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch, triton, vllm; print(torch.__version__, triton.__version__, vllm.__version__)'
} >"$W/versions.txt" 2>&1
gpu_free() {  # the next engine starts only once this one's GPU memory is free
  for _ in $(seq 30); do [ -z "$(nvidia-smi --query-compute-apps=pid --format=csv,noheader)" ] && break; sleep 2; done
}
if [ -z "${SKIP_ENGINES:-}" ]; then
  for pass in ${PASSES:-1 2}; do
    for c in ${CONFIGS:-default pr prpf prri}; do
      cfg=""; [ "$c" != default ] && cfg="$W/$c.json"
      t0=$SECONDS
      S4KV_KERNEL_CONFIG=$cfg timeout 300 python3 tools/gpu/profile_decode.py --kv int4_kivi --context "${CONTEXT:-32511}" \
        --batch "${BATCH:-8}" --steps 32 --json "$W/$c-$pass.json" >"$W/$c-$pass.log" 2>&1
      echo "$c pass $pass: exit $? after $((SECONDS - t0)) s; $(grep -m1 'decode step' "$W/$c-$pass.log")" >>"$W/progress"
      gpu_free
    done
  done
fi
[ -n "${ENGINES_ONLY:-}" ] && { echo done >>"$W/progress"; exit 0; }
for pass in 1 2; do
  for tree in cur noconst all3; do
    dir=$PWD; [ $tree != cur ] && dir=$PWD/.gpu/probes-head/$tree
    for a in 0 128; do
      [ $tree != cur ] && [ $pass = 2 ] && [ $a = 0 ] && continue  # the probes from DRAM: timed 2026-12-05
      t0=$SECONDS
      # from the tree's own folder: `python3 -m` puts the working directory first on sys.path
      (cd "$dir" && TRITON_CACHE_DIR=/root/tc-$tree PYTHONPATH="$dir:${PYTHONPATH}" timeout 240 python3 -m s4kv.kernels.bench \
        --contexts 8192,32768 --batches 32,8 --breakdown $( [ $a = 0 ] || echo --alias-blocks $a ) \
        --json "$W/alias-$tree-$a-$pass.json") >"$W/alias-$tree-$a-$pass.log" 2>&1
      echo "bench $tree alias $a pass $pass: exit $? after $((SECONDS - t0)) s" >>"$W/progress"
    done
  done
done
# 3. The window programs' place in the grid at 32k x 8: 16 page splits give 512 page programs for the
#    H100's 528 program slots (132 SMs x 4), so of the 64 window programs (launched last) 48 wait for
#    page programs to end; 14 splits (448 + 64) fit in one wave with 19 pages instead of 16 in the
#    longest page program. Kernel bench at 32,768 (no window) and 33,023 (254 window rows), alternating.
echo '[{"kernel": "decode-grid", "head_size": 0, "options": {"max_splits": 14}}]' >"$W/splits14.json"
for pass in 1 2; do
  for c in default splits14; do
    cfg=""; [ "$c" != default ] && cfg="$W/$c.json"
    t0=$SECONDS
    S4KV_KERNEL_CONFIG=$cfg timeout 200 python3 -m s4kv.kernels.bench --contexts 32768,33023 --batches 8,8 --breakdown \
      --json "$W/splits-$c-$pass.json" >"$W/splits-$c-$pass.log" 2>&1
    echo "bench $c pass $pass: exit $? after $((SECONDS - t0)) s" >>"$W/progress"
  done
done
echo done >>"$W/progress"
