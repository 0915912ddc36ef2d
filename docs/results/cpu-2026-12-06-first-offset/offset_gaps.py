"""How far a page's largest score lies above the running maximum of the pages' first exact scores,
on a real model (CPU).

    python docs/results/cpu-2026-12-06-first-offset/offset_gaps.py [--tokens 2048] [--windows 2] [--pages-per-split 4] [--stride 16]

The decode page loop subtracts a running max from its scores before exp2. The shipped loop takes
the max over each page's tokens, which costs a reduction across the program's 4 warps per page
(4 of its 17 barriers). A loop could take instead the running max of the pages' first scores (each
block's first key is exact and its score is computed before the page's dots): no reduction, the same
softmax, exact while no p = exp2(score - offset) grows past what fp32 and the value sums hold. The
largest such exponent per split, the "gap", decides how often a split would have to run again with
the exact max. This tool measures it on SmolLM2's own queries and keys of the project's evaluation
text: decode queries at every `--stride`-th position, the pages a decode row reads (complete units,
s4kv.format's position rule), splits of `--pages-per-split` pages, a kv head's query heads together
(one page program). With 2,048-token windows a row has at most 16 pages, so the default splits of 4
pages give most splits a first page other than the sequence's first (whose first token, the
attention sink, usually sets the offset for the whole split).
"""

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT), str(ROOT / "tools")]

from layer_qk import each_layer

from s4kv import format as fmt
from s4kv.kernels.decode import LOG2E


def split_gaps(q: torch.Tensor, k: torch.Tensor, scale: float, stride: int, pages_per_split: int,
               fixed: bool = False) -> tuple[list, list]:
    """q [Hq, T, D], k [Hkv, T, D] of one layer -> the largest gap of every (decode position, kv head,
    split) in log2 units, for splits whose first page is the row's page 0 and for the others."""
    hq, t, d = q.shape
    hkv = k.shape[0]
    g = hq // hkv
    nb = t // fmt.BLOCK_SIZE
    kr = fmt.rotate(k.float()[:, :nb * fmt.BLOCK_SIZE]).reshape(hkv, nb, fmt.BLOCK_SIZE, d)
    codes, ks, km = fmt.quantize_keys(kr)  # codes [Hkv, nb, BS, D], ks / km [Hkv, nb, D]
    kq = codes.float() * ks[:, :, None] + km[:, :, None]  # the keys the page loop's dots see
    first = kr[:, :, 0]  # the exact first keys [Hkv, nb, D]
    qr = fmt.rotate(q.float()) * (scale * LOG2E)  # [Hq, T, D], as the kernel's rotated queries
    at_zero, later = [], []
    for pos in range(fmt.UNIT, t, stride):
        pages = (pos + 1) // fmt.UNIT * fmt.UNIT_BLOCKS
        qp = qr[:, pos].reshape(hkv, g, d)  # [Hkv, G, D]
        s = torch.einsum("hgd,hptd->hgpt", qp, kq[:, :pages])[..., 1:]  # token 0's score is the exact one
        page_max = s.amax(-1)  # [Hkv, G, pages]
        s_first = torch.einsum("hgd,hpd->hgp", qp, first[:, :pages])
        for lo in range(0, pages, pages_per_split):
            hi = min(lo + pages_per_split, pages)
            if fixed:  # the split's first page's first score, for the whole split
                offset = s_first[..., lo:lo + 1]
            else:  # the running max of the first scores
                offset = torch.cummax(s_first[..., lo:hi], dim=-1).values
            gap = (page_max[..., lo:hi] - offset).amax(-1).amax(-1)  # [Hkv]: over pages and the group
            (at_zero if lo == 0 else later).extend(gap.tolist())
    return at_zero, later


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--windows", type=int, default=2)
    ap.add_argument("--stride", type=int, default=16)
    ap.add_argument("--pages-per-split", type=int, default=4)
    ap.add_argument("--caps", default="32,48,64,80,90", help="gap limits to report the share within")
    ap.add_argument("--fixed", action="store_true",
                    help="the offset is the split's first score for all its pages (no running max at all)")
    ap.add_argument("--model", default=None, help="HF directory (default: the converted SmolLM2)")
    args = ap.parse_args(argv)
    gaps: dict[int, tuple[list, list]] = {}

    def on_layer(layer, q, k, scale):
        zero, later = split_gaps(q, k, scale, args.stride, args.pages_per_split, args.fixed)
        acc = gaps.setdefault(layer, ([], []))
        acc[0].extend(zero)
        acc[1].extend(later)

    path = each_layer(on_layer, args.tokens, args.windows, args.model)
    caps = [float(c) for c in args.caps.split(",")]
    print(f"# {path}: {args.windows} window(s) of {args.tokens} tokens, decode positions every {args.stride}, "
          f"{args.pages_per_split} pages per split; gap = largest (page max - "
          f"{'the split' + chr(39) + 's first score' if args.fixed else 'running max of first scores'}), log2 units")
    print("| layer | splits | median | p90 | p99 | p99.9 | max | " + " | ".join(f"≤ {c:g}" for c in caps) + " |")
    print("|---|---|---|---|---|---|---|" + "---|" * len(caps))

    def row(name, v: list) -> None:
        if not v:
            return
        t = torch.tensor(v)
        qs = torch.quantile(t, torch.tensor([0.5, 0.9, 0.99, 0.999]))
        print(f"| {name} | {len(t)} | " + " | ".join(f"{x:.1f}" for x in qs.tolist()) + f" | {t.max():.1f} | "
              + " | ".join(f"{(t <= c).float().mean():.4%}" for c in caps) + " |")

    for layer in sorted(gaps):
        row(f"{layer}, page 0's splits", gaps[layer][0])
        row(f"{layer}, later splits", gaps[layer][1])
    row("all, page 0's splits", [x for z, _ in gaps.values() for x in z])
    row("all, later splits", [x for _, lt in gaps.values() for x in lt])
    return 0


if __name__ == "__main__":
    sys.exit(main())
