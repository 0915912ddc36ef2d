#!/usr/bin/env bash
# The lease's first call after the bundle's chunks (from the repository root; OUT is the device's):
# setup, the patch series, the GPU tests of the launch options this folder times, a check that the
# CUDA-graph replay test fails when ROTATE_IN_PAGES's wait is taken away, then run.sh detached.
set -u
OUT=${OUT:-/tmp/out}
cp .gpu/c7 /root/stage/ && bash .gpu/setup-on-device.sh >"$OUT/setup.log" 2>&1; tail -n 3 "$OUT/setup.log"
OUT=$OUT bash tools/gpu/run-on-device.sh patch >/dev/null 2>&1; tail -n 2 "$OUT/patch.log"
# shellcheck disable=SC1091
source /root/s4kv-env.sh
export PYTHONPATH="$PWD:$PYTHONPATH"
timeout 330 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py \
  -k "rotate or programmatic or replays or launch_variants" >"$OUT/tests.log" 2>&1
echo "tests exit $?"; tail -n 4 "$OUT/tests.log"
# the mutation: the split that reads a unit completed this step no longer waits for the block store
rm -rf /tmp/mut && mkdir -p /tmp/mut && cp -r s4kv tests /tmp/mut/
sed -i 's|if ((p + 1) % UNIT == 0) & (tl.minimum(page_lo + per_split, n_pages) > n_pages - UNIT // BS):|if p < 0:  # MUTATION|' \
  /tmp/mut/s4kv/kernels/decode.py
grep -c MUTATION /tmp/mut/s4kv/kernels/decode.py
(cd /tmp/mut && PYTHONPATH="/tmp/mut:${PYTHONPATH}" timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py \
  -k "replays and rotate" >"$OUT/mutation.log" 2>&1; echo "mutation exit $? (1 = the test caught it)"); tail -n 3 "$OUT/mutation.log"
setsid nohup bash docs/results/gpu-h100-2026-12-06-page-loop-bound/run.sh /root/rout >/root/r.log 2>&1 </dev/null &
echo "run.sh started"
