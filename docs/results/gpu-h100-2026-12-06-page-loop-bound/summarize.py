"""The tables of this folder's README from raw/ (python3 docs/results/gpu-h100-2026-12-06-page-loop-bound/summarize.py)."""
import glob
import json
import pathlib
import statistics as st
import sys

RAW = pathlib.Path(__file__).parent / "raw"
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "tools"))

import kernel_bench_table


def engines():
    print("engine decode step at 32,511 x 8 (tools/gpu/profile_decode.py):")
    print("config   pass  busy/step  wall(prof)  unprofiled (3 samples)      page kernel  reduce  rows  store  (us/layer, profiler durations)")
    for c in ("default", "pr", "prpf", "prri"):
        busy, unprof = [], []
        for f in sorted(glob.glob(str(RAW / "engines" / f"{c}-[0-9].json"))):
            r = json.load(open(f))
            r = r[0] if isinstance(r, list) else r
            w, k, n = r["windows"], r["kernels_us_per_step"], r["steps"]
            b = (w["long"]["busy_us"] - w["short"]["busy_us"]) / n
            busy.append(b)
            unprof += r["step_wall_unprofiled_us"]
            lay = lambda name: k.get(name, 0) / 28  # noqa: E731 (28 layers)
            print(f"{c:8s} {f[-6]:>4s}  {b:9.0f}  {r['step_wall_us']:10.0f}  "
                  f"{' / '.join(f'{x:.0f}' for x in r['step_wall_unprofiled_us']):26s}  {lay('_decode_kernel'):11.1f}"
                  f"  {lay('_reduce_kernel'):6.1f}  {lay('_quantize_rows_kernel'):4.1f}  {lay('_store_blocks_kernel'):5.1f}")
        print(f"{c:8s} mean  {st.mean(busy):9.0f}  unprofiled {st.mean(unprof):.0f} +- {st.stdev(unprof):.0f} (n={len(unprof)})")


def bench(pattern: str, title: str):
    print(title)
    kernel_bench_table.table(sorted(glob.glob(str(RAW / pattern))))

if __name__ == "__main__":
    engines()
    print()
    bench("bench/alias-*.json", "kernel bench, pages from DRAM (alias 0) or from a 128-block pool in L2 (alias 128):")
    print()
    bench("bench/splits-*.json", "kernel bench, 16 (default) or 14 page splits at 32k x 8:")
    print()
    bench("byte-codes/bytes-*.json", "kernel bench, BYTE_CODES against the shipped kernel (fresh machine, one pass):")
