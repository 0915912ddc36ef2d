#!/usr/bin/env bash
# Issue 14, 2026-12-06 (sixth session): the decode kernel's TERMS_AHEAD option against the shipped
# page loop. Run from the repository root after the bundle's setup and `run-on-device.sh patch`,
# detached:
#   setsid nohup bash docs/results/gpu-2026-12-06-terms-ahead/run.sh /root/tout >/root/t.log 2>&1 </dev/null &
# progress in /root/tout/progress. Nothing else on the GPU meanwhile.
#
# 1. The kernel bench (Qwen2.5-7B shape) at 8k x 32 and 32k x 8, from DRAM and with every row's
#    complete pages in a pool of 128 blocks that stays in L2 (--alias-blocks 128: the page loop's
#    own bound), configurations alternating, PASSES passes:
#      default  what ships
#      ta       {"decode": {"TERMS_AHEAD": true}}: a split's pages' key terms and score bounds
#               before its page loop, the bounds as the running max (s4kv.kernels.decode._page_terms)
#      qk       a probe (outputs wrong, time real; carried in .gpu/probes-ta/qkload, qk-load-probe.diff):
#               ta with the key dots' operand q * s read per page (2 KB, as a loop that took it
#               from the terms would) instead of computed and moved into the operand layout
# 2. ENGINE=1: an engine's decode step at 32,511 x 8 (tools/gpu/profile_decode.py), one engine per
#    run, the two configurations alternating.
set -u
W=${1:-/root/tout}
mkdir -p "$W"
# shellcheck disable=SC1091
[ -f /root/s4kv-env.sh ] && source /root/s4kv-env.sh  # the bench alone needs only torch and Triton
export PYTHONPATH="$PWD:${PYTHONPATH:-/tmp/site}"
echo '[{"kernel": "decode", "head_size": 128, "options": {"TERMS_AHEAD": true}}]' >"$W/ta.json"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch, triton; print(torch.__version__, triton.__version__)'
  git log -1 --format=%H 2>/dev/null || true
} >"$W/versions.txt" 2>&1
# 0. Correctness on the GPU without vLLM: the decode kernel (default and TERMS_AHEAD) against the
#    PyTorch path (s4kv.backend.torch_ops) on the kernel bench's own inputs
timeout 300 python3 tools/gpu/diag_tail.py --variants default,TERMS_AHEAD --shapes 8192x32,32768x8,8256x32,33023x8,320x2 \
  --repeats 1 >"$W/diag.log" 2>&1
echo "diag: exit $?" >>"$W/progress"
for pass in $(seq "${PASSES:-2}"); do
  for a in 128 0; do
    for c in ${CONFIGS:-default ta qk}; do
      cfg=""; [ "$c" != default ] && cfg="$W/ta.json"
      dir=$PWD; [ "$c" = qk ] && dir=$PWD/.gpu/probes-ta/qkload
      t0=$SECONDS
      # from the tree's own folder: `python3 -m` puts the working directory first on sys.path
      (cd "$dir" && S4KV_KERNEL_CONFIG=$cfg TRITON_CACHE_DIR=/root/tc-$c PYTHONPATH="$dir:${PYTHONPATH}" timeout 240 \
        python3 -m s4kv.kernels.bench --contexts 8192,32768 --batches 32,8 --breakdown \
        $( [ $a = 0 ] || echo --alias-blocks $a ) --json "$W/bench-$c-$a-$pass.json") >"$W/bench-$c-$a-$pass.log" 2>&1
      echo "bench $c alias $a pass $pass: exit $? after $((SECONDS - t0)) s" >>"$W/progress"
    done
  done
done
gpu_free() {  # the next engine starts only once this one's GPU memory is free
  for _ in $(seq 30); do [ -z "$(nvidia-smi --query-compute-apps=pid --format=csv,noheader)" ] && break; sleep 2; done
}
if [ -n "${ENGINE:-}" ]; then
  for pass in $(seq "${ENGINE_PASSES:-2}"); do
    for c in default ta; do
      cfg=""; [ "$c" != default ] && cfg="$W/$c.json"
      t0=$SECONDS
      S4KV_KERNEL_CONFIG=$cfg timeout 300 python3 tools/gpu/profile_decode.py --kv int4_kivi --context 32511 \
        --batch 8 --steps 32 --json "$W/engine-$c-$pass.json" >"$W/engine-$c-$pass.log" 2>&1
      echo "engine $c pass $pass: exit $? after $((SECONDS - t0)) s; $(grep -m1 'decode step' "$W/engine-$c-$pass.log")" >>"$W/progress"
      gpu_free
    done
  done
fi
echo done >>"$W/progress"
