"""How far the pages' score bounds lie above their first exact scores on a real model (CPU).

    python docs/results/gpu-2026-12-06-terms-ahead/bound_gaps.py [--tokens 2048] [--windows 2] [--pages-per-split 16] [--stride 16]

(tools/bound_gaps.py until the option it measured for was removed, 2026-12-06, seventh session: its
kernel side is terms-ahead.diff here.) The decode kernel's TERMS_AHEAD option (s4kv.kernels.decode._page_terms) took each page's score
bound, q . m + 15 * sum(max(q * s, 0)) in the rotated basis (no score of the page can exceed it),
as the running max instead of the max over the page's tokens, capped at the page's first exact
score + BOUND_SLACK (64 log2 units). That is exact while the page's largest p stays within
2^-64 .. 2^64, so a split with a page whose gap bound - first score (the first key is exact, so the
gap is known before the page) exceeds 2 * BOUND_SLACK takes the exact max instead, and gains
nothing. This tool says how often that happens where it matters: SmolLM2's
own queries and keys on the project's evaluation text, decode queries at every `--stride`-th
position, the pages a decode row there reads (complete units, s4kv.format's position rule), in
splits of `--pages-per-split` pages (16 at 8k x 32 and 32k x 8 on an H100 or H200) and a kv head's
query heads together (one page program). The kernel bench's random queries and keys (and the
tests') give gaps of 30-41.
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


def page_bounds(q: torch.Tensor, ks: torch.Tensor, km: torch.Tensor) -> torch.Tensor:
    """The score bound of every page for every query, as _page_terms takes it: q . m + 15 * sum(max(q * s, 0))
    (key codes are 0..15 and scales >= 0, so no quantized score of the page exceeds it).
    q [..., G, D], ks / km [..., pages, D] (the pages' key scales and minimums) -> [..., G, pages]."""
    return q @ km.transpose(-1, -2) + 15 * (q[..., :, None, :] * ks[..., None, :, :]).clamp(min=0).sum(-1)


def split_gaps(q: torch.Tensor, k: torch.Tensor, scale: float, stride: int, pages_per_split: int) -> list[float]:
    """q [Hq, T, D], k [Hkv, T, D] of one layer -> the largest page gap of every (decode position,
    kv head, split): bound - first score in log2 units, the bound at least the first score."""
    hq, t, d = q.shape
    hkv = k.shape[0]
    g = hq // hkv
    nb = t // fmt.BLOCK_SIZE
    kr = fmt.rotate(k.float()[:, :nb * fmt.BLOCK_SIZE]).reshape(hkv, nb, fmt.BLOCK_SIZE, d)
    _, ks, km = fmt.quantize_keys(kr)  # [Hkv, nb, D]
    first = kr[:, :, 0]  # the exact first keys [Hkv, nb, D]
    qr = fmt.rotate(q.float()) * (scale * LOG2E)  # [Hq, T, D], as the kernel's rotated queries
    gaps = []
    for pos in range(fmt.UNIT, t, stride):
        pages = (pos + 1) // fmt.UNIT * fmt.UNIT_BLOCKS
        qp = qr[:, pos].reshape(hkv, g, d)  # [Hkv, G, D]
        bound = page_bounds(qp, ks[:, :pages], km[:, :pages])  # [Hkv, G, pages]
        s_first = qp @ first[:, :pages].transpose(-1, -2)
        gap = (torch.maximum(bound, s_first) - s_first).amax(1)  # [Hkv, pages], over the group
        for lo in range(0, pages, pages_per_split):
            gaps += gap[:, lo:lo + pages_per_split].amax(1).tolist()
    return gaps


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--windows", type=int, default=2)
    ap.add_argument("--stride", type=int, default=16)
    ap.add_argument("--pages-per-split", type=int, default=16)
    ap.add_argument("--slack", type=float, default=64.0)
    ap.add_argument("--model", default=None, help="HF directory (default: the converted SmolLM2)")
    args = ap.parse_args(argv)
    gaps: dict[int, list[float]] = {}

    def on_layer(layer, q, k, scale):
        gaps.setdefault(layer, []).extend(split_gaps(q, k, scale, args.stride, args.pages_per_split))

    path = each_layer(on_layer, args.tokens, args.windows, args.model)
    print(f"# {path}: {args.windows} window(s) of {args.tokens} tokens, decode positions every {args.stride}, "
          f"{args.pages_per_split} pages per split; gap = largest (page bound - first score), log2 units")
    print(f"| layer | splits | median | p90 | p99 | max | within {2 * args.slack:g} (bounds taken) |")
    print("|---|---|---|---|---|---|---|")

    def row(name, v: torch.Tensor) -> None:
        qs = torch.quantile(v, torch.tensor([0.5, 0.9, 0.99]))
        print(f"| {name} | {len(v)} | {qs[0]:.1f} | {qs[1]:.1f} | {qs[2]:.1f} | {v.max():.1f} | "
              f"{(v <= 2 * args.slack).float().mean():.1%} |")

    for layer in sorted(gaps):
        row(layer, torch.tensor(gaps[layer]))
    row("all", torch.tensor([x for layer in gaps.values() for x in layer]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
