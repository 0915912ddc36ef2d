#!/usr/bin/env bash
# One line per kernel-bench log of run.sh (cpu-2026-12-06-first-offset): the decode call per layer
# (8 layers per graph) and its share of copy, and the page kernel (_decode_kernel) per point.
# bash summarize.sh DIR
D=${1:?DIR}
cat "$D/progress" 2>/dev/null
for f in "$D"/*-alias*-pass*.log; do
  [ -e "$f" ] || continue
  awk -v n="$(basename "$f" .log)" '
    /copy bandwidth/ {for (i = 2; i <= NF; i++) if ($i ~ /^TB\/s/) {bw = $(i-1) " TB/s"; break}}
    /^ +[0-9]+ +[0-9]+ +[0-9]+ / {pt=$1"x"$2; call[pt]=$(NF-3); share[pt]=$(NF-2); order[++k]=pt; seen=0}
    /_decode_kernel/ && !seen {for (i=1;i<=NF;i++) if ($i=="_decode_kernel") page[pt]=$(i+1); seen=1}
    END {printf "%-28s %s", n, bw; for (i=1;i<=k;i++) {p=order[i]; printf " | %s call %s us %s page %s us", p, call[p], share[p], page[p]}; print ""}' "$f"
done
tail -n 15 "$D/diag.log" 2>/dev/null
tail -n 5 "$D/tests.log" 2>/dev/null
exit 0
