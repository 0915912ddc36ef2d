#!/usr/bin/env bash
# Everything S4 KV runs on the lent H200, in one command, after the bundle's setup
# (../shared/gpu/README.md: five chunk copies, then setup-on-device.sh).
#
#   bash tools/gpu/run-on-device.sh STEP...      (steps: patch tests tune tune-window pdl tune-stage smoke kernels variants profile profile-source diag-tail
#                                                 host-overhead profile-decode profile-decode-window store-warps
#                                                 kernels-baseline profile-baseline (BASELINE=DIR)
#                                                 bench-capacity capacity-defaults bench-speed bench-quality bench-quality-baseline bench-quality-floor throughput
#                                                 bench-serve tp-check tp-bench)
#   bash tools/gpu/run-on-device.sh --detach STEP...   the same, in its own process session, so that
#                                                 it outlives the call (a call ends at 10 min)
#   bash tools/gpu/run-on-device.sh collect [SECONDS]  wait up to SECONDS (default 560) for the
#                                                 detached run, then copy what it wrote into $OUT
#
# Every step logs to $OUT/<step>.log and goes on after a failure, so one call gives every answer;
# results land in $OUT (fetched back by the device tool). Needs: /root/s4kv-env.sh (from setup),
# the repository as the working directory (s4kv runs from the tree: PYTHONPATH=$PWD:/tmp/site).
set -u
cd "$(dirname "$0")/../.."
# shellcheck disable=SC1091
source /root/s4kv-env.sh
export PYTHONPATH="$PWD:${PYTHONPATH:-/tmp/site}"
export PYTHONUNBUFFERED=1
# NVLink multicast stays off on every lent machine (the device tool's rule: a program that uses it can
# take the host's GPUs out of service); set here for every step, the multi-GPU ones above all
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/s4kv-out}
mkdir -p "$OUT"
MODEL=${S4KV_MODEL:-/root/models/smollm2-135m}
# the vLLM release the bundle installed (its metadata; vLLM itself is not imported for this)
VLLM_VERSION=$(python3 -c 'import importlib.metadata as m; print(m.version("vllm").split("+")[0])' 2>/dev/null || echo unknown)
KVS=${KVS:-auto,fp8,turboquant_4bit_nc,int4_kivi}
status=0
# the decode kernel bench's points: the README's three (no window at 8k and 32k) and three whose rows
# carry a window of 63, 191 and 254 rows, as serving's do (0..255 rows)
DECODE_POINTS="--contexts 1024,8192,32768,8256,32704,33023 --batches 64,32,8,32,8,8"
DETACHED=/root/s4kv-detached   # the detached run's OUT, log and pid

# a lease's numbers are only worth having on the torch the installed vLLM pins (a missing torch chunk
# once left vLLM 0.33.0 running on the image's torch 2.11): refuse every step otherwise (exit 7)
if [ "${1:-}" != "collect" ]; then
  python3 tools/gpu/torch_pin.py || exit $?
fi
if [ "${1:-}" = "--detach" ]; then
  shift; rm -rf $DETACHED; mkdir -p $DETACHED/out
  OUT=$DETACHED/out setsid nohup bash "$0" "$@" >$DETACHED/log 2>&1 </dev/null &
  echo $! >$DETACHED/pid; echo "detached: pid $(cat $DETACHED/pid), steps $*; collect with: $0 collect"
  exit 0
fi
if [ "${1:-}" = "collect" ]; then
  pid=$(cat $DETACHED/pid); t0=$SECONDS
  # the pid, not a pattern: pgrep -f would also match the shell that runs this very command line
  while kill -0 "$pid" 2>/dev/null && [ $((SECONDS - t0)) -lt "${2:-560}" ]; do sleep 5; done
  kill -0 "$pid" 2>/dev/null && echo "detached run still going after ${2:-560} s: partial results"
  tail -n 40 $DETACHED/log
  for f in $DETACHED/out/*; do  # finished steps are .log/.tgz/.json; a step still running is a folder
    [ -e "$f" ] || continue
    if [ -d "$f" ]; then tar -C $DETACHED/out -czf "$OUT/$(basename "$f")-partial.tgz" "$(basename "$f")"
    else cp "$f" "$OUT/"; fi
  done
  bash tools/gpu/fit_out.sh "$OUT"
  exit 0
fi

# a call stopped at its limit leaves vLLM's engine process holding the GPU's memory: free it before
# any step, sparing a detached run that is still going (its processes share its session id), so
# that pass/fail steps (tests) can run beside a detached measurement that does not time anything
keep_sid=""
if [ -f $DETACHED/pid ] && kill -0 "$(cat $DETACHED/pid)" 2>/dev/null && [ "$$" != "$(cat $DETACHED/pid)" ]; then
  keep_sid=$(ps -o sid= -p "$(cat $DETACHED/pid)" | tr -d ' ')
fi
for p in $(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null | tr -d ' '); do
  [ -n "$keep_sid" ] && [ "$(ps -o sid= -p "$p" | tr -d ' ')" = "$keep_sid" ] && continue
  echo "killing leftover GPU process $p"; kill -9 "$p"; sleep 3
done

# Nsight Compute, for the profile steps (empty if the machine has none)
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)

# tuned launch options from an earlier `tune` step on this machine
CONFIG=/root/s4kv-kernel-config.json
[ -f $CONFIG ] && export S4KV_KERNEL_CONFIG=$CONFIG

step() {  # step NAME CMD...: run, log, remember failures, keep going; returns the command's status
  local name=$1; shift
  echo "=== $name: $*" | tee "$OUT/$name.log"
  local t0=$SECONDS
  "$@" >>"$OUT/$name.log" 2>&1
  local rc=$?
  echo "=== $name: exit $rc after $((SECONDS - t0)) s" | tee -a "$OUT/$name.log"
  tail -n 25 "$OUT/$name.log"
  [ $rc -eq 0 ] || status=1
  return $rc
}

profile_points() {  # NAME ARG...: tools/gpu/profile_decode.py ARG... for KVS at each PROFILE_POINTS point
  local name=$1 pt; shift
  for pt in ${PROFILE_POINTS:-8192x32}; do
    step "$name-$pt" python3 tools/gpu/profile_decode.py "$@" --kv "$KVS" --context "${pt%x*}" \
      --batch "${pt#*x}" --json "$OUT/$name-$pt.json"
  done
}

for s in "$@"; do
  case $s in
    patch)  # the same series application as the wheel build (forklayer), onto the installed vLLM (the
      # bundle's release: 0.24.0 from ../shared/gpu/make-bundle, 0.33.0 with tools/gpu/torch_bundle.py)
      command -v git >/dev/null || echo "no git binary on this machine: forklayer apply needs it"
      step patch python3 -m forklayer apply --vllm "$VLLM_VERSION" --target /tmp/site
      # from 0.33 on, int4_kivi is declared by s4kv's `vllm.general_plugins` entry point, which vLLM finds
      # in installed metadata only: install the tree's own package (its code stays shadowed by the tree)
      if [ "$VLLM_VERSION" != 0.24.0 ] && [ "$VLLM_VERSION" != 0.32.0 ]; then
        step plugin python3 -m pip install -q --no-deps --no-index --no-build-isolation --upgrade \
          --target /tmp/site . && rm -rf build s4kv.egg-info
      fi ;;
    tests)  # a failure is an answer: no fallback configuration (the two kept until 2026-12-02, plain
      # code unpacking and 2-warp head_dim-64 stage tiles, were stale and failed chunk tests themselves)
      step tests python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py tests/test_chunk_plan.py \
        tests/test_code_unpack.py tests/test_format.py tests/test_reference.py ;;
    smoke)
      # shellcheck disable=SC2086  # SMOKE_ARGS=--eager: no torch.compile or CUDA graphs (a first check of a new bundle)
      CUDA_LAUNCH_BLOCKING=${CUDA_LAUNCH_BLOCKING:-0} step smoke python3 tools/gpu/smoke_int4.py "$MODEL" ${SMOKE_ARGS:-} ;;
    diag-tail)  # decode with exact tails on the kernel bench's inputs: repeated runs and the PyTorch path
      step diag-tail python3 tools/gpu/diag_tail.py ;;
    debug)
      step debug python3 tools/gpu/debug_kernels.py 64 128
      step sanitizer timeout 300 compute-sanitizer --tool memcheck --print-limit 20 python3 -m pytest -q -x \
        -p no:cacheprovider "tests/test_kernels.py::test_mixed_batches_against_reference[4-4-64-dtype0]" ;;
    tune)  # decode launch tuning (tools/gpu/tune_kernels.py); later steps use the chosen options
      unset S4KV_KERNEL_CONFIG
      step tune python3 tools/gpu/tune_kernels.py decode --json "$OUT/tune.json" --config-out $CONFIG
      [ -f $CONFIG ] && cp $CONFIG "$OUT/kernel-config.json" && export S4KV_KERNEL_CONFIG=$CONFIG ;;
    tune-window)  # the decode window's programs and tiles (tools/gpu/tune_kernels.py window); later
      # steps use the best (S4KV_KERNEL_CONFIG)
      unset S4KV_KERNEL_CONFIG
      step tune-window python3 tools/gpu/tune_kernels.py window --json "$OUT/tune-window.json" --config-out $CONFIG
      [ -f $CONFIG ] && cp $CONFIG "$OUT/kernel-config.json" && export S4KV_KERNEL_CONFIG=$CONFIG ;;
    kernels)  # decode kernel alone on the speed points (and two with windows), each kernel's own
      # time beside the graph's; chunk attention after 0, 8k and 30k cached tokens
      step kernels python3 -m s4kv.kernels.bench $DECODE_POINTS --breakdown --prefill-contexts 0,8192,30720 \
        --json "$OUT/kernels.json"
      # the same decode points with every row's complete pages in a pool that stays in L2: the page
      # loop's own bound, beside its time from DRAM (an H100's page kernel: 49 against 55 us at
      # 32k x 8, the H200's 50 from DRAM; docs/results/gpu-h100-2026-12-06-page-loop-bound/)
      step kernels-l2 python3 -m s4kv.kernels.bench $DECODE_POINTS --breakdown --alias-blocks 128 \
        --json "$OUT/kernels-l2.json" ;;
    host-overhead)  # one layer's attention outside CUDA graphs (the steps with a prefill chunk): host time to
      # issue it against its device time, int4_kivi next to bf16's reshape_and_cache + FlashAttention
      # shellcheck disable=SC2086  # HOST_ARGS="--cprofile 30": also where the host time goes
      step host-overhead python3 tools/gpu/host_overhead.py ${HOST_ARGS:-} --json "$OUT/host-overhead.json" ;;
    store-warps)  # the block store at 4 warps (before 2026-12-04) and at its default, one after the other:
      # decode rows that all complete a unit, each kernel's device time (tools/gpu/host_overhead.py)
      echo '[{"kernel": "store", "head_size": 128, "options": {"num_warps": 4}}]' >/tmp/store-4warps.json
      for pass in 1 2; do
        S4KV_KERNEL_CONFIG=/tmp/store-4warps.json step "store-4warps-$pass" python3 tools/gpu/host_overhead.py \
          --kv int4_kivi --decodes 32,64 --chunks 0,0 --json "$OUT/store-4warps-$pass.json"
        step "store-default-$pass" python3 tools/gpu/host_overhead.py --kv int4_kivi --decodes 32,64 --chunks 0,0 \
          --json "$OUT/store-default-$pass.json"
      done ;;
    profile-decode)  # an engine's decode step kernel by kernel (PROFILE_POINTS="8192x32 32704x8"), each dtype of KVS
      # (PROFILE_ARGS="--bench-like --steps 128": prefix caching off, as `s4kv bench speed` runs)
      # shellcheck disable=SC2086
      profile_points profile-decode ${PROFILE_ARGS:-} ;;
    profile-decode-window)  # the speed bench's decode window against a steady decode step, each dtype of KVS
      # at each PROFILE_POINTS point: profile_decode.py with prefix caching on (WINDOW_STEADY_STEPS, default 64)
      # and --bench-like with the bench's --new-tokens (WINDOW_BENCH_STEPS, default 256); what the steps where
      # requests decode beside others' prefill cost each dtype, kernel by kernel (tools/decode_window.py)
      profile_points profile-window-steady --steps "${WINDOW_STEADY_STEPS:-64}"
      profile_points profile-window-bench --bench-like --steps "${WINDOW_BENCH_STEPS:-256}" ;;
    profile-decode-baseline)  # the same with another s4kv tree (BASELINE=DIR holding s4kv/, e.g. `git archive
      # COMMIT s4kv`) for int4_kivi only (BASELINE_KVS), to set a kernel change against the tree before it
      if [ -z "${BASELINE:-}" ] || [ ! -d "${BASELINE}/s4kv" ]; then
        echo "profile-decode-baseline needs BASELINE=DIR with DIR/s4kv"; status=1; continue
      fi
      base=$(cd "$BASELINE" && pwd)
      for pt in ${PROFILE_POINTS:-8192x32}; do
        # shellcheck disable=SC2086
        step "profile-decode-baseline-$pt" env PYTHONPATH="$base:$PYTHONPATH" python3 tools/gpu/profile_decode.py \
          ${PROFILE_ARGS:-} --kv "${BASELINE_KVS:-int4_kivi}" --context "${pt%x*}" --batch "${pt#*x}" \
          --json "$OUT/profile-decode-baseline-$pt.json"
      done ;;
    pdl)  # programmatic dependent launch against stream order on the decode points (a minute)
      step pdl python3 tools/gpu/tune_kernels.py pdl --json "$OUT/pdl.json" ;;
    tune-stage)  # chunk attention's stage-kernel launch sweep, each variant checked against the default's output
      step tune-stage python3 tools/gpu/tune_kernels.py stage --json "$OUT/tune-stage.json" ;;
    profile)  # where the decode kernel stalls at 32k x 8: Nsight Compute's warp-state and memory
      # sections of one launch (replayed from the bench's CUDA graph), as text in profile.log;
      # PROFILE_KERNEL=_reduce_kernel profiles the split reduction instead (8 us there for 32 programs)
      if [ -n "$NCU" ]; then
        step profile "$NCU" --clock-control none --graph-profiling node --kernel-name "regex:${PROFILE_KERNEL:-_decode_kernel}" --launch-skip 3 \
          --launch-count 1 --section SpeedOfLight --section Occupancy --section LaunchStats \
          --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
          python3 -m s4kv.kernels.bench --contexts 32768 --batches 8
      else
        echo "=== profile: no ncu on this machine" | tee "$OUT/profile.log"; status=1
      fi ;;
    profile-source)  # per-instruction warp-stall samples of the decode kernel at 8k x 32 (Nsight Compute's
      # source counters), exported as CSV for tools/ncu_stalls.py, which maps them to Triton source
      # lines on the CPU machine; the details page (scheduler and warp-state sections) beside it
      step profile-source "$NCU" --clock-control none --graph-profiling node --kernel-name regex:_decode_kernel \
        --launch-skip 3 --launch-count 1 --section SpeedOfLight --section SchedulerStats --section WarpStateStats \
        --section SourceCounters -f -o /tmp/profile-source python3 -m s4kv.kernels.bench --contexts 8192 --batches 32 \
        && "$NCU" -i /tmp/profile-source.ncu-rep --page source --csv --print-source sass | gzip >"$OUT/profile-source.csv.gz" \
        && "$NCU" -i /tmp/profile-source.ncu-rep --page details >>"$OUT/profile-source.log" ;;
    variants)  # decode kernel variants timed one after the other in one call, each kernel's own time:
      # VARIANTS="name=DIR[:CONFIG] ..." (DIR holding s4kv/, e.g. `git archive COMMIT s4kv` or a copy of
      # the tree with one change; CONFIG: an S4KV_KERNEL_CONFIG file of launch options; `.` is this tree),
      # run twice in that order so that the spread between repeats is visible next to the differences
      # (a CONFIG replaces the tuned launch options of an earlier `tune` step; without one the defaults run)
      for pass in 1 2; do
        for v in ${VARIANTS:-cur=.}; do
          name=${v%%=*}; spec=${v#*=}; dir=${spec%%:*}; cfg=""; [ "$spec" != "$dir" ] && cfg=$(cd "$(dirname "${spec#*:}")" && pwd)/$(basename "${spec#*:}")
          d=$(cd "$dir" && pwd)
          step "variant-$name-$pass" bash -c "cd '$d' && PYTHONPATH='$d:$PYTHONPATH' S4KV_KERNEL_CONFIG='$cfg' \
            python3 -m s4kv.kernels.bench $DECODE_POINTS --breakdown \
            --json '$OUT/variant-$name-$pass.json'"
        done
      done ;;
    kernels-baseline|profile-baseline)  # the decode kernel bench (or its profile) with another s4kv
      # tree (BASELINE=DIR holding s4kv/, e.g. `git archive COMMIT s4kv`): a kernel change measured
      # against the one it replaces in the same lease; run from inside it (python -m puts it first)
      if [ -z "${BASELINE:-}" ] || [ ! -d "${BASELINE}/s4kv" ]; then
        echo "$s needs BASELINE=DIR with DIR/s4kv"; status=1; continue
      fi
      base=$(cd "$BASELINE" && pwd)
      if [ "$s" = kernels-baseline ]; then
        step kernels-baseline bash -c "cd '$base' && PYTHONPATH='$base:$PYTHONPATH' python3 -m s4kv.kernels.bench \
          $DECODE_POINTS --json '$OUT/kernels-baseline.json'"
      else
          step profile-baseline bash -c "cd '$base' && PYTHONPATH='$base:$PYTHONPATH' '$NCU' --clock-control none \
          --graph-profiling node --kernel-name regex:_decode_kernel --launch-skip 3 --launch-count 1 \
          --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
          --section SchedulerStats --section MemoryWorkloadAnalysis python3 -m s4kv.kernels.bench \
          --contexts 32768 --batches 8"
      fi ;;
    bench-capacity)
      step bench-capacity python3 -m s4kv.bench capacity --model dummy:qwen2.5-7b --kv "$KVS" \
        --max-model-len 32768 --engine-arg enforce_eager=true --out "$OUT/capacity"
      tar -C "$OUT" -czf "$OUT/capacity.tgz" capacity && rm -rf "$OUT/capacity" ;;
    capacity-defaults)  # issue 15: KV tokens at vLLM's default engine arguments (gpu_memory_utilization
      # 0.90, CUDA graphs, max_num_seqs 1024), bf16 next to int4_kivi, two model shapes and two
      # max_model_len; then max_num_seqs 1 and 1024 given explicitly (CAP_SWEEP=0 skips that)
      for m in qwen2.5-7b llama-3.1-8b; do
        for len in 8192 32768; do
          step "capacity-$m-$len" python3 -m s4kv.bench capacity --model "dummy:$m" --kv auto,int4_kivi \
            --max-model-len $len --out "$OUT/capacity-defaults/$m-$len"
        done
      done
      if [ "${CAP_SWEEP:-1}" = 1 ]; then
        for n in 1 1024; do
          step "capacity-seqs-$n" python3 -m s4kv.bench capacity --model dummy:qwen2.5-7b --kv auto,int4_kivi \
            --max-model-len 8192 --engine-arg max_num_seqs=$n --out "$OUT/capacity-defaults/qwen2.5-7b-8192-seqs$n"
        done
      fi
      tar -C "$OUT" -czf "$OUT/capacity-defaults.tgz" capacity-defaults && rm -rf "$OUT/capacity-defaults" ;;
    bench-speed)  # fixed points and the saturated 32k point in one engine per dtype, at equal KV memory
      # (SPEED_KV_GIB, default 16: the 8k x 32 point fits bf16; saturating the whole 0.90 budget would
      # prefill ~7M int4 tokens twice, more than a lease holds). The 32k prompts are 32,511 tokens:
      # with 256 new ones the sequence ends at Qwen2.5's 32,768 positions (s4kv.bench.cli.fit_context).
      step bench-speed python3 -m s4kv.bench speed --model dummy:qwen2.5-7b --kv "$KVS" \
        --contexts 1024,8192,32768 --batches 64,32,8 --new-tokens 256 --repeats ${REPEATS:-1} \
        --saturate --saturate-contexts 32768 --max-num-seqs ${SAT_SEQS:-64} --kv-cache-gib ${SPEED_KV_GIB:-16} \
        --out "$OUT/speed"
      tar -C "$OUT" -czf "$OUT/speed.tgz" speed && rm -rf "$OUT/speed" ;;
    bench-quality)
      # FLOOR_BACKEND=TRITON_ATTN: the second bf16 engine through that attention kernel (--floor-engine-arg);
      # TEXT_WINDOWS=12: all of eval_text.txt's 2,048-token windows (default 3, the bench's)
      step bench-quality python3 -m s4kv.bench quality --model "$MODEL" --kv "$KVS" --engine-arg enforce_eager=true \
        --text-windows "${TEXT_WINDOWS:-3}" ${FLOOR_BACKEND:+--floor-engine-arg attention_backend=$FLOOR_BACKEND} \
        --out "$OUT/quality"
      tar -C "$OUT" -czf "$OUT/quality.tgz" quality && rm -rf "$OUT/quality" ;;
    bench-quality-floor)  # bf16 through other attention backends (FLOOR_BACKENDS, default TRITON_ATTN and
      # FLEX_ATTENTION; vLLM's own `attention_backend` engine argument): how far an implementation that
      # rounds differently from FlashAttention moves bf16's own quality figures (tools/quality_floor.py
      # compares each run's bf16 record with bench-quality's)
      for b in $(echo "${FLOOR_BACKENDS:-TRITON_ATTN,FLEX_ATTENTION}" | tr , ' '); do
        step "bench-quality-floor-$b" python3 -m s4kv.bench quality --model "$MODEL" --kv auto --no-noise-floor \
          --engine-arg enforce_eager=true --engine-arg attention_backend="$b" --out "$OUT/quality-floor-$b"
      done
      # the glob is expanded in $OUT (the device returns at most 8 files: one archive)
      (cd "$OUT" && tar -czf quality-floor.tgz quality-floor-*/ && rm -rf quality-floor-*/) ;;
    bench-quality-baseline)  # the same quality run with another s4kv tree (BASELINE=DIR holding s4kv/,
      # e.g. `git archive COMMIT s4kv`), for a format change measured against the one it replaces on
      # the same machine; run from inside it, since `python -m` puts the working directory first
      if [ -z "${BASELINE:-}" ] || [ ! -d "${BASELINE}/s4kv" ]; then
        echo "bench-quality-baseline needs BASELINE=DIR with DIR/s4kv"; status=1; continue
      fi
      base=$(cd "$BASELINE" && pwd)
      step bench-quality-baseline bash -c "cd '$base' && PYTHONPATH='$base:$PYTHONPATH' python3 -m s4kv.bench \
        quality --model '$MODEL' --kv '$KVS' --engine-arg enforce_eager=true --text-windows '${TEXT_WINDOWS:-3}' \
        --text '$PWD/s4kv/data/eval_text.txt' --out '$OUT/quality-baseline'"
      tar -C "$OUT" -czf "$OUT/quality-baseline.tgz" quality-baseline && rm -rf "$OUT/quality-baseline" ;;
    throughput)  # vLLM's own `vllm bench throughput` on issue 13's W1-W3 (tools/gpu/throughput.sh;
      # THROUGHPUT_RUNS="W3:auto W1:int4_kivi ..." picks runs), JSON + engine log per run, in one archive
      # shellcheck disable=SC2086
      step throughput bash tools/gpu/throughput.sh "$OUT/throughput" ${THROUGHPUT_RUNS:-}
      tar -C "$OUT" -czf "$OUT/throughput.tgz" throughput && rm -rf "$OUT/throughput" ;;
    tp-check)  # issue 22 (a machine of 2+ GPUs): teacher-forced logprobs at tensor_parallel_size TP (default 2)
      # against 1 for auto and int4_kivi, on random 4-layer checkpoints of the Qwen2.5-7B (2 kv heads per rank)
      # and Llama-3.1-8B (4) shapes (tools/tp_check.py: vLLM's dummy weights differ between TP sizes)
      for m in qwen2.5-7b llama-3.1-8b; do
        step "tp-check-$m" python3 tools/tp_check.py --model "random:$m" --layers 4 --tp "${TP:-2}" \
          --json "$OUT/tp-check-$m.json"
      done ;;
    tp-bench)  # issue 22 (a machine of TP GPUs, default 2): KV capacity per engine and decode speed at the README's
      # 8k x 32 and 32k x 8 points for bf16, fp8 and int4_kivi at tensor_parallel_size TP; with TP=3 (four GPUs)
      # also SmolLM2's quality (3 kv heads: one per rank)
      tp_args="--engine-arg tensor_parallel_size=${TP:-2} --engine-arg distributed_executor_backend=mp"
      # shellcheck disable=SC2086
      step tp-capacity python3 -m s4kv.bench capacity --model dummy:qwen2.5-7b --kv auto,fp8,int4_kivi \
        --max-model-len 32768 $tp_args --out "$OUT/tp-capacity"
      # shellcheck disable=SC2086
      step tp-speed python3 -m s4kv.bench speed --model dummy:qwen2.5-7b --kv auto,fp8,int4_kivi \
        --contexts 8192,32768 --batches 32,8 --new-tokens 256 --repeats 1 --kv-cache-gib 16 $tp_args --out "$OUT/tp-speed"
      if [ "${TP:-2}" = 3 ]; then
        # shellcheck disable=SC2086
        step tp-quality python3 -m s4kv.bench quality --model "$MODEL" --kv auto,int4_kivi --engine-arg enforce_eager=true \
          $tp_args --out "$OUT/tp-quality"
      fi
      tar -C "$OUT" -czf "$OUT/tp-bench.tgz" tp-capacity tp-speed $( [ -d "$OUT/tp-quality" ] && echo tp-quality ) \
        && rm -rf "$OUT"/tp-capacity "$OUT"/tp-speed "$OUT"/tp-quality ;;
    bench-serve)  # issue 19 (not run on a GPU yet): the highest request rate within the SLO p99 TTFT <= 2 s
      # and TPOT <= 50 ms, a 7B model with a 24 GB GPU's KV budget (4 GiB for every dtype), 4k-token
      # prompts and 512 new tokens; one server per dtype (the deploy launcher), `vllm bench serve` per
      # rate, each sending rate x SERVE_SECONDS of requests: a point takes over a minute, so five rates
      # for three dtypes take more than one call (--detach, then collect)
      step bench-serve python3 -m s4kv.bench serve --model dummy:qwen2.5-7b --kv "${SERVE_KVS:-auto,fp8,int4_kivi}" \
        --input-len 4096 --output-len 512 --rates "${SERVE_RATES:-0.25,0.5,1,2,3}" --kv-cache-gib 4 \
        --slo-ttft-ms 2000 --slo-tpot-ms 50 --seconds "${SERVE_SECONDS:-60}" --out "$OUT/serve"
      tar -C "$OUT" -czf "$OUT/serve.tgz" serve && rm -rf "$OUT/serve" ;;
    *) echo "unknown step $s"; status=2 ;;
  esac
done
# no more files than the device tool brings back from a call (tools/gpu/fit_out.sh)
bash tools/gpu/fit_out.sh "$OUT"
exit $status
