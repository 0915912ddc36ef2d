#!/usr/bin/env bash
# The tree the lease times FIRST_OFFSET in: this checkout's s4kv, tests and tools with
# first-offset.diff applied, in .gpu/first-offset (git-ignored; run.sh's call carries it).
# From the repository root: bash docs/results/cpu-2026-12-06-first-offset/make-tree.sh
set -eu
D=docs/results/cpu-2026-12-06-first-offset
rm -rf .gpu/first-offset && mkdir -p .gpu/first-offset
cp -r s4kv tests tools .gpu/first-offset/
find .gpu/first-offset -name __pycache__ -prune -exec rm -rf {} +
(cd .gpu/first-offset && patch -s -p1 < "../../$D/first-offset.diff")
echo "built .gpu/first-offset ($(du -sh .gpu/first-offset | cut -f1))"
