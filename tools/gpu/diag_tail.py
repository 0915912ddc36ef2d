#!/usr/bin/env python3
"""Decode attention with windows on the kernel bench's inputs, against the PyTorch path
(s4kv.backend.torch_ops, the CPU serving path, on the same pages), call after call.

    python3 tools/gpu/diag_tail.py [--shapes 8256x32,8195x32,...] [--repeats 3] [--variants all|NAME,...]

Written when the decode tuner saw the points with an exact tail differ by 8-18% between launches
of the same configuration (2026-12-02): the bench drew the new token's value from torch's global
generator, not the seeded one, so each call had another input. With each call checked against the
PyTorch path on its own inputs, every call of every tail tile option agreed to 1e-3-5e-3 on an
H100 (docs/results/gpu-h200-2026-12-02-decode-launch/); compute-sanitizer's racecheck and
initcheck found nothing on small shapes.
"""
import argparse
import sys

import torch

from s4kv import kernels
from s4kv.backend import torch_ops
from s4kv.kernels import bench
from s4kv.kernels.decode import decode_attention
from s4kv.kernels.store import quantize_rows

VARIANTS = {"default": {}, "TAIL_STAGES=2": {"TAIL_STAGES": 2}, "TAIL_SUB=64": {"TAIL_SUB": 64},
            "TAIL_SUB=16": {"TAIL_SUB": 16}, "num_warps=8": {"num_warps": 8}}


def rel(a, b):
    return ((a - b).norm() / b.norm()).item()


def pytorch_path(q, k, v, regions, md):
    """The decode rows' attention by the PyTorch path (s4kv.backend.torch_ops, the CPU serving path)
    on the same pages, without storing: fp32 [rows, Hq, D]."""
    ref = torch.zeros(q.shape[0], q.shape[1], q.shape[2], dtype=torch.float32, device=q.device)
    torch_ops.forward(q, k, v, regions, md, q.shape[2] ** -0.5, ref, store=False)
    return ref


def calls(shapes, repeats):
    errs = []
    for context, batch in shapes:
        row = []
        for _ in range(repeats):
            q, k, v, regions, md = bench.decode_inputs(context, batch)
            out = torch.empty(batch, q.shape[1], q.shape[2], dtype=torch.float32, device="cuda")
            decode_attention(q, quantize_rows(k, v), regions, md, batch, q.shape[2] ** -0.5, out, md.decode_splits)
            ref = pytorch_path(q, k, v, regions, md)
            torch.cuda.synchronize()
            row.append(rel(out, ref))
        errs.append((f"{context}x{batch}", row))
    return errs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="8256x32,8195x32,8321x32,320x2")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--variants", default="", help="comma-separated names of VARIANTS, or all (default: default)")
    args = ap.parse_args()
    shapes = [tuple(map(int, s.split("x"))) for s in args.shapes.split(",")]
    names = list(VARIANTS) if args.variants == "all" else (args.variants or "default").split(",")
    for name in names:
        kernels.LAUNCH[("decode", 128)] = VARIANTS[name]
        for shape, row in calls(shapes, args.repeats):
            print(f"{name:14s} {shape:>9s}: " + ", ".join(f"call {i + 1} {e:.2e}" for i, e in enumerate(row)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
