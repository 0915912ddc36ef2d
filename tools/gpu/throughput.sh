#!/usr/bin/env bash
# vLLM's own offline throughput benchmark (`vllm bench throughput`) on the workloads of issue 13,
# one engine per (workload, KV dtype), on the Qwen2.5-7B shape with dummy weights and SmolLM2's
# tokenizer, prefix caching off:
#   W1  --random-input-len 8192  --random-output-len 256  --num-prompts 256   (default memory)
#   W2  --random-input-len 1024  --random-output-len 1024 --num-prompts 512   (default memory)
#   W3  --random-input-len 16384 --random-output-len 1024 --num-prompts 128 --kv-cache-memory-bytes 17179869184
#
#   bash tools/gpu/throughput.sh OUTDIR [RUN ...]     RUN = W<n>:<kv dtype>, default: all of them
#
# Writes OUTDIR/<W>-<kv>.json (--output-json), OUTDIR/<W>-<kv>.log (the engine's log: KV cache
# size, max concurrency) and OUTDIR/commands.txt, OUTDIR/versions.txt. Needs /root/s4kv-env.sh
# (run-on-device.sh sources it) and the patched vLLM.
set -u
out=${1:?usage: throughput.sh OUTDIR [RUN ...]}; shift
mkdir -p "$out"
runs=("$@")
[ ${#runs[@]} -gt 0 ] || runs=(W3:auto W3:fp8 W3:int4_kivi W1:auto W1:int4_kivi W2:auto W2:int4_kivi)
model=$(python3 -c "from s4kv.models import dummy_model; print(dummy_model('qwen2.5-7b'))")
tokenizer=${S4KV_MODEL:-/root/models/smollm2-135m}
declare -A args=(
  [W1]="--random-input-len 8192 --random-output-len 256 --num-prompts 256"
  [W2]="--random-input-len 1024 --random-output-len 1024 --num-prompts 512"
  [W3]="--random-input-len 16384 --random-output-len 1024 --num-prompts 128 --kv-cache-memory-bytes 17179869184"
)
python3 - >"$out/versions.txt" <<'PY'
import platform, torch, triton, vllm
print(f"vllm {vllm.__version__}; torch {torch.__version__}; triton {triton.__version__}; "
      f"{torch.cuda.get_device_name()}; python {platform.python_version()}")
PY
cat "$out/versions.txt"

gpu_free() {  # wait (up to 120 s) until no process holds the GPU: a new engine sizes its KV cache from free memory
  local t0=$SECONDS
  while [ -n "$(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null)" ]; do
    [ $((SECONDS - t0)) -ge 120 ] && { echo "GPU still held after 120 s"; return 1; }
    sleep 2
  done
}

status=0
for run in "${runs[@]}"; do
  w=${run%%:*}; kv=${run#*:}
  cmd="python3 -m vllm.entrypoints.cli.main bench throughput --model $model --tokenizer $tokenizer --load-format dummy --dataset-name random ${args[$w]} --kv-cache-dtype $kv --no-enable-prefix-caching --output-json $out/$w-$kv.json"
  echo "$w $kv: $cmd" | tee -a "$out/commands.txt"
  gpu_free || status=1
  t0=$SECONDS
  $cmd >"$out/$w-$kv.log" 2>&1
  rc=$?
  echo "$w $kv: exit $rc after $((SECONDS - t0)) s; $(grep -E '^Throughput:' "$out/$w-$kv.log" | tail -n 1)"
  grep -E "GPU KV cache size|Maximum concurrency" "$out/$w-$kv.log" | tail -n 2
  [ $rc -eq 0 ] || { status=1; tail -n 15 "$out/$w-$kv.log"; }
done
exit $status
