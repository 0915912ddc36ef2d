#!/usr/bin/env bash
# The trees a lease times the rotation variants in: 1837662's s4kv, tests and tools (the tree they were made on; since
# the eighteenth session the forward rotation's two tiles are in the tree) with
# one-tile-rotation.diff (.gpu/rot) and two-tile-rotation.diff (.gpu/rot2) applied (git-ignored; the
# call carries them). From the repository root:
#   bash docs/results/cpu-2026-12-07-one-tile-rotation/make-tree.sh
set -eu
D=docs/results/cpu-2026-12-07-one-tile-rotation
for v in "rot one-tile" "rot2 two-tile"; do
  set -- $v
  rm -rf ".gpu/$1" && mkdir -p ".gpu/$1"
  git archive 1837662 s4kv tests tools | tar -C ".gpu/$1" -xf -  # the tree the diffs were made on
  find ".gpu/$1" -name __pycache__ -prune -exec rm -rf {} +
  (cd ".gpu/$1" && patch -s -p1 <"../../$D/$2-rotation.diff")
  echo "built .gpu/$1 ($(du -sh ".gpu/$1" | cut -f1))"
done
