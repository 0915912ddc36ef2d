#!/usr/bin/env bash
# The DEQUANT_KEYS trees under .gpu/ (git-ignored), from this repository's HEAD and dequant-keys.diff:
#   .gpu/dq    the keys dequantized in the key dots' operand registers (the variant)
#   .gpu/dqnc  the same without the clamp at fp16's largest value (a timing probe: wrong at that edge)
# Run from the repository root; then carry [".gpu/dq", ".gpu/dqnc", ".gpu/pytest-wheels"] and run run.sh.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
for t in dq dqnc; do
  rm -rf ".gpu/$t"; mkdir -p ".gpu/$t"
  git archive HEAD s4kv tools tests | tar -x -C ".gpu/$t"
  (cd ".gpu/$t" && patch -s -p1 < "$here/dequant-keys.diff")
done
python3 - <<'PY'
p = ".gpu/dqnc/s4kv/kernels/decode.py"
s = open(p).read()
old = "    if KEY_DTYPE == tl.float16:\n        d = tl.minimum(d, tl.full([1, 1], 65504.0, KEY_DTYPE))\n"
assert old in s
open(p, "w").write(s.replace(old, "    # PROBE (timing only): no clamp at fp16's largest value\n"))
PY
[ -d .gpu/pytest-wheels ] || python3 -m pip download -q -d .gpu/pytest-wheels pytest
echo "trees: .gpu/dq .gpu/dqnc"
