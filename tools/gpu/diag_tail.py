#!/usr/bin/env python3
"""Decode attention with exact tails on the kernel bench's inputs: repeated runs against each other
and against the PyTorch path (s4kv.backend.torch_ops, the CPU serving path, on the same pages).

    python3 tools/gpu/diag_tail.py
"""
import sys

import torch

from s4kv.backend import torch_ops
from s4kv.kernels import bench
from s4kv.kernels.decode import decode_attention


def rel(a, b):
    return ((a - b).norm() / b.norm()).item()


def main():
    for context, batch in ((8256, 32), (8195, 32), (8256, 3), (320, 2), (8192, 32)):
        runs = []
        for _ in range(3):
            q, k, v, regions, md = bench.decode_inputs(context, batch)
            out = torch.empty(batch, q.shape[1], q.shape[2], dtype=torch.float32, device="cuda")
            decode_attention(q, k, v, regions, md, batch, q.shape[2] ** -0.5, out, md.decode_splits)
            torch.cuda.synchronize()
            runs.append((out.clone(), regions.clone()))
        ref = torch.zeros_like(runs[0][0])
        torch_ops._decode_rows(torch.arange(batch), q, k, v, regions, md, q.shape[2] ** -0.5, ref, store=False)
        per_row = [rel(runs[0][0][i], ref[i]) for i in range(batch)]
        print(f"{context}x{batch} splits {md.decode_splits}: run2 vs run1 {rel(runs[1][0], runs[0][0]):.2e}, "
              f"run3 vs run1 {rel(runs[2][0], runs[0][0]):.2e}, pages equal {torch.equal(runs[1][1], runs[0][1])}; "
              f"vs torch_ops run1 {rel(runs[0][0], ref):.2e} run3 {rel(runs[2][0], ref):.2e}, worst row "
              f"{max(per_row):.2e} (row {per_row.index(max(per_row))}), nan {bool(ref.isnan().any())}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
