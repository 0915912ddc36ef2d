#!/usr/bin/env bash
# The two trees run.sh times beside this checkout, in .gpu/proxy (git-ignored; the call carries it):
#   shipped-9: 81e1d60's s4kv and tests, the tree the ninth session timed on the H200 (its kernels are 6b1ae94's)
#   fo-9:      the same with ../cpu-2026-12-06-first-offset/first-offset.diff applied (FIRST_OFFSET, off
#              unless the launch option turns it on), the variant the ninth session timed beside it
# From the repository root: bash docs/results/cpu-2026-12-07-h200-proxy/make-trees.sh
set -eu
rm -rf .gpu/proxy && mkdir -p .gpu/proxy/shipped-9 .gpu/proxy/fo-9
git archive 81e1d60 s4kv tests | tar -C .gpu/proxy/shipped-9 -xf -
git archive 81e1d60 s4kv tests tools | tar -C .gpu/proxy/fo-9 -xf -
(cd .gpu/proxy/fo-9 && patch -s -p1 <../../../docs/results/cpu-2026-12-06-first-offset/first-offset.diff && rm -rf tools)
echo "built .gpu/proxy ($(du -sh .gpu/proxy | cut -f1))"
