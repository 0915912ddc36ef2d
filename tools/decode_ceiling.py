#!/usr/bin/env python3
"""How fast int4_kivi's decode step could be against bf16's, from an engine's profiled steps.

    python3 tools/decode_ceiling.py PROFILE.json [...] (--copy-tbps 4.27 | --kernels KERNELS.json)
                                    [--targets 1.4,1.5]

PROFILE.json: tools/gpu/profile_decode.py's records (one per dtype and point; int4_kivi and bf16,
`auto`, at the same point). KERNELS.json: s4kv.kernels.bench's records of the same lease, for the
GPU's copy bandwidth (a device-to-device copy; or --copy-tbps).

Per point it splits each dtype's step into the model's own kernels (the rest: every kernel but
those that read or write the KV cache, which are s4kv's decode, reduction, row, store, window and
stage kernels, FlashAttention and reshape_and_cache), the GPU's idle time, and the attention path,
what is left of the wall time (split_step), and prints:

- the **ceiling**: bf16's step over an int4_kivi step whose attention path reads the format's
  bytes at the copy bandwidth and costs nothing else (the rest and the idle time as profiled; and
  with bf16's idle time instead of int4_kivi's, which has more kernel boundaries per layer).
  Every token is counted at the pages' bytes per token and head (the 8-bit window rows are
  larger), so the ceiling is an upper bound: no decode kernel can beat it.
- for each target ratio, the attention path per layer it allows (both ways), next to the KV bytes'
  copy time.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from s4kv import format as fmt
from s4kv.bench.worker import head_size
from s4kv.models import DUMMY_CONFIGS

# the kernels of a decode step that belong to attention and the KV cache: s4kv's Triton kernels
# (s4kv.kernels.decode, store, window, chunk) and vLLM's FlashAttention and cache write for bf16
S4KV_KERNELS = ("_decode_kernel", "_reduce_kernel", "_rotate_queries_kernel", "_quantize_rows_kernel",
                "_store_blocks_kernel", "_append_window_kernel", "_stage_kernel")
BF16_MARKERS = ("flash", "reshape_and_cache")


def is_attention(name: str) -> bool:
    return name in S4KV_KERNELS or any(m in name.lower() for m in BF16_MARKERS)


def split_step(rec: dict) -> dict:
    """A profiled step's wall time, the model's own kernels (rest), the GPU's idle time and what is
    left for the attention path, µs. The attention path is the remainder, not the sum of its kernels:
    kernels launched programmatically (the reduction) start early and wait, so their durations
    overlap the page kernel's."""
    kernels = rec["kernels_us_per_step"]
    rest = sum(v for k, v in kernels.items() if not is_attention(k))
    idle = rec.get("gpu_idle_us") or 0.0
    return {"wall": rec["step_wall_us"], "rest": rest, "idle": idle,
            "attention": rec["step_wall_us"] - rest - idle,
            "attention_kernel_sum": sum(kernels.values()) - rest}


def model_shape(model: str) -> tuple[int, int, int]:
    """(layers, kv heads, head size) of a bench model name (dummy:qwen2.5-7b, ...)."""
    cfg = DUMMY_CONFIGS[model.split(":", 1)[-1]]
    return cfg["num_hidden_layers"], cfg["num_key_value_heads"], head_size(cfg)


def kv_copy_us(model: str, context: int, batch: int, steps: int, copy_bps: float) -> float:
    """One layer's int4_kivi KV bytes (every token at the pages' bytes per token and head; the
    sequences' mean length over the profiled steps) read at the copy bandwidth, µs."""
    _, kv_heads, head = model_shape(model)
    tokens = batch * (context + steps / 2)
    return tokens * kv_heads * fmt.bytes_per_token_per_head(head) / copy_bps * 1e6


def ceiling(int4: dict, bf16: dict, copy_bps: float, targets: list[float]) -> dict:
    layers, _, _ = model_shape(int4["model"])
    a, b = split_step(int4), split_step(bf16)
    floor = kv_copy_us(int4["model"], int4["context"], int4["batch"], int4["steps"], copy_bps)
    # what int4_kivi's step spends outside attention: its own idle time, and bf16's (fewer kernels
    # per layer, fewer gaps: what the step's idle time could come down to)
    fixed = a["rest"] + a["idle"]
    fixed_bf16_idle = a["rest"] + b["idle"]
    return {"context": int4["context"], "batch": int4["batch"], "layers": layers, "int4": a, "bf16": b,
            "kv_copy_us_per_layer": floor, "measured_ratio": b["wall"] / a["wall"],
            "ceiling_ratio": b["wall"] / (fixed + layers * floor),
            "ceiling_ratio_bf16_idle": b["wall"] / (fixed_bf16_idle + layers * floor),
            "attention_us_per_layer": a["attention"] / layers,
            "allowed_us_per_layer": {t: (b["wall"] / t - fixed) / layers for t in targets},
            "allowed_us_per_layer_bf16_idle": {t: (b["wall"] / t - fixed_bf16_idle) / layers for t in targets}}


def by_point(records: list[dict]) -> dict:
    """{(context, batch): {kv dtype: record}}."""
    out: dict = {}
    for r in records:
        out.setdefault((r["context"], r["batch"]), {})[r["kv_cache_dtype"]] = r
    return out


def pairs(records: list[dict]):
    """(int4_kivi, bf16) records of each (context, batch)."""
    for _, recs in sorted(by_point(records).items()):
        if "int4_kivi" in recs and "auto" in recs:
            yield recs["int4_kivi"], recs["auto"]


def copy_bandwidth(kernels_json: str) -> float:
    """The copy bandwidth a kernel bench run measured ({"device", "rows": [...]}, bytes/s)."""
    return next(r["copy_bandwidth"] for r in json.loads(Path(kernels_json).read_text())["rows"])


def report(c: dict, source: str) -> None:
    a, b = c["int4"], c["bf16"]
    print(f"\n{c['context']} x {c['batch']} ({source}):")
    print(f"  bf16      step {b['wall']:8,.0f} = attention {b['attention']:7,.0f} + rest {b['rest']:7,.0f} "
          f"+ idle {b['idle']:5,.0f}")
    print(f"  int4_kivi step {a['wall']:8,.0f} = attention {a['attention']:7,.0f} + rest {a['rest']:7,.0f} "
          f"+ idle {a['idle']:5,.0f}   measured {c['measured_ratio']:.2f}x bf16")
    print(f"  attention path {c['attention_us_per_layer']:.1f} us per layer (the sum of its kernels' durations "
          f"{a['attention_kernel_sum'] / c['layers']:.1f}, larger where launches overlap); the KV bytes at copy "
          f"bandwidth {c['kv_copy_us_per_layer']:.1f} us per layer")
    print(f"  ceiling (attention path = KV bytes at copy bandwidth, nothing else): {c['ceiling_ratio']:.3f}x bf16; "
          f"with bf16's idle time {c['ceiling_ratio_bf16_idle']:.3f}x")
    floor = c["kv_copy_us_per_layer"]
    for t, us in c["allowed_us_per_layer"].items():
        us2 = c["allowed_us_per_layer_bf16_idle"][t]
        print(f"  {t:.2f}x bf16 allows an attention path of {us:5.1f} us per layer ({us / floor:.0%} of the KV "
              f"bytes' copy time); with bf16's idle time {us2:5.1f} us ({us2 / floor:.0%})")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("profiles", nargs="+")
    bw = ap.add_mutually_exclusive_group(required=True)
    bw.add_argument("--copy-tbps", type=float, help="the GPU's copy bandwidth, TB/s")
    bw.add_argument("--kernels", help="s4kv.kernels.bench --json output of the same lease (its copy bandwidth)")
    ap.add_argument("--targets", default="1.4,1.5")
    args = ap.parse_args(argv)
    copy_bps = args.copy_tbps * 1e12 if args.copy_tbps else copy_bandwidth(args.kernels)
    targets = [float(t) for t in args.targets.split(",")]
    print(f"copy bandwidth {copy_bps / 1e12:.2f} TB/s; µs per step, per layer where marked")
    for path in args.profiles:  # one profile_decode run per file: its records pair up
        for int4, bf16 in pairs(json.loads(Path(path).read_text())):
            report(ceiling(int4, bf16, copy_bps, targets), f"{path}, {int4['device']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
