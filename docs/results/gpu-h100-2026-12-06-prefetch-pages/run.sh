#!/usr/bin/env bash
# An engine's decode step at 32,511 x 8 (Qwen2.5-7B shape, dummy weights, vLLM 0.24.0, CUDA graphs,
# prefix caching on) with three launch configurations, two passes alternating, each in a process of
# its own (tools/gpu/profile_decode.py):
#   default  what ships
#   pr       {"decode-grid": {"pdl_rows": true}}: the row kernel and the block store let the page
#            kernel start while they run (s4kv.kernels.decode.programmatic_rows)
#   prpf     pr, and each page program asks L2 for its first 2 pages before it waits for them
#            ({"decode": {"PREFETCH_PAGES": 2}}, s4kv.kernels.decode._prefetch_pages)
# Run from the repository root after the bundle's setup, detached (about 14 min):
#   setsid nohup bash docs/results/gpu-h100-2026-12-06-prefetch-pages/run.sh /root/pfout >/root/pf.log 2>&1 &
# progress in /root/pfout/progress; each run's JSON and log in /root/pfout.
set -u
W=${1:-/root/pfout}
mkdir -p "$W"
# shellcheck disable=SC1091
source /root/s4kv-env.sh
export PYTHONPATH="$PWD:${PYTHONPATH:-/tmp/site}"
echo '[{"kernel": "decode-grid", "head_size": 0, "options": {"pdl_rows": true}}]' >"$W/pr.json"
echo '[{"kernel": "decode-grid", "head_size": 0, "options": {"pdl_rows": true}},
 {"kernel": "decode", "head_size": 128, "options": {"PREFETCH_PAGES": 2}}]' >"$W/prpf.json"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch, triton, vllm; print(torch.__version__, triton.__version__, vllm.__version__)'
for pass in ${PASSES:-1 2}; do
  for c in ${CONFIGS:-default pr prpf}; do
    cfg=""; [ "$c" != default ] && cfg="$W/$c.json"
    t0=$SECONDS
    S4KV_KERNEL_CONFIG=$cfg timeout 400 python3 tools/gpu/profile_decode.py --kv int4_kivi --context "${CONTEXT:-32511}" \
      --batch "${BATCH:-8}" --steps 32 --json "$W/$c-$pass.json" >"$W/$c-$pass.log" 2>&1
    echo "$c pass $pass: exit $? after $((SECONDS - t0)) s; $(grep -m1 'decode step' "$W/$c-$pass.log")" >>"$W/progress"
    # the next engine starts only once this one's GPU memory is free
    for _ in $(seq 30); do [ -z "$(nvidia-smi --query-compute-apps=pid --format=csv,noheader)" ] && break; sleep 2; done
  done
done
echo done >>"$W/progress"
