#!/usr/bin/env bash
# On the device, second call: the page terms a page ahead (gluon_pages10) at two register caps, next
# to gluon_pages8 at 128 registers (4 programs per SM), and the shipped kernel in each run.
set -uo pipefail
bash make-modules.sh  # the probe's later versions from their diffs
export PYTHONPATH=$PWD/../../..
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
for cfg in "gluon_pages8 128" "gluon_pages10 128" "gluon_pages10 160" "gluon_pages10 0"; do
  set -- $cfg
  echo "== $1 maxnreg $2" | tee -a $OUT/probe2.log
  if [ "$2" = 0 ]; then unset GLUON_MAXNREG; else export GLUON_MAXNREG=$2; fi
  timeout 120 python3 probe.py $1 --dtypes bf16 --out $OUT/$1.r$2.json 2>&1 | grep '{' | tee -a $OUT/probe2.log
done
