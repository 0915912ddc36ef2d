#!/usr/bin/env bash
# On the device: each probe module against the shipped kernel (bf16 model), then the last one also
# with an fp16 model; records to $OUT. Usage: bash run.sh MODULE... (from this folder)
set -uo pipefail
bash make-modules.sh  # the probe's later versions from their diffs
export PYTHONPATH=$PWD/../../..
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a $OUT/device.txt
for m in "$@"; do
  echo "== $m bf16" | tee -a $OUT/probe.log
  timeout 200 python3 probe.py $m --dtypes bf16 --out $OUT/$m.bf16.json 2>&1 | grep -v Warning | tail -6 | tee -a $OUT/probe.log
done
last=${@: -1}
echo "== $last fp16" | tee -a $OUT/probe.log
timeout 200 python3 probe.py $last --dtypes fp16 --out $OUT/$last.fp16.json 2>&1 | grep -v Warning | tail -6 | tee -a $OUT/probe.log
