"""bound_gaps.py (beside this file; a record since the option was removed, not in CI's suite:
`PYTHONPATH=. python -m pytest docs/results/gpu-2026-12-06-terms-ahead/test_bound_gaps.py`) and the score bound the decode kernel's TERMS_AHEAD loop takes as its running
max (s4kv.kernels.decode._page_terms; bound_gaps.page_bounds): q . m + 15 * sum(max(q * s, 0)) lies
at or above every score a page's quantized keys give (codes 0..15), and the tool's gaps are taken
per split as the kernel's splits see them. CPU, no model."""

import sys
from pathlib import Path

import torch

from s4kv import format as fmt

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bound_gaps


def test_score_bound_lies_above_every_quantized_score():
    g = torch.Generator().manual_seed(0)
    k = torch.randn(3, 4 * fmt.BLOCK_SIZE, 64, generator=g)
    k[:, :, 5] *= 20  # an outlier channel, as real keys have
    q = torch.randn(3, 64, generator=g) * 4
    kr = fmt.rotate(k).reshape(3, 4, fmt.BLOCK_SIZE, 64)
    # in the last block, token 1 takes every channel's extreme on q's side (codes 15 where q > 0, 0
    # where q < 0): its score reaches the bound, which must then be tight, not merely above
    rest = kr[:, 3, 2:]
    kr[:, 3, 1] = torch.where(q > 0, rest.amax(1), rest.amin(1))
    codes, scale, mn = fmt.quantize_keys(kr)
    deq = fmt.dequantize_keys(codes, scale, mn)[:, :, 1:]  # token 0 is exact, not a code
    scores = torch.einsum("hd,hbtd->hbt", q, deq)
    bound = bound_gaps.page_bounds(q[:, None, :], scale, mn)[:, 0]  # [heads, blocks]
    assert (scores.amax(-1) <= bound + 1e-3 * bound.abs()).all()
    assert (bound - scores.amax(-1)).min() >= -1e-3
    assert torch.allclose(scores[:, 3].amax(-1), bound[:, 3], rtol=1e-4, atol=1e-3)


def test_split_gaps_per_decode_position_kv_head_and_split():
    g = torch.Generator().manual_seed(1)
    t = 4 * fmt.UNIT
    q, k = torch.randn(6, t, 64, generator=g), torch.randn(2, t, 64, generator=g)
    gaps = bound_gaps.split_gaps(q, k, 64 ** -0.5, stride=fmt.UNIT, pages_per_split=3)
    # decode positions UNIT, 2 UNIT, 3 UNIT (every UNIT-th from UNIT on) read 2, 4, 6 pages: 1, 2, 2 splits of 3
    assert len(gaps) == 2 * (1 + 2 + 2)
    assert min(gaps) >= 0
