#!/usr/bin/env bash
# Build the decode page-loop probes (each takes one part of the loop's work away; their outputs are
# wrong, their times are the point) as trees under .gpu/probes/, from the tree they were written
# against (274df4b): run from the repository root, then carry [".gpu/probes"] and run
# run-probes.sh there (no vLLM needed).
#   unpack4: the code unpack at 4 instead of 7 instructions per 8 codes (2 prmt, no shift or mask)
#   noconst: no per-page key terms (scales into the query, score constant, first key, first value)
#   nomax:   no max over a page's tokens (the running max from the first token's exact score)
#   all3:    the three together
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
for p in unpack4 noconst nomax all3; do
  rm -rf ".gpu/probes/$p"; mkdir -p ".gpu/probes/$p"
  git archive 274df4b s4kv | tar -x -C ".gpu/probes/$p"
  (cd ".gpu/probes/$p" && patch -s -p1 <"$here/$p.diff")
done
cp "$here/run-probes.sh" .gpu/probes/
echo "probes: $(ls .gpu/probes)"
