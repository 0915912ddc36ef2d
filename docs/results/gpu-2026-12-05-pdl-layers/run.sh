#!/usr/bin/env bash
# Programmatic dependent launch (launch option {"decode-grid": {"pdl": true}}, off by default) against
# stream order, timed per call of 8 layers in one CUDA graph (s4kv.kernels.bench's default --layers 8,
# beside the one-call figures): its earlier timings (0.985-1.028x, 2026-12-02) were one call per
# graph, whose figures carry ~10 us of the benchmark's own (../gpu-h100-2026-12-05-layers-per-graph/).
# tools/gpu/decode_configs.sh checks each configuration against the reference on the bench's
# inputs, then times them one after the other; no vLLM needed. Detached; table:
# /root/pdlout/table.txt, logs and records in /root/pdlout/decode-configs.tgz.
export OUT=/root/pdlout; mkdir -p $OUT
cd "$(dirname "$0")/../../.."  # the repository root
python3 -c 'import torch, triton; print(torch.__version__, triton.__version__)' >$OUT/versions.txt 2>&1
CONFIGS='cur=[] pdl=[{"kernel":"decode-grid","head_size":0,"options":{"pdl":true}}]' PASSES=${PASSES:-2} \
  POINTS="8192,32768,1024 32,8,64" bash tools/gpu/decode_configs.sh >$OUT/table.txt 2>&1
echo done >$OUT/done
