#!/usr/bin/env bash
# Rebuild the probe's later versions in this folder from gluon_pages.py (v2) and the chain of diffs
# (gluon_pagesN.diff against the version before it; 10 against 8). They are not kept as files of
# their own: each repeats most of the one before. run.sh, run2.sh, run3.sh and static_gl.py call it.
set -euo pipefail
cd "$(dirname "$0")"
prev=gluon_pages.py
for v in 3 4 6 7 8 10 11 12; do
  base=$prev
  [ "$v" = 10 ] && base=gluon_pages8.py
  patch -s -o gluon_pages$v.py "$base" < gluon_pages$v.diff
  prev=gluon_pages$v.py
done
