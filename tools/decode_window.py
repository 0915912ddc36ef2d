#!/usr/bin/env python3
"""What the speed bench's decode window costs each dtype beyond a steady decode step, kernel by kernel.

    python3 tools/decode_window.py --steady STEADY.json --window WINDOW.json [--top 10]

`s4kv bench speed` counts as decode time t(1 + N tokens) - t(1 token) with prefix caching off, so its
window also holds the steps where the first requests decode beside later prompts' prefill.
tools/gpu/profile_decode.py measures a steady step (prefix caching on) and, with --bench-like, the
bench's window, both per step; `tools/gpu/run-on-device.sh profile-decode-window` runs the two
(their records: STEADY.json and WINDOW.json, int4_kivi and bf16 (`auto`) at the same point).

Per point and dtype it prints the window's step against the steady one, split as
tools/decode_ceiling.py splits a step (the model's own kernels, the GPU's idle time, the attention
path), and the kernels whose time per step moved most; then int4_kivi's ratio to bf16 both ways, and
the ratio the window would give if int4_kivi's step grew there only as much as bf16's does: what the
window's own costs take from the bench's figure.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode_ceiling import by_point, model_shape, split_step


def kernel_deltas(steady: dict, window: dict, top: int) -> list[tuple[str, float, float]]:
    """(kernel, steady µs, window µs) per step for the `top` kernels whose time moved most."""
    a, b = steady["kernels_us_per_step"], window["kernels_us_per_step"]
    names = sorted(set(a) | set(b), key=lambda k: -abs(b.get(k, 0.0) - a.get(k, 0.0)))
    return [(k, a.get(k, 0.0), b.get(k, 0.0)) for k in names[:top]]


def compare(steady: dict, window: dict) -> dict:
    """One dtype's window step against its steady step: the splits of both and their difference."""
    s, w = split_step(steady), split_step(window)
    return {"steady": s, "window": w, "excess": {k: w[k] - s[k] for k in ("wall", "rest", "idle", "attention")}}


def window_cost(int4: dict, bf16: dict) -> dict:
    """int4_kivi against bf16, steady and in the window; and the window's ratio had int4_kivi's step
    grown there only by bf16's excess (the window's structure, the same for both dtypes, kept)."""
    a, b = int4["excess"]["wall"], bf16["excess"]["wall"]
    sw, ww = int4["steady"]["wall"], int4["window"]["wall"]
    bs, bw = bf16["steady"]["wall"], bf16["window"]["wall"]
    return {"steady_ratio": bs / sw, "window_ratio": bw / ww, "ratio_at_bf16_excess": bw / (sw + b),
            "extra_excess_us": a - b}


def report(point: tuple[int, int], recs_s: dict, recs_w: dict, top: int) -> None:
    ctx, batch = point
    layers = model_shape(recs_s["int4_kivi"]["model"])[0]
    print(f"\n{ctx} x {batch} ({recs_s['int4_kivi'].get('device', '?')}; steady {recs_s['int4_kivi']['steps']} "
          f"steps, window {recs_w['int4_kivi']['steps']}), µs per step:")
    cmp = {}
    for kv in ("int4_kivi", "auto"):
        c = cmp[kv] = compare(recs_s[kv], recs_w[kv])
        e = c["excess"]
        print(f"  {kv:9s} steady {c['steady']['wall']:8,.0f}  window {c['window']['wall']:8,.0f}  "
              f"excess {e['wall']:+7,.0f} = attention {e['attention']:+6,.0f} + rest {e['rest']:+6,.0f} "
              f"+ idle {e['idle']:+5,.0f}")
        for name, a, b in kernel_deltas(recs_s[kv], recs_w[kv], top):
            print(f"      {b - a:+8.1f}  ({a:8.1f} -> {b:8.1f})  {name[:90]}")
    missing = [f"{kv} {name}" for kv in ("int4_kivi", "auto") for name, recs in (("steady", recs_s), ("window", recs_w))
               if recs[kv].get("gpu_idle_us") is None]
    if missing:  # profiles before 2026-12-04's step-prologue lease did not record it: counted as 0 above
        print(f"  (no idle time recorded for {', '.join(missing)}: its idle counts as 0, its attention path as larger)")
    wc = window_cost(cmp["int4_kivi"], cmp["auto"])
    print(f"  int4_kivi against bf16: steady {wc['steady_ratio']:.3f}x, window {wc['window_ratio']:.3f}x; "
          f"with bf16's excess in the window {wc['ratio_at_bf16_excess']:.3f}x")
    print(f"  int4_kivi's excess beyond bf16's: {wc['extra_excess_us']:+,.0f} us per step "
          f"({wc['extra_excess_us'] / layers:+.1f} per layer)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steady", required=True, help="profile_decode.py records, prefix caching on")
    ap.add_argument("--window", required=True, help="profile_decode.py --bench-like records")
    ap.add_argument("--top", type=int, default=10, help="kernels listed per dtype (largest moves)")
    args = ap.parse_args(argv)
    steady = by_point(json.loads(Path(args.steady).read_text()))
    window = by_point(json.loads(Path(args.window).read_text()))
    both = [p for p in sorted(steady) if p in window
            and {"int4_kivi", "auto"} <= set(steady[p]) and {"int4_kivi", "auto"} <= set(window[p])]
    if not both:
        print("no point with int4_kivi and auto records in both files", file=sys.stderr)
        return 1
    for p in both:
        report(p, steady[p], window[p], args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
