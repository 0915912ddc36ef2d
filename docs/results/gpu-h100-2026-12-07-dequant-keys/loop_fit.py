#!/usr/bin/env python3
"""How far a page-loop variant's static instruction count predicts its page kernel's time with the
pages in L2 (H100, where the loop's own work shows in full and stands in for the H200 from DRAM).

Every variant timed that way so far, each against the shipped loop in the same run:
  instructions per warp and page and barriers per page: tools/kernel_static.py (sm90, Qwen2.5-7B shape, bf16);
  page kernel (us): python3 -m s4kv.kernels.bench --contexts 8192,32768 --batches 32,8 --breakdown --alias-blocks 128.

    python3 docs/results/gpu-h100-2026-12-07-dequant-keys/loop_fit.py
"""

PAGE_LOOP_BOUND = "docs/results/gpu-h100-2026-12-06-page-loop-bound/README.md"
# (name, source, (instructions, barriers) of the variant, of the shipped loop in that run,
#  (8k x 32, 32k x 8) page kernel of the variant, of the shipped loop in that run; means of the passes)
RUNS = [
    ("noconst (probe: no per-page key terms)", PAGE_LOOP_BOUND + " section 3",
     (601, 9), (779, 17), (43.7, 42.6), (49.35, 49.15)),
    ("all3 (probe: noconst, no max, unpack at 4 per 8 codes)", PAGE_LOOP_BOUND + " section 3",
     (442, 6), (779, 17), (31.8, 31.35), (49.35, 49.15)),
    ("BYTE_CODES (whole code bytes as fp16 operands)", PAGE_LOOP_BOUND + " section 5",
     (687, 13), (779, 17), (47.2, 47.2), (48.7, 47.3)),
    ("DEQUANT_KEYS (this folder)", "summary.txt",
     (918, 11), (779, 17), (56.7, 55.5), (48.6, 48.7)),
]


def main() -> None:
    rows = []
    for name, _src, (ins, bar), (ins0, bar0), t, t0 in RUNS:
        for point, dt in zip(("8k x 32", "32k x 8"), (t[0] - t0[0], t[1] - t0[1])):
            rows.append((name, point, ins - ins0, bar - bar0, dt))
    # least squares through the origin: the change of time per instruction per warp and page
    slope = sum(di * dt for _, _, di, _, dt in rows) / sum(di * di for _, _, di, _, _ in rows)
    print(f"slope: {slope:.4f} us per instruction per warp and page (least squares through 0, {len(rows)} points)")
    print(f"{'variant':56s} {'point':8s} {'d instr':>7s} {'d bar':>5s} {'d us':>6s} {'model':>6s} {'resid':>6s}")
    for name, point, di, db, dt in rows:
        print(f"{name:56s} {point:8s} {di:7d} {db:5d} {dt:6.2f} {slope * di:6.2f} {dt - slope * di:6.2f}")


if __name__ == "__main__":
    main()
