#!/usr/bin/env bash
# Decode kernel launch configurations (S4KV_KERNEL_CONFIG entries) timed one after the other in one
# call, each first checked against the PyTorch reference on the bench's inputs; no vLLM needed:
#   CONFIGS="name=JSON name=JSON ..." PASSES=2 POINTS="8192,32768,1024 32,8,64" [ALIASES="0 128"] [PROFILE="0 128"] \
#     bash tools/gpu/decode_configs.sh
# JSON: an S4KV_KERNEL_CONFIG list ([] = the shipped defaults), without spaces. NAME@DIR=JSON runs that
# configuration from another tree (DIR holds its s4kv/ and tests/, e.g. `git archive REV s4kv tests`,
# relative to the repository root), so that code variants alternate with launch options. ALIASES: every pass
# once per value, the bench's --alias-blocks (0: the pages from DRAM; 128: a pool of 128 blocks that
# stays in L2, where the page loop rather than DRAM bounds the kernel); with it the records are named
# NAME-aliasA-passP. PROFILE="A ...": then, per configuration and value, Nsight Compute's per-
# instruction stall samples of the page kernel at the first point (--alias-blocks A; 0: DRAM), as
# NAME-profileA.csv.gz for tools/ncu_stalls.py (with the configuration's options) beside its details
# page. The device tool returns few files, so the logs, JSON records, exports and versions.txt (GPU,
# driver, torch, Triton) go into one archive, $OUT/decode-configs.tgz; the table is printed
# (tools/kernel_bench_table.py).
set -u
OUT=${OUT:-/tmp/out}
work=$(mktemp -d)
read -r CTX BATCH <<<"${POINTS:-8192,32768,1024 32,8,64}"
nvidia-smi -L
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c 'import torch, triton; print(torch.__version__, triton.__version__)'; date -u; } >"$work/versions.txt" 2>&1
# NAME and tree of a spec (NAME[@DIR]=JSON)
parse() { name=${1%%=*}; tree=.; case $name in *@*) tree=${name#*@}; name=${name%%@*} ;; esac; }
# a command from a tree's root, importing its s4kv (and its tests' helpers), with a configuration
in_tree() { (cd "$tree" && PYTHONPATH="$PWD:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}" S4KV_KERNEL_CONFIG=$work/$name.config.json "$@"); }
for spec in $CONFIGS; do
  parse "$spec"
  echo "${spec#*=}" >"$work/$name.config.json"
  in_tree python3 -m pytest -q -x -p no:cacheprovider tests/test_kernels.py \
    -k decode_bench_inputs >"$work/$name-check.log" 2>&1
  echo "$name check: $(tail -1 "$work/$name-check.log")"
done
for pass in $(seq 1 "${PASSES:-2}"); do
  for a in ${ALIASES:-0}; do
    for spec in $CONFIGS; do
      parse "$spec"
      if [ -n "${ALIASES:-}" ]; then rec=$name-alias$a-pass$pass; else rec=$name-$pass; fi
      in_tree python3 -m s4kv.kernels.bench --contexts "$CTX" --batches "$BATCH" \
        --breakdown $( [ "$a" = 0 ] || echo --alias-blocks "$a" ) --json "$work/$rec.json" >"$work/$rec.log" 2>&1
      echo "== $name pass $pass${ALIASES:+ alias $a}"
      grep -v "^device\|flash-attn\|Warning\|_warn_once" "$work/$rec.log" | grep -v "^ *context"
    done
  done
done
python3 tools/kernel_bench_table.py "$work"/*[0-9].json  # the records, not the NAME.config.json files
if [ -n "${PROFILE:-}" ]; then
  NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
  for a in $PROFILE; do
    for spec in $CONFIGS; do
      parse "$spec"; rec=$name-profile$a
      in_tree timeout 200 "$NCU" --clock-control none --graph-profiling node \
        --kernel-name regex:_decode_kernel --launch-skip 3 --launch-count 1 --section SpeedOfLight \
        --section SchedulerStats --section WarpStateStats --section SourceCounters -f -o "$work/$rec" \
        python3 -m s4kv.kernels.bench --contexts "${CTX%%,*}" --batches "${BATCH%%,*}" \
        $( [ "$a" = 0 ] || echo --alias-blocks "$a" ) >"$work/$rec.log" 2>&1 \
        && "$NCU" -i "$work/$rec.ncu-rep" --page source --csv --print-source sass | gzip >"$work/$rec.csv.gz" \
        && "$NCU" -i "$work/$rec.ncu-rep" --page details >"$work/$rec-details.txt"
      echo "$rec: exit $?"
      rm -f "$work/$rec.ncu-rep"
    done
  done
fi
mkdir -p "$OUT" && tar -czf "$OUT/decode-configs.tgz" -C "$work" .
