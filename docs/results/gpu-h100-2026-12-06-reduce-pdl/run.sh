#!/usr/bin/env bash
# Issue 14, 2026-12-06: the decode call per call of 8 layers in one CUDA graph (s4kv.kernels.bench's
# default --layers 8) under
#   cur   the shipped launch (stream order, the reduction's pipelined loop over the partials)
#   pdl   programmatic dependent launch ({"decode-grid": {"pdl": true}}; the reduction loads the
#         rotation's tiles before it waits for the page kernel)
#   pr32  the reduction's partials loaded as one tile of 32 (partial, head) rows
#   pdl-pr32    both
# at 8k x 32 and 32k x 8 (the issue's points; POINTS overrides), each first checked against the
# reference on the bench's inputs (tools/gpu/decode_configs.sh), two
# passes; on an H200 then the page-loop probes noconst and all3 per layer beside this tree (one pass)
# (../gpu-h100-2026-12-05-layers-per-graph/run.sh, which also runs the GPU kernel tests when the
# vLLM bundle is installed by then). Detached; progress in /root/r14/progress, tables in /root/r14/.
set -u
R=/root/r14; mkdir -p $R
cd "$(dirname "$0")/../../.."  # the repository root
python3 -c 'import torch, triton; print(torch.__version__, triton.__version__)' >$R/versions.txt 2>&1
nvidia-smi -L >>$R/versions.txt
git log --oneline -1 >>$R/versions.txt 2>/dev/null
red() { echo "[{\"kernel\":\"decode-reduce\",\"head_size\":128,\"options\":{\"PART_ROWS\":$1}}"; }
# stream order spelled out: since this run programmatic dependent launch is the default on sm90
SO='{"kernel":"decode-grid","head_size":0,"options":{"pdl":false}}'
PDL='{"kernel":"decode-grid","head_size":0,"options":{"pdl":true}}'
CONFIGS="cur=[$SO] pdl=[$PDL] pr32=$(red 32),$SO] pdl-pr32=$(red 32),$PDL]" PASSES=${PASSES:-2} \
  OUT=$R POINTS="${POINTS:-8192,32768 32,8}" bash tools/gpu/decode_configs.sh >$R/configs.txt 2>&1
echo configs >>$R/progress
if nvidia-smi -L | grep -q H200; then
  echo "[$SO]" >$R/stream-order.json  # the probes' trees launch in stream order: so does this tree there
  BENCH_CONFIG=$R/stream-order.json PASSES=${PROBE_PASSES:-1} \
    bash docs/results/gpu-h100-2026-12-05-layers-per-graph/run.sh >$R/layers.log 2>&1
  cp /root/layersout/table.txt $R/layers-table.txt
fi
echo done >>$R/progress
