#!/usr/bin/env bash
# The twelfth session's two fp16 unpacks (reverted, docs/results/gpu-h100-2026-12-07-fp16-unpack/) as
# trees under .gpu/t13/ for run.sh: a70 (6 instructions per 8 codes, both tiles) and b6a (5 for the
# value tiles). Run from the repository root; then carry [".gpu/t13"].
set -euo pipefail
for t in a70:a70d789 b6a:b6a8fa9; do
  name=${t%%:*}; rev=${t#*:}
  rm -rf ".gpu/t13/$name"; mkdir -p ".gpu/t13/$name"
  git archive "$rev" s4kv tests | tar -x -C ".gpu/t13/$name"
done
du -sh .gpu/t13
