#!/usr/bin/env bash
# WHAT A LEASE SHOULD RUN FIRST (updated 2026-12-07, eighteenth session: an H100 came for an H200 call;
# docs/results/gpu-2026-12-07-eighteenth/: the bench's decode window costs int4_kivi no more than bf16 on the
# current tree (old item B done: the 8k x 32 miss is the steady step's); on the H100 from DRAM TMA_PAGES,
# PAGE_STAGES 7 and INT8_KEYS+PAGE_STAGES 7 are slower, fp16 operands equal, INT8_KEYS 0.5-0.7 us faster,
# and the two-tile rotation's forward half 0.7-1.0 us faster per layer; that half is now in the tree,
# never run on a GPU in the tree's form).
#  1. On any GPU, first, with the bundle: the GPU kernel tests on the current tree (the forward rotation
#     on two tiles: the row kernel and the query rotation), alone, detached from a copy of the tree:
#       bash tools/gpu/run-on-device.sh patch tests
#     and chunk attention with R^T's half on two tiles as well (never timed), here
#     `bash docs/results/cpu-2026-12-07-one-tile-rotation/make-tree.sh`, carry [".gpu/rot2"], then on the GPU
#       for t in . .gpu/rot2; do (cd $t && PYTHONPATH=$PWD python3 -m s4kv.kernels.bench --contexts 8192 --batches 32 \
#         --prefill-contexts 0,8192,30720 --chunk 2048); done
#  2. On an H200: item A below (decode_configs.sh from DRAM and L2 with stall profiles) without rot and
#     rot2 (rot2's forward half is the tree now); 8 configurations took about 17 s each per pass and point
#     pair on the H100, not 11: with PROFILE "0 128" budget about 12 minutes.
#  3. Item C below (the H100 proxy calibration), unchanged.
# WHAT A LEASE SHOULD RUN FIRST (updated 2026-12-07, seventeenth session: no machine at all was lent; the
# sixteenth session's plan below stands, with two additions).
# A. On an H200, add a third page buffer to item 1's configurations (a launch option: PAGE_STAGES 7, 53.5 KB of
#    shared memory, still four programs per SM on sm90): stages7=[{"kernel":"decode","head_size":128,
#    "options":{"PAGE_STAGES":7}}] and both together, int8s7=[{"kernel":"decode","head_size":128,"options":
#    {"INT8_KEYS":1,"PAGE_STAGES":7}}]. Why: two buffers leave one page in flight per program while one is
#    computed (about 9 MB over the GPU, 2.1 us of the H200's copy bandwidth), so a shorter loop exposes the
#    pages' latency (though on the H100 the third buffer was 4.6 us slower from DRAM); and the one loop change timed on the H200 from both L2 and DRAM,
#    FIRST_OFFSET (ninth session), took 1.8 us off the page kernel from L2 but only 0.5-0.6 us from DRAM, so
#    from DRAM the H200's kernel waits on more than its loop (the pages' arrival as well); the H100, where
#    the third buffer was slower (fourteenth session), never showed that. For the same reason item 1's
#    INT8_KEYS gain may not carry from L2 to DRAM there: read both columns. Add PROFILE=128 and also the
#    stall profile from DRAM (the loop's long-scoreboard waits on its page buffers are the question).
#    Also fp16 operands (fp16ops=[{"kernel":"decode-grid","head_size":0,"options":{"fp16_operands":true}}]):
#    on the H100 they were 0.4-1.7 us faster than bf16 operands from L2 and 0.1-0.8 us slower from DRAM
#    (thirteenth session), they passed their GPU tests, and they stay within 1e-3 of the reference (CPU
#    emulation: 9.6e-4 / 6.6e-4) where bf16 operands miss the
#    peaky-query bound; the H200, where the loop binds, has never compared them. If they are faster there,
#    they can be the default for bf16 models (their errors are the tighter ones).
#    All of A in one detached call, no vLLM (about 8 minutes with the profiles; collect table.txt and
#    decode-configs.tgz from /root/a):
#      d() { echo "[{\"kernel\":\"decode\",\"head_size\":128,\"options\":$1}]"; }
#      mkdir -p /root/a && CONFIGS="shipped=[] int8=$(d '{"INT8_KEYS":1}') stages7=$(d '{"PAGE_STAGES":7}') \
#        int8s7=$(d '{"INT8_KEYS":1,"PAGE_STAGES":7}') fp16ops=[{\"kernel\":\"decode-grid\",\"head_size\":0,\"options\":{\"fp16_operands\":true}}]" \
#        OUT=/root/a ALIASES="0 128" PASSES=2 PROFILE="0 128" POINTS="8192,32768 32,8" \
#        setsid nohup bash tools/gpu/decode_configs.sh >/root/a/table.txt 2>&1 &
#    With the bulk tensor copies too (docs/results/cpu-2026-12-07-tma-pages/: here its make-tree.sh, carry
#    [".gpu/tma"], and add  tma@.gpu/tma=$(d '{"TMA_PAGES":1}')  to CONFIGS): 28 more instructions per page
#    than the shipped loop, so not for L2; from the H200's DRAM it is the other way to feed the loop.
#    And the rotation variants (docs/results/cpu-2026-12-07-one-tile-rotation/: its make-tree.sh, carry
#    [".gpu/rot", ".gpu/rot2"], add  rot@.gpu/rot=[] rot2@.gpu/rot2=[]  to CONFIGS): the decode call's
#    reduction and row kernel; their prefill (stage kernel) with the kernel bench's --prefill-contexts.
# B. On any GPU, with the bundle (the mixed steps' costs are kernels and launches, not the H200's bandwidth):
#    the speed bench's 8k x 32 decode window against a steady step, kernel by kernel, both dtypes (about 8
#    minutes; run detached):
#      KVS=int4_kivi,auto PROFILE_POINTS=8192x32 bash tools/gpu/run-on-device.sh --detach patch profile-decode-window
#    Then here: python3 tools/decode_window.py --steady profile-window-steady-8192x32.json \
#      --window profile-window-bench-8192x32.json (on 2026-12-04's H200 profiles: int4_kivi's window cost
#      610 us per step beyond bf16's, 1.27x against 1.39x had it grown only as bf16's did).
#    The 8k x 32 target (1.4x on the H200) needs about 9 us per layer off the bench's step (250 of its 6,311
#    us against bf16's 8,481, ninth session); on 2026-12-04's tree the window's mixed steps took the ratio
#    from 1.41x (steady) to 1.27x, and the current tree has never been profiled that way.
# C. On an H100 (the usual case), before any more page-loop timing there, one detached call of about 12
#    minutes, no vLLM: whether the H100 with a larger pool of pages stands in for the H200 from DRAM
#    (docs/results/cpu-2026-12-07-h200-proxy/: here `bash docs/results/cpu-2026-12-07-h200-proxy/make-trees.sh`,
#    carry [".gpu/proxy"], then its run.sh as its header says).
# WHAT A LEASE SHOULD RUN FIRST (updated 2026-12-07, sixteenth session: an H100, no H200;
# docs/results/gpu-2026-12-07-sixteenth/: INT8_KEYS 1 again 5-6% faster from L2, INT8_KEYS 2 slower than the
# shipped kernel and removed; the GPU kernel tests at f931f4f passed every shipped kernel's test; with
# INT8_KEYS 1 the engine's start-up check refuses to start, and with it widened SmolLM2's greedy
# continuations agree with bf16 as the shipped kernel's do).
# THE BUNDLE: the tree that travels with every call is 24 MB now, so make-bundle's 58 MiB chunks no longer
# fit a call (64 MiB): `../shared/gpu/make-bundle --chunk-mib 36` (nine chunks, its printed calls).
# Run detached work from a copy of the tree (tar --exclude=./.gpu . | tar -C /root/src -x): each call
# re-syncs the checkout, and a pytest running in it then fails with ImportPathMismatchError.
# On an H200, in order:
#   1. One call of about 5 minutes, no vLLM, nothing to carry: shipped against INT8_KEYS 1 where the loop
#      binds (mkdir -p /root/i8 first; copy /root/i8/decode-configs.tgz and table.txt to $OUT):
#      CONFIGS='shipped=[] int8=[{"kernel":"decode","head_size":128,"options":{"INT8_KEYS":1}}]' PROFILE=128 \
#        OUT=/root/i8 ALIASES="0 128" PASSES=2 POINTS="8192,32768 32,8" bash tools/gpu/decode_configs.sh >/root/i8/table.txt 2>&1
#   2. With the bundle, end to end: `s4kv bench speed` at 8k x 32 and 32k x 8 for auto and int4_kivi, then
#      int4_kivi again with INT8_KEYS 1 (/root/s4kv-kernel-config.json, docs/results/gpu-2026-12-07-sixteenth/
#      run.sh option 1) through wide-selfcheck/sitecustomize.py on PYTHONPATH (the start-up check refuses it
#      at 1e-2): what 5-8% of the page loop is worth where the loop binds. Only if that is worth having:
#      a start-up check and kernel tests against the kernel's own roundings (tests/operand_roundings.py).
# WHAT A LEASE SHOULD RUN FIRST (updated 2026-12-07, fifteenth session: one H100, no H200;
# docs/results/gpu-2026-12-07-fifteenth/: the key dots on int8 operands, launch option INT8_KEYS (off),
# made the page kernel 5-8% faster from L2 and 0.5-1% from DRAM; the fourteenth session's early value-codes
# load is timed there too, not faster: drop it from the plans below). In order:
#   1. On an H200, one call of about 5 minutes without vLLM, nothing to build or carry: the option against the
#      default where the loop binds:
#      CONFIGS='shipped=[] int8=[{"kernel":"decode","head_size":128,"options":{"INT8_KEYS":1}}]
#               int8x2=[{"kernel":"decode","head_size":128,"options":{"INT8_KEYS":2}}]' PROFILE=128 \
#        OUT=/root/i8 ALIASES="0 128" PASSES=2 POINTS="8192,32768 32,8" bash tools/gpu/decode_configs.sh >/root/i8/table.txt 2>&1
#      (mkdir -p /root/i8 first; copy /root/i8/decode-configs.tgz and table.txt to $OUT).
#      (INT8_KEYS 2, two int8 terms, was built after the lease: never run on a GPU; if it keeps most of one
#      term's 5-8% from L2, it can be the default for bf16 models, since its rows meet the bf16 bound.)
#   2. With the vLLM bundle (../shared/gpu/make-bundle), the GPU kernel tests with INT8_KEYS 2 for both head
#      sizes (S4KV_KERNEL_CONFIG [{"kernel":"decode","head_size":64,"options":{"INT8_KEYS":2}}, the same for 128]);
#      with 1, the tests that compare bf16 rows with the fp32 reference at 1e-2 miss by ~1.5e-2 (the results'
#      README), and so would the engine's start-up check (s4kv.backend.selfcheck). Then `s4kv bench speed`
#      with the faster of the two that passes.
# WHAT A LEASE SHOULD RUN FIRST (updated 2026-12-07, fourteenth session: three H100s, no H200;
# docs/results/gpu-2026-12-07-fourteenth/: two pages per loop iteration 6-13% slower from L2, the value
# dots a page behind 4-9% slower, a third page buffer and two or three waves of shorter splits slower;
# the shipped loop's Nsight Compute profile with its pages in L2 on the H100: 0.61 instructions per
# scheduler and cycle, no eligible warp in 39% of cycles). The plan below is unchanged: on an H200,
# the thirteenth session's run.sh first (its Nsight Compute run is the H200's own page-loop profile).
# On any GPU, one call of about 4 minutes without vLLM, not run for want of a machine: here
# `bash docs/results/gpu-2026-12-07-fourteenth/run.sh tree`, then with carry [".gpu/t14"]
# `bash docs/results/gpu-2026-12-07-fourteenth/run.sh early /root/t14d` (the value codes' load before
# the page's max, beside the shipped tree; copy /root/t14d/decode-configs.tgz and table.txt).
# WHAT A LEASE SHOULD RUN FIRST (updated 2026-12-07, thirteenth session: five calls on an H100, no H200;
# docs/results/gpu-2026-12-07-thirteenth/: the twelfth session's fp16 unpacks no faster from L2 either,
# one-warp page programs (WARP_PAGES, no barrier between warps) 8-15% slower from L2 and 20-36% from
# DRAM, and a page's query terms one page ahead (TERMS_NEXT) 0.3-2.3 us slower from L2; none shipped).
# On an H200, in order: a. below in one call of about 6 minutes without vLLM:
#   here: bash docs/results/gpu-2026-12-07-thirteenth/make-trees.sh; carry [".gpu/t13"], command
#   bash docs/results/gpu-2026-12-07-thirteenth/run.sh /root/t13 >/root/t13.log 2>&1; cp /root/t13/{decode-configs.tgz,table.txt} $OUT/
#   (the shipped kernel and the fp16 unpacks from DRAM and L2, then the page loop's Nsight Compute
#   source profile, in the archive as shipped-bf16-profile0.csv.gz; then here python3 tools/ncu_stalls.py on it, which maps a
#   GPU's export again since 1c4e7f2); then b. below, unchanged.
# WHAT A LEASE SHOULD RUN FIRST (updated 2026-12-07, twelfth session: an H100 for 6 minutes ran run3.sh below, the
# Gluon loop with the shipped split 1.12x / 1.27x slower: the Gluon case is gone; and cheaper fp16 unpacks, no faster,
# reverted: docs/results/gpu-h100-2026-12-07-fp16-unpack/). Every page-loop timing since the ninth session ran on an
# H100. On an H200, in order:
#   a. the page loop's own stall profile there (the H200 is where the loop, not DRAM, bounds it):
#      bash tools/gpu/run-on-device.sh profile-source (it sources the bundle's /root/s4kv-env.sh; without the bundle,
#      its ncu command by hand: the kernel bench needs no vLLM), then python3 tools/ncu_stalls.py on the export;
#   b. item a of the tenth session's plan below (the steady and bench-like profiles at 8k x 32 and 32k x 8; needs the
#      vLLM bundle, ../shared/gpu/make-bundle's six calls).
# The GPU kernel tests need the bundle too (62 of them use vLLM's FlashAttention).
# WHAT A LEASE SHOULD RUN FIRST (updated 2026-12-07, eleventh session: no H200 again; an H100 for 4 minutes ran
# the Gluon page-loop probe, docs/results/gpu-2026-12-07-gluon-pages/: correct, 1.5-1.7x slower than the shipped
# kernel with each warp its own tokens and softmax state). On any GPU, first, one call of about 2 minutes, no vLLM:
#   cd docs/results/gpu-2026-12-07-gluon-pages && bash run3.sh   (about 3 minutes: times gluon_pages12.py and
#   gluon_pages11.py, the versions that keep the shipped split, keys by tokens and values by channels, against the
#   shipped kernel; compiled, never run: if one fails, the probe's own comparison says where). If neither is faster
#   than the shipped kernel from L2, the case for Gluon is gone too; if one is, the items below on an H200.
# WHAT A LEASE SHOULD RUN FIRST (updated 2026-12-07, tenth session: only an H100 was lent, after 71 minutes
# of refusals; the GPU kernel tests passed on it, 161 passed 1 skipped, and DEQUANT_KEYS, the page loop's keys
# dequantized in the key dots' registers, was 6-8% slower from DRAM and 14-17% from L2: not shipped,
# docs/results/gpu-h100-2026-12-07-dequant-keys/). Items 1 and 2 below are done; on an H200, in order:
#   a. item 3 below (the steady and bench-like profiles at 8k x 32 and 32k x 8): where the bench's 8k x 32
#      loses against the steady step is the one measurement issue 14 lacks on the H200.
#   b. a register cap for more page programs per SM needs no rerun: 2026-12-02 measured it (five per SM as
#      fast as four, six and eight slower; README, "where a decode call's time goes").
# WHAT A LEASE SHOULD RUN FIRST (updated 2026-12-06, ninth session: an H200 ran issue 14 on the current tree,
# docs/results/gpu-h200-2026-12-06-ninth/: 1.09x / 1.34x / 1.34x / 3.33x bf16, the decode call 57.8% / 56.8% of
# copy; FIRST_OFFSET timed there, 0.1-0.6 us from DRAM, not shipped: drop it from the plan below).
#   1. The GPU kernel tests (`bash tools/gpu/run-on-device.sh patch tests`, after the bundle): last run in the
#      seventh session (161 passed, 1 skipped). Run them ALONE: run-on-device.sh kills every GPU process outside
#      a detached run before each step (the ninth session's engine run killed FIRST_OFFSET's pytest that way).
#   2. What moves the H200's page loop (48 us per layer from L2 against 33.4 us for its bytes): the per-page key
#      terms (q*s into the dots' operand layout, the score constant), 42-43 us without them on the H100 from L2.
#      Build a variant on the CPU first (tools/kernel_static.py counts), then time it with
#      docs/results/cpu-2026-12-06-first-offset/run.sh's pattern (shipped and variant alternating, DRAM and L2).
#   3. On an H200, where the bench's 8k x 32 (1.34x) and 32k x 8 (1.34x) lose against the steady step (1.37x at
#      32,704 x 8 today): the steady and the bench-like step at both points, about 8 minutes, detached:
#        KVS=int4_kivi,auto PROFILE_POINTS="8192x32 32704x8" bash tools/gpu/run-on-device.sh --detach profile-decode
#        then, with PROFILE_ARGS="--bench-like --steps 128", the same once more (each after `collect`);
#      python3 tools/decode_ceiling.py on each JSON with --kernels from the lease's kernel bench. On 2026-12-04
#      the bench-like step cost int4_kivi 842 us more than the steady one and bf16 232 (8k x 32): if that gap
#      is still there, it is worth more than 0.06x at 8k x 32, the target's whole miss.
# WHAT A LEASE SHOULD RUN FIRST (updated 2026-12-06, eighth session: an H100 ran issue 14's end-to-end
# bench with all four dtypes, docs/results/gpu-h100-2026-12-06-eighth/; FIRST_OFFSET, one softmax offset
# per decode split instead of the running max (3 of the page loop's 17 barriers gone), is built and
# correct under the interpreter but not timed: docs/results/cpu-2026-12-06-first-offset/).
#   On any GPU, one call of about 3 minutes, no vLLM: bash docs/results/cpu-2026-12-06-first-offset/make-tree.sh here,
#   pip download -d .gpu/pytest-wheels pytest, then carry [".gpu/first-offset", ".gpu/pytest-wheels"] and run
#   OUT=$OUT bash docs/results/cpu-2026-12-06-first-offset/run.sh (the page kernel from L2 on an H100 stands in
#   for the H200 from DRAM).
#   On an H200 after it: docs/results/gpu-2026-12-06-acceptance/run.sh (kernels, then engine), as below.
# WHAT A LEASE SHOULD RUN FIRST (updated 2026-12-06, seventh session: no GPU was lent, six tries refused;
# TERMS_AHEAD is removed; tools/decode_ceiling.py puts 1.5x at 32k x 8 at the ceiling of the format's bytes,
# docs/results/cpu-2026-12-06-decode-ceiling/). On an H200, issue 14's figures on the current default, in
# two detached parts (docs/results/gpu-2026-12-06-acceptance/run.sh):
#   call 1, carry [".gpu/c0"]: mkdir -p /root/stage && cp .gpu/c0 /root/stage/ &&
#           (setsid nohup bash docs/results/gpu-2026-12-06-acceptance/run.sh kernels /root/acc >/root/acc-kernels.log 2>&1 </dev/null &)
#   calls 2-7: the chunks c1..c6; call 8, carry c7 and the setup files:
#           cp .gpu/c7 /root/stage/ && bash .gpu/setup-on-device.sh &&
#           (setsid nohup bash docs/results/gpu-2026-12-06-acceptance/run.sh engine /root/acc >/root/acc-engine.log 2>&1 </dev/null &)
#   then calls of `cat /root/acc/progress; sleep 500` and finally tar /root/acc into $OUT.
# engine: bench-speed (bf16, fp8, int4_kivi; KVS_SPEED=auto,fp8,turboquant_4bit_nc,int4_kivi for all four,
# about 6 minutes more), profile-decode at 32,704 x 8 (python3 tools/decode_ceiling.py on it), the GPU tests.
# The GPU pytest suite has not run since 83c4917 (test_mixed_batches_with_programmatic_rows is new).
# Before that (fifth session, H100 again): the page kernel takes
# 49 us at 32k x 8 with every page in L2 against 55 from DRAM, the H200's own time from DRAM, so on the
# H200 the loop's per-page chain bounds it; probes without the per-page key terms and max take 31 us
# from L2; pdl_rows 0.9% less busy again; the L2 prefetch, self-rotating page programs and whole code
# bytes as operands were no faster and are removed: docs/results/gpu-h100-2026-12-06-page-loop-bound/).
# In order:
#  0. On an H200: issue 14's end to end first (step 2: its targets are set there; not measured there
#     since 2026-12-05, nor with programmatic launch or the reduction's tiles), then the kernel bench
#     with and without the L2 pool, which should show the H200's page kernel at the same ~49 us either
#     way (no vLLM needed; about 1 min):
#       for a in 0 128; do python3 -m s4kv.kernels.bench --contexts 8192,32768 --batches 32,8 --breakdown \
#         $( [ $a = 0 ] || echo --alias-blocks $a ) --json $OUT/alias-$a.json; done
#     On an H100: the bundle (step 1b) and `bash tools/gpu/run-on-device.sh patch tests` (vLLM rejects
#     int4_kivi without the patch; the tests need vLLM): test_mixed_batches_with_programmatic_rows is
#     new (steps mixing decode rows and chunks with pdl_rows); if it passes, pdl_rows (0.8-0.9% less
#     busy in 6 of 6 passes over two sessions) can become the default on sm90+ after one more
#     engine comparison (docs/results/gpu-h100-2026-12-06-page-loop-bound/run.sh, CONFIGS="default pr").
#  0b. The per-page chain, the lever on the H200 (the design in
#     docs/results/gpu-h100-2026-12-06-page-loop-bound/README.md, "What this says about issue 14"): once
#     built, time it against the shipped kernel with the L2 pool on whatever GPU comes (the command
#     above, from each tree's own folder as run.sh's part 2 does); an H100 from L2 is a fair stand-in for
#     the H200 from DRAM (49.1-49.5 against 50.2-50.8 us for the shipped kernel).
#  1. one detached call, no vLLM needed (about 6 min for two passes), carry [".gpu/probes"]:
#       here first: bash docs/results/gpu-h200-2026-12-05-decode-configs/probes/make-probes.sh
#                   for p in noconst all3; do cp s4kv/kernels/bench.py .gpu/probes/$p/s4kv/kernels/; done
#       command:    echo '[{"kernel":"decode-grid","head_size":0,"options":{"pdl":false}}]' >/root/so.json
#                   BENCH_CONFIG=/root/so.json PASSES=2 setsid nohup bash docs/results/gpu-h100-2026-12-05-layers-per-graph/run.sh >/root/l.log 2>&1 &
#                   (stream order for every tree: the probes' older trees have no programmatic launch)
#       later:      cat /root/layersout/table.txt (progress in /root/layersout/progress)
#     It times the decode call per call of 8 layers in one graph beside the one-call graph
#     (bench --layers 8: how much of the 7.5-13 us "beside them in the graph" is the benchmark's own
#     graph launch and L2 flush) and, on an H200, the probes noconst and all3 (not yet timed there:
#     on the H200 the page kernel is at 66% of its floor, on the H100 at 83%, so the H200 is where
#     the loop's instructions can show). With the bundle installed first (step 1b) it adds
#     FlashAttention the same way and the GPU kernel tests.
#  1b. the vLLM 0.24.0 bundle (../shared/gpu/README.md; `make-bundle --chunk-mib 44`; the last chunk
#     c7 is 0.1 MiB: carry it with c6 and the setup files and run `cp .gpu/c6 /root/stage/ && bash
#     .gpu/setup-on-device.sh` in one call), then `bash tools/gpu/run-on-device.sh --detach tests`
#     and `collect` (126 s on the H200 with a cold cache): the fp32 test after 274df4b,
#     test_peaky_queries_against_reference and be5a99d's cache keys have not run on a GPU.
#  2. issue 14's acceptance, all four dtypes in one run:
#     `KVS=int4_kivi,fp8,turboquant_4bit_nc bash tools/gpu/run-on-device.sh --detach kernels bench-speed` (bf16 comes
#     with it; 1,070 s on 2026-12-01; auto, int4_kivi and fp8 alone took 598 s on 2026-12-05),
#     then `bash tools/gpu/run-on-device.sh collect` calls until it is done
#  3. if the lease has time: where an eager mixed layer's host time goes on the GPU's host (577-1,188
#     us against 322-706 of device time on 2026-12-05; docs/results/cpu-2026-12-05-launch-host-time/):
#       `HOST_ARGS="--cprofile 30" bash tools/gpu/run-on-device.sh host-overhead`
#  4. what is left of the lease: the Triton 3.8 comparisons below (six more chunk calls first).
# Issue 20: its twelve-window GPU measurement ran on the H100 on 2026-12-05 (third session:
#     `KVS=auto,int4_kivi TEXT_WINDOWS=12 FLOOR_BACKEND=TRITON_ATTN BASELINE=.gpu/base353 bash tools/gpu/run-on-device.sh bench-quality bench-quality-baseline`,
#     484 s; +0.276%, 96.996%); rerun it on the H200 only for a format change.
#
# The decode kernel under Triton 3.8 (vLLM 0.33.0's) on the H200, before and after a2e9294, without
# the whole vLLM 0.33.0 bundle: the kernel bench needs torch and Triton only, and the machine's torch
# 2.11 runs Triton 3.8's kernels (Triton talks to the driver itself; torch only allocates and times).
#
# Before the lease, in the checkout (.gpu/ is git-ignored):
#   python3 -m pip download --no-deps triton==3.8.0 --python-version 3.12 --only-binary=:all: -d .gpu/t38
#   (cd .gpu/t38 && split -b 44M triton-3.8.0-*.whl w. && rm triton-3.8.0-*.whl && sha256sum w.* > SHA256SUMS)
#   mkdir -p .gpu/t38/before && git archive 90fe100 s4kv | tar -x -C .gpu/t38/before
#   mkdir -p .gpu/t38/early && git archive 9a70758 s4kv | tar -x -C .gpu/t38/early   (the early-loads variant)
# Device calls, back to back (a pause of 30 s gives the machine back): six chunk calls, each
#   carry [".gpu/t38/w.aX"]   command: mkdir -p /root/stage && cp .gpu/t38/w.aX /root/stage/
# then the measuring calls (each under 10 minutes; the second needs no Triton 3.8):
#   carry [".gpu/t38/before", ".gpu/t38/SHA256SUMS"]
#   command: bash docs/results/kernel-static-2026-12-04-triton38/next-lease.sh
#   carry [".gpu/t38/before", ".gpu/t38/early", ".gpu/t38/SHA256SUMS"]
#   command: bash docs/results/kernel-static-2026-12-04-triton38/next-lease.sh triton36
# the block store before and after its per-row saturation (43a54de, docs/results/kernel-static-2026-12-05-store/),
# under both Tritons (.gpu/t38/before is 90fe100's s4kv, which has the store before it):
#   carry [".gpu/t38/before", ".gpu/t38/SHA256SUMS"]
#   command: bash docs/results/kernel-static-2026-12-04-triton38/next-lease.sh store
# the host time of an eager mixed layer before and after the format's constants became one constexpr
# (2f867a6, docs/results/cpu-2026-12-05-launch-host-time/: 164 -> 122 us per layer on the CPU machine,
# without the CUDA driver's launches), under both Tritons; needs .gpu/t38/prelayout:
#   mkdir -p .gpu/t38/prelayout && git archive ae638e8 s4kv | tar -x -C .gpu/t38/prelayout
#   carry [".gpu/t38/prelayout", ".gpu/t38/SHA256SUMS"]
#   command: bash docs/results/kernel-static-2026-12-04-triton38/next-lease.sh host 3.6   (then the same with 3.8:
#   each call compiles both trees' kernels once, then times them twice, alternating; under 10 minutes each)
# the block store with the window's rows interleaved (a block's rows in its own page and the page two
# after it, so a unit's blocks store at once: docs/results/cpu-2026-12-05-store-chain/) against the
# tree before it, under the machine's Triton 3.6; decode rows completing their units, and chunks that
# start 100 tokens into a unit (their store reads the old window from the pages it writes); needs
#   mkdir -p .gpu/t38/prewindow && git archive 35fd617 s4kv | tar -x -C .gpu/t38/prewindow
#   carry [".gpu/t38/prewindow"]
#   command: bash docs/results/kernel-static-2026-12-04-triton38/next-lease.sh store-chain
# and, in a call of its own, the GPU kernel tests under Triton 3.8 (the mma.sync path on sm90 has not
# run on a GPU under 3.8):
#   carry [".gpu/t38/SHA256SUMS"]
#   command: bash docs/results/kernel-static-2026-12-04-triton38/next-lease.sh tests
set -u
OUT=${OUT:-/tmp/out}
W=/tmp/lease; mkdir -p $W
if [ "${1:-}" = store-chain ]; then
  # the machine's Triton 3.6 only (no 3.8 chunks needed); each tree twice, alternating; one layer,
  # 32 and 64 decode rows completing their units, then 31 beside a chunk of 512 or 2,048 queries that
  # starts 100 tokens into a unit (tools/gpu/host_overhead.py --chunk-offset)
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >$W/gpu.txt
  python3 -c 'import torch, triton; print(torch.__version__, triton.__version__)' >>$W/gpu.txt
  # and the new tree with the store capped at 128 registers (two programs per SM instead of one; it then
  # spills 728-800 bytes at head_dim 128, tools/kernel_static.py --kernel store --options '{"maxnreg": 128}')
  echo '[{"kernel": "store", "head_size": 128, "options": {"num_warps": 8, "maxnreg": 128}}]' >$W/store-128regs.json
  for pass in 1 2; do
    for tree in prewindow after after-128regs; do
      dir=.gpu/t38/prewindow; [ $tree != prewindow ] && dir=.
      cfg=; [ $tree = after-128regs ] && cfg=$W/store-128regs.json
      S4KV_KERNEL_CONFIG=$cfg PYTHONPATH="$dir:${PYTHONPATH:-/tmp/site}" timeout 140 python3 tools/gpu/host_overhead.py --kv int4_kivi \
        --decodes 32,64,8,31,31 --chunks 0,0,0,512,2048 --chunk-offset 100 --json "$W/chain-$tree-$pass.json" \
        >"$W/chain-$tree-$pass.log" 2>&1
      echo "== store-chain $tree pass $pass rc=$?"; grep -iE "^ +[0-9]+ +[0-9]+ |store" "$W/chain-$tree-$pass.log" | tail -n 10
      tar -C $W -czf "$OUT/lease.tgz" .
    done
  done
  exit 0
fi
if [ ! -d /tmp/t380/triton ]; then
  (cd /root/stage && sha256sum -c "$OLDPWD/.gpu/t38/SHA256SUMS") || { echo "chunks missing or damaged"; exit 3; }
  cat /root/stage/w.a? >/tmp/t38.whl && python3 -m zipfile -e /tmp/t38.whl /tmp/t380 && rm /tmp/t38.whl
  chmod +x /tmp/t380/triton/backends/nvidia/bin/*  # zipfile drops the mode bits (ptxas, cuobjdump)
fi
triton_of() { [ "$1" = 3.8 ] && echo /tmp/t380 || echo ""; }
if [ "${1:-}" = tests ]; then
  # under Triton 3.8, then the machine's 3.6 (since 2026-12-05 the store and stage kernels changed too,
  # and the stage kernel has inline PTX: docs/results/kernel-static-2026-12-05-store/)
  PYTHONPATH=$PWD:/tmp/t380 timeout 290 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_kernels.py \
    tests/test_code_unpack.py >"$OUT/tests-triton38.log" 2>&1
  echo "tests under Triton 3.8: rc=$?"; tail -n 5 "$OUT/tests-triton38.log"
  PYTHONPATH=$PWD timeout 270 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_kernels.py \
    tests/test_code_unpack.py >"$OUT/tests-triton36.log" 2>&1
  echo "tests under Triton 3.6: rc=$?"; tail -n 5 "$OUT/tests-triton36.log"
  exit 0
fi
if [ "${1:-}" = host ]; then
  # host and device time of one eager layer (tools/gpu/host_overhead.py: 32 decodes; 31 decodes and a
  # 512-token chunk; 31 and 2,048), each tree under each Triton, twice, alternating
  for pass in 1 2; do
    for t in ${2:-3.6}; do
      for tree in prelayout after; do
        dir=.gpu/t38/prelayout; [ $tree = after ] && dir=.
        tp=$(triton_of $t)
        PYTHONPATH="$dir${tp:+:$tp}" timeout 130 python3 tools/gpu/host_overhead.py --kv int4_kivi \
          --json "$W/host-$tree-triton$t-$pass.json" >"$W/host-$tree-triton$t-$pass.log" 2>&1
        echo "== host $tree Triton $t pass $pass rc=$?"; tail -n 5 "$W/host-$tree-triton$t-$pass.log"
        tar -C $W -czf "$OUT/lease.tgz" .
      done
    done
  done
  exit 0
fi
if [ "${1:-}" = store ]; then
  # the block store's device time when every decode row completes its unit (tools/gpu/host_overhead.py,
  # as run-on-device.sh store-warps), each tree under each Triton, twice
  for pass in 1 2; do
    for t in 3.6 3.8; do
      for tree in before after; do
        dir=.gpu/t38/before; [ $tree = after ] && dir=.
        tp=$(triton_of $t)
        PYTHONPATH="$dir${tp:+:$tp}" timeout 120 python3 tools/gpu/host_overhead.py --kv int4_kivi --decodes 32,64 \
          --chunks 0,0 --json "$W/store-$tree-triton$t-$pass.json" >"$W/store-$tree-triton$t-$pass.log" 2>&1
        echo "== store $tree Triton $t pass $pass rc=$?"; grep -i "store" "$W/store-$tree-triton$t-$pass.log" | tail -n 4
        tar -C $W -czf "$OUT/lease.tgz" .
      done
    done
  done
  exit 0
fi
PTS="--contexts 1024,8192,32768,8256,32704 --batches 64,32,8,32,8"
bench() {  # bench NAME TREE TRITON: the decode kernel bench from TREE's s4kv under that Triton
  local name=$1 dir=$2 tp; tp=$(triton_of "$3")
  (cd "$dir" && PYTHONPATH="$PWD${tp:+:$tp}" timeout 150 python3 -m s4kv.kernels.bench $PTS --breakdown \
    --json "$W/$name.json") >"$W/$name.log" 2>&1
  echo "== $name rc=$?"; grep -E "^ +[0-9]+ +[0-9]+ +[0-9]+ " "$W/$name.log"
  tar -C $W -czf "$OUT/lease.tgz" .  # after each run: what finished comes back if the call is cut off
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >$W/gpu.txt
for t in 3.6 3.8; do
  PYTHONPATH=$(triton_of $t) python3 -c 'import torch, triton; print(torch.__version__, triton.__version__)' >>$W/gpu.txt
done
cat $W/gpu.txt
if [ "${1:-}" = triton36 ]; then
  # Triton 3.6 (vLLM 0.24.0's): before and after once each (the decode kernel's SASS is the same), then
  # the early-loads variant (9a70758: the rotation's loads first; with PDL the waits after the loads
  # that do not depend on the kernel before), stream order and PDL
  echo '[{"kernel": "decode-grid", "head_size": 0, "options": {"pdl": true}}]' >$W/pdl.json
  bench before-triton3.6 .gpu/t38/before 3.6
  bench after-triton3.6 . 3.6
  bench early-triton3.6 .gpu/t38/early 3.6
  S4KV_KERNEL_CONFIG=$W/pdl.json bench early-pdl-triton3.6 .gpu/t38/early 3.6
  S4KV_KERNEL_CONFIG=$W/pdl.json bench before-pdl-triton3.6 .gpu/t38/before 3.6
  exit 0
fi
# Triton 3.8, twice: the comparison that matters
for pass in 1 2; do
  bench "before-triton3.8-$pass" .gpu/t38/before 3.8
  bench "after-triton3.8-$pass" . 3.8
done
