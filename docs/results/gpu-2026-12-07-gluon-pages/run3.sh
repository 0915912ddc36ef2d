#!/usr/bin/env bash
# On the device: gluon_pages12 (values split by channels across the warps; 11 with the first value's
# terms in the accumulators' own layout) under register caps and ring depths, then gluon_pages11, the
# shipped kernel in every run; records to $OUT.
set -uo pipefail
bash make-modules.sh  # the probe's later versions from their diffs
export PYTHONPATH=$PWD/../../..
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
run() {  # MODULE MAXNREG STAGES DTYPES
  echo "== $1 maxnreg $2 stages $3 $4" | tee -a $OUT/probe3.log
  if [ "$2" = 0 ]; then unset GLUON_MAXNREG; else export GLUON_MAXNREG=$2; fi
  GLUON_STAGES=$3 timeout 150 python3 probe.py $1 --dtypes $4 --out $OUT/$1.r$2.s$3.$4.json 2>&1 | grep '{' | tee -a $OUT/probe3.log
}
run gluon_pages12 128 2 bf16
run gluon_pages12 128 3 bf16
run gluon_pages12 0 3 bf16
run gluon_pages11 128 2 bf16
run gluon_pages12 128 2 fp16
