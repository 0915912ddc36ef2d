#!/usr/bin/env bash
# The tree a lease times TMA_PAGES in: this checkout's s4kv and tests with tma-pages.diff applied, in
# .gpu/tma (git-ignored; the call carries it). From the repository root:
#   bash docs/results/cpu-2026-12-07-tma-pages/make-tree.sh
set -eu
rm -rf .gpu/tma && mkdir -p .gpu/tma
cp -r s4kv tests .gpu/tma/
find .gpu/tma -name __pycache__ -prune -exec rm -rf {} +
(cd .gpu/tma && patch -s -p1 <../../docs/results/cpu-2026-12-07-tma-pages/tma-pages.diff)
echo "built .gpu/tma ($(du -sh .gpu/tma | cut -f1))"
