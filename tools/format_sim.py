"""Simulate variants of the int4_kivi format on SmolLM2 in Hugging Face transformers.

    python tools/format_sim.py [--dtype float32,bfloat16] [--tokens 2048] [--variants a,b,...]

Why a simulation next to the engine bench: a format variant costs a kernel rewrite in the engine,
so variants are screened here first and only the chosen one goes through the whole stack (and
is then measured with the real engine, `s4kv bench quality`).

What it computes: the model scores the first N tokens of the project's evaluation text
(s4kv/data/eval_text.txt, tokenized as `s4kv bench quality` does) in one teacher-forced pass; every
attention layer computes what the cache would give it under the position rule of s4kv.format (a
query sees complete blocks through the format's encode/decode, the rest exact) and the variant's
changes to it. The reference is the same model with exact attention in the same dtype. Reported
per variant: perplexity delta and teacher-forced top-1 agreement against the reference, each with
the batch-means standard error of s4kv.bench.metrics, and bytes per token per kv head at
head_dim 128 (what the variant would cost a page).

Variants are built from these knobs (name: knob=value,...; see VARIANTS):
  sink        first S positions of the sequence exact (K and V), left out of block 0's key stats
  first_value the first token of every block keeps its value exact too (1: 16-bit, +2 B per token;
              8: int8 codes in the bytes the token's unused int4 codes free, no extra byte)
  recent      at least W most recent positions off the pages (W .. W + 127 of them; 0: the position
              rule's partial block only, 0 .. 127)
  first_key   0: the first key of every block is quantized with the rest (today: exact)
  unit        U: blocks are quantized in units of U blocks, a unit when its last block completes, so
              0 .. U * 128 - 1 positions are off the pages; unlike `recent`, a unit boundary leaves
              nothing off the pages, so a prefix-cache hit cut at a unit boundary needs no token
              of the blocks it hit (recent=W always needs the hit's last W .. W + 127 positions
              off the pages, which only the request that computed them holds)
  window      at least W most recent positions exact, token-granular (needs W extra exact tokens)
  vgroup      values quantized per (token, group of G channels) instead of the whole head
  kblock      key statistics per T-token sub-block instead of the whole block
  kq, vq      0: keys (values) never quantized, to see which half of the error is whose
  tail_v      4: the exact tail's values quantized as they arrive (per token, as pages store them;
              a block's first token in 8 bits with first_value=8): only keys wait for the block
  sink_bits   8: block 0 (the attention sink) in 8 bits, keys per channel (first key exact, as in
              every block), values per token: twice a page's codes, one extra page per request,
              and in pages, so prefix hits and preemption keep it
  kstat8      1: key statistics (minimum, scale) in fp8 e4m3 instead of fp16: with kblock=64, the
              same 4 bytes per token as fp16 statistics per 128 tokens
  kbits, vbits  code bits of keys and values (4 and 4 shipped; 5 and 3 keep the bytes per token)
  tail_k      8: the tail's keys in fp8 (e4m3, one scale per token, rotated basis)
  first_key   2: only block 0's first key (the attention sink) exact; other blocks' first keys are
              quantized with the rest, and their 256 bytes of first-key slot are free (kmin64)
  kmin64      1: in blocks whose first-key slot is free (first_key=2: every block but block 0),
              key minimum per 64-token half in that slot, the block's one scale shared by both
              halves: key statistics follow the tokens twice as closely at the shipped 136 bytes
  dots        the decode page loop's dot operands rounded as the kernel rounds them (the rest of the
              attention unrounded): 16: q * s per block and channel and p * vs per token in bf16 (the
              shipped kernel with a bf16 model); 8: q * s in int8, one scale per query, head and
              block (its largest magnitude over the channels is 127), p * vs in bf16; 88: p * vs in
              int8 too, one scale per query, head and block (the block's largest p times its largest
              value scale is 127); 32: the same algebra unrounded (equals no `dots`: a check). Pages
              only, shipped key statistics (kblock/kmin64/kfit excluded)
  kfit        N: key minimum and scale fitted by least squares (N rounds of fit, re-round) instead
              of min-max: the same bytes, a smaller squared error, codes clamp what the range
              leaves out (the format's |error| <= scale/2 bound no longer holds)
  vfit        N: the values' per-token scale fitted by least squares (N rounds), the same bytes
  tail8       1: the tail kept in 8 bits instead of exact: keys and values per token, symmetric
              int8 codes with an fp16 scale (the 8-bit first value's rule), rotated basis: 260 bytes
              per token at head_dim 128, so 128 tail tokens fit in 2 pages instead of 4. A block
              is then quantized from its 8-bit tail (the store reads the tail), first key
              included; the query's own token stays exact, as the step's input
  own8        1 (with tail8): the query's own token in 8 bits too, so every position off the pages
              is 8-bit (what a chunk kernel can stage for FlashAttention without an exact diagonal)
  f64         1: the attention in float64 from the dequantized values on (the CPU backend's
              arithmetic, s4kv.backend.torch_ops), instead of float32; the reference stays float32
  exact64     1: nothing quantized, exact attention in float64 (variant exact_f64): how far top-1
              moves for a difference of rounding alone
  xtok        which token of every block keeps its key exact (16-bit, left out of the key statistics)
              and its value in 8 bits, instead of the block's first token (block 0 keeps token 0,
              the sink): "norm" the largest rotated key, "range" the token whose key widens the
              block's per-channel ranges the most, "oracle" the token the exact attention weights
              most (not computable at store time: the bound on what any rule could gain); with
              first_value=8, the first key's slot and no other first-key knob
  kbias       1: every quantized key's logit lowered by half its expected error variance,
              (scale_attn^2 / 2) * sum_c q_c^2 * step_c^2 / 12 (the rounding error of a step-`step` code is
              uniform, variance step^2 / 12): a zero-mean error e on a logit inflates its expected
              softmax weight by E[exp(e)] ~ exp(var / 2), so pages (4-bit steps) outweigh the exact keys
              (the sink) and the 8-bit window in expectation; the correction takes that bias out
              from what a page already stores (the steps), no byte more
  klayers     (A, B): with kq=0 only in layers A..B (the rest quantized as the variant says): which
              layers' page keys carry a format's top-1 cost
  krot        0: keys quantized in the model's basis, not the rotated one (values stay rotated):
              per-channel statistics already follow a channel's own range, which the rotation
              spreads over all channels; with token 0's key exact, no token outlier is left in
              the statistics for the rotation to spread (queries then meet pages unrotated)
              (both: a smaller tail, fewer pages per running request; the query's own token stays
              exact, as the step's input)
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from s4kv import format as fmt
from s4kv.bench import metrics

BS = fmt.BLOCK_SIZE
# a position whose reference top two tokens are this close (log-probability, nats) is a near tie:
# the top-1 miss counts say how many of a variant's misses fall on them
NEAR_TIE = 0.1

VARIANTS = {
    "bf16": None,  # exact attention (a second reference pass: the simulation's own noise floor)
    # exact attention in another arithmetic: float64 instead of float32 (what the CPU backend's
    # attention runs in), nothing quantized; how far the model's top-1 moves for a perturbation far
    # below any cache's (a 16-bit cache computed in another order)
    "exact_f64": {"exact64": 1},
    # nothing quantized, through this simulation's own attention (rotated basis, 16-bit rows as the
    # exact first keys are kept), in float32 and in float64
    "exact_rot": {"kq": 0, "vq": 0},
    "exact_rot+f64": {"kq": 0, "vq": 0, "f64": 1},
    "current": {},
    "no_first_key": {"first_key": 0},
    "first_value": {"first_value": 1},
    "first_value8": {"first_value": 8},
    "sink1": {"sink": 1},
    "sink4": {"sink": 4},
    "sink16": {"sink": 16},
    "sink32": {"sink": 32},
    "sink64": {"sink": 64},
    "sink128": {"sink": 128},
    "first_value+sink128": {"first_value": 1, "sink": 128},
    "recent256": {"recent": 256},
    "sink128+recent256": {"sink": 128, "recent": 256},
    "keys_only": {"vq": 0},
    "values_only": {"kq": 0},
    "first_value8+values_only": {"first_value": 8, "kq": 0},  # the shipped values, exact keys
    "first_value8+k5v3": {"first_value": 8, "kbits": 5, "vbits": 3},
    "first_value8+kblock64": {"first_value": 8, "kblock": 64},
    "first_value8+kblock32": {"first_value": 8, "kblock": 32},
    "first_value8+kblock64+kstat8": {"first_value": 8, "kblock": 64, "kstat8": 1},
    # a quantized first key frees its 16 bits (and the 8-bit first value loses the codes it used)
    "no_first_key+kblock64": {"first_key": 0, "kblock": 64},
    "vgroup64": {"vgroup": 64},
    "vgroup32": {"vgroup": 32},
    "kblock64": {"kblock": 64},
    "window16": {"window": 16},
    "window32": {"window": 32},
    "window64": {"window": 64},
    "first_value8+sink8": {"first_value": 8, "sink_bits": 8},
    "first_value8+sink128": {"first_value": 8, "sink": 128},
    "first_value8+sink8+tail_v4": {"first_value": 8, "sink_bits": 8, "tail_v": 4},
    "first_value8+tail_v4": {"first_value": 8, "tail_v": 4},
    "first_value8+tail_v4+tail_k8": {"first_value": 8, "tail_v": 4, "tail_k": 8},
    "first_value8+sinkkey": {"first_value": 8, "first_key": 2},
    "first_value8+sinkkey+kmin64": {"first_value": 8, "first_key": 2, "kmin64": 1},
    "first_value8+sinkkey+kblock64": {"first_value": 8, "first_key": 2, "kblock": 64},
    "first_value8+sinkkey+kmin64+kfit3": {"first_value": 8, "first_key": 2, "kmin64": 1, "kfit": 3},
    "first_value8+sinkkey+kmin64+kfit3+vfit3": {"first_value": 8, "first_key": 2, "kmin64": 1, "kfit": 3,
                                                "vfit": 3},
    "first_value8+tail8": {"first_value": 8, "tail8": 1},
    # a longer window not read from pages: recent=W keeps W .. W + 127 positions off the pages, so
    # 128 is one more block (the tail's 4 pages hold it in 8 bits), 256 two more
    "first_value8+recent128": {"first_value": 8, "recent": 128},
    "first_value8+tail8+recent128": {"first_value": 8, "tail8": 1, "recent": 128},
    "first_value8+tail8own+recent128": {"first_value": 8, "tail8": 1, "own8": 1, "recent": 128},
    "first_value8+recent256": {"first_value": 8, "recent": 256},
    # units of two blocks (0..255 positions off the pages, 8-bit): what a prefix hit can restart
    "first_value8+tail8own+unit2": {"first_value": 8, "tail8": 1, "own8": 1, "unit": 2},
    # the shipped format with the decode kernel's dot-operand roundings (knob dots)
    "first_value8+tail8own+unit2+dots16": {"first_value": 8, "tail8": 1, "own8": 1, "unit": 2, "dots": 16},
    "first_value8+tail8own+unit2+dots8": {"first_value": 8, "tail8": 1, "own8": 1, "unit": 2, "dots": 8},
    "first_value8+tail8own+unit2+dots88": {"first_value": 8, "tail8": 1, "own8": 1, "unit": 2, "dots": 88},
    # the shipped format with its attention in float64, as the CPU backend computes it
    "first_value8+tail8own+unit2+f64": {"first_value": 8, "tail8": 1, "own8": 1, "unit": 2, "f64": 1},
    "first_value8+sinkkey+kmin64+tail8own+unit2": {"first_value": 8, "first_key": 2, "kmin64": 1, "tail8": 1,
                                                   "own8": 1, "unit": 2},
    # block 0 (the attention sink) in 8 bits in two pages, or exact (16-bit), with the units of two
    "first_value8+tail8own+unit2+sink8": {"first_value": 8, "tail8": 1, "own8": 1, "unit": 2, "sink_bits": 8},
    "first_value8+tail8own+unit2+sink128": {"first_value": 8, "tail8": 1, "own8": 1, "unit": 2, "sink": 128},
    # another token than the block's first keeps the exact key and the 8-bit value (xtok)
    "first_value8+tail8own+unit2+xfirst": {"first_value": 8, "tail8": 1, "own8": 1, "unit": 2, "xtok": "first"},
    "first_value8+tail8own+unit2+xnorm": {"first_value": 8, "tail8": 1, "own8": 1, "unit": 2, "xtok": "norm"},
    "first_value8+tail8own+unit2+xrange": {"first_value": 8, "tail8": 1, "own8": 1, "unit": 2, "xtok": "range"},
    "first_value8+tail8own+unit2+xoracle": {"first_value": 8, "tail8": 1, "own8": 1, "unit": 2, "xtok": "oracle"},
    # units of three blocks (0..383 positions off the pages): 383 8-bit rows need 6 window pages
    # instead of 4 (d128: 99,580 B in regions of 17,408), two more pages per request
    "first_value8+tail8own+unit3": {"first_value": 8, "tail8": 1, "own8": 1, "unit": 3},
    # every quantized key's logit lowered by half its expected error variance (kbias)
    "first_value8+tail8own+unit2+kbias": {"first_value": 8, "tail8": 1, "own8": 1, "unit": 2, "kbias": 1},
    # finer key statistics with the units of two: per 64 tokens (+4 B), or per 64 in the first-key slot
    # of blocks 1.. and block 0's sink key exact (+2 B)
    "first_value8+tail8own+unit2+kblock64": {"first_value": 8, "tail8": 1, "own8": 1, "unit": 2, "kblock": 64},
    "first_value8+sinkkey+kblock64+tail8own+unit2": {"first_value": 8, "first_key": 2, "kblock": 64, "tail8": 1,
                                                      "own8": 1, "unit": 2},
    # which part of the units-of-two format costs what: its page keys exact, its page values exact,
    # its window exact (16-bit rows)
    "first_value8+tail8own+unit2+keys_exact": {"first_value": 8, "tail8": 1, "own8": 1, "unit": 2, "kq": 0},
    "first_value8+tail8own+unit2+values_exact": {"first_value": 8, "tail8": 1, "own8": 1, "unit": 2, "vq": 0},
    "first_value8+unit2": {"first_value": 8, "unit": 2},
    # its page keys exact in some layers only (SmolLM2: layers 0..29)
    **{f"first_value8+tail8own+unit2+keys_exact_L{a}-{b}": {"first_value": 8, "tail8": 1, "own8": 1, "unit": 2,
                                                          "klayers": (a, b)}
       for a, b in ((0, 0), (1, 3), (4, 9), (10, 19), (20, 29), (0, 3), (0, 9))},
    # the page keys finer: 5-bit key codes paid with 3-bit values (the same bytes), or on top (+16 B)
    "first_value8+tail8own+unit2+k5v3": {"first_value": 8, "tail8": 1, "own8": 1, "unit": 2, "kbits": 5, "vbits": 3},
    "first_value8+tail8own+unit2+k5": {"first_value": 8, "tail8": 1, "own8": 1, "unit": 2, "kbits": 5},
    "first_value8+tail8+recent256": {"first_value": 8, "tail8": 1, "recent": 256},
    "first_value8+k5": {"first_value": 8, "kbits": 5},
    "first_value8+kfit3": {"first_value": 8, "kfit": 3},
    "first_value8+krot0": {"first_value": 8, "krot": 0},
    "first_value8+krot0+kblock64": {"first_value": 8, "krot": 0, "kblock": 64},
}


def layer_variant(var: dict, layer: int) -> dict:
    """The knobs layer `layer` runs with: `klayers` (A, B) makes keys exact (kq=0) in layers A..B only."""
    if "klayers" not in var:
        return var
    first, last = var["klayers"]
    return {**var, "kq": 0} if first <= layer <= last else var


def bytes_per_token(v: dict, d: int = 128) -> float:
    """Page bytes per token per kv head of a variant (the sink and a longer recent window are
    per-request memory, not page bytes)."""
    b = fmt.bytes_per_token_per_head(d)
    if v.get("first_key", 1) == 0 or (v.get("first_key") == 2 and not v.get("kmin64")):
        b -= 2 * d / BS  # (first_key=2 without kmin64: block 0's page keeps the slot, others need none)
    if v.get("first_value") == 1:
        b += 2 * d / BS
    if v.get("vgroup"):
        b += 2 * (d // v["vgroup"] - 1)
    b += (v.get("kbits", 4) - 4 + v.get("vbits", 4) - 4) * d / 8  # code bits beyond 4 per element
    if v.get("kblock"):
        b += (2 if v.get("kstat8") else 4) * d / v["kblock"] - 4 * d / BS
    return b


FP8_MAX = torch.finfo(torch.float8_e4m3fn).max  # 448


def _fp8(x: torch.Tensor) -> torch.Tensor:
    """x rounded to the nearest e4m3 value (saturating at ±FP8_MAX), back in fp32."""
    return x.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).float()


def _masked_range(x: torch.Tensor, e: torch.Tensor):
    """Per-group minimum (fp16, rounded down) and maximum over the token axis (-2) of x, without the
    tokens e marks (e broadcasts against x); a group with every token marked gets 0 and 0."""
    big = torch.finfo(torch.float32).max
    mn = fmt.fp16_down(torch.where(e, big, x).amin(dim=-2))
    mx = torch.where(e, -big, x).amax(dim=-2)
    none = e.all(dim=-2)
    return torch.where(none, 0.0, mn), torch.where(none, 0.0, mx)


def _fit_keys(x: torch.Tensor, keep: torch.Tensor, mn: torch.Tensor, scale: torch.Tensor,
              levels: int, rounds: int):
    """Least-squares minimum and scale per (group, channel): from the min-max ones, `rounds` times
    fit x ~ code * scale + min over the kept tokens with the codes fixed, then re-round the codes;
    a channel keeps whichever statistics (fp16-rounded) gave the smaller squared error."""
    def sse(m, sc):
        c = torch.floor((x - m.unsqueeze(-2)) * fmt._inverse(sc).unsqueeze(-2) + 0.5).clamp(0, levels)
        return (((fmt.dequantize_keys(c, sc, m) - x) ** 2) * keep).sum(-2), c
    best_err, c = sse(mn, scale)
    best_mn, best_sc = mn, scale
    n = keep.sum(-2)
    for _ in range(rounds):
        cf = c * keep
        sc_, s_x = cf.sum(-2), (x * keep).sum(-2)
        scc, scx = (cf * c).sum(-2), (cf * x).sum(-2)
        det = n * scc - sc_ * sc_
        ok = det > 0
        sc_new = torch.where(ok, (n * scx - sc_ * s_x) / torch.where(ok, det, 1.0), scale)
        mn_new = torch.where(ok, (s_x - sc_new * sc_) / n.clamp(min=1), mn)
        mn_new, sc_new = mn_new.to(torch.float16).float(), sc_new.clamp(min=0).to(torch.float16).float()
        err, c = sse(mn_new, sc_new)
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        best_mn, best_sc = torch.where(better, mn_new, best_mn), torch.where(better, sc_new, best_sc)
    return best_mn, best_sc


def _keys_min64(x: torch.Tensor, excl: torch.Tensor, levels: int = fmt.CODE_LEVELS, fit: int = 0) -> torch.Tensor:
    """Keys with a minimum per 64-token half and one scale per block: x [H, G, T, D], excl [G, T]
    -> dequantized [H, G, T, D]. The scale covers the wider half's range, so no code clamps;
    fit > 0: then `fit` rounds of least squares (one scale, two minima, codes fixed; re-round),
    each channel keeping the statistics with the smaller squared error."""
    h, g, t, d = x.shape
    xh = x.reshape(h, g, 2, t // 2, d)
    e = excl.reshape(1, g, 2, t // 2, 1)
    mn, mx = _masked_range(xh, e)  # [H, G, 2, D]
    scale = fmt.fp16_up((mx - mn).amax(dim=-2) / levels)  # [H, G, D]
    keep = (~e).float()

    def quant(m, sc):
        codes = torch.floor((xh - m.unsqueeze(-2)) * fmt._inverse(sc)[:, :, None, None, :] + 0.5).clamp(0, levels)
        dq = codes * sc[:, :, None, None, :] + m.unsqueeze(-2)
        return codes, dq, (((dq - xh) ** 2) * keep).sum(dim=(-3, -2))

    codes, best, best_err = quant(mn, scale)
    n = keep.sum(-2).clamp(min=1)  # [1, G, 2, 1]
    for _ in range(fit):
        cbar = (codes * keep).sum(-2) / n
        xbar = (xh * keep).sum(-2) / n
        dc = (codes - cbar.unsqueeze(-2)) * keep
        num = (dc * (xh - xbar.unsqueeze(-2))).sum(dim=(-3, -2))
        den = (dc * dc).sum(dim=(-3, -2))
        sc = torch.where(den > 0, num / torch.where(den > 0, den, 1.0), scale).clamp(min=0)
        sc = sc.to(torch.float16).float()
        m = (xbar - sc.unsqueeze(-2) * cbar).to(torch.float16).float()
        codes, dq, err = quant(m, sc)
        better = (err < best_err)[:, :, None, None, :]
        best = torch.where(better, dq, best)
        best_err = torch.minimum(err, best_err)
    return best.reshape(h, g, t, d)


def _fit_values(v: torch.Tensor, vq: torch.Tensor, scale: torch.Tensor, levels: int, rounds: int):
    """Values' per-token symmetric scale by least squares: `rounds` times fit v ~ (code - L/2) * s
    with the codes fixed, re-round; each token keeps the dequantized values with the smaller error."""
    x = v.float().clamp(-fmt.FP16_MAX, fmt.FP16_MAX)
    best, best_err = vq, ((vq - x) ** 2).sum(-1)
    c = best / torch.where(scale > 0, scale, 1.0).unsqueeze(-1)  # code - L/2
    for _ in range(rounds):
        den = (c * c).sum(-1)
        sc = torch.where(den > 0, (c * x).sum(-1) / torch.where(den > 0, den, 1.0), scale)
        sc = sc.clamp(min=0).to(torch.float16).float()
        codes = torch.floor(x * fmt._inverse(sc).unsqueeze(-1) + (levels + 1) / 2).clamp(0, levels)
        c = codes - levels / 2
        dq = c * sc.unsqueeze(-1)
        err = ((dq - x) ** 2).sum(-1)
        better = (err < best_err).unsqueeze(-1)
        best, best_err = torch.where(better, dq, best), torch.minimum(err, best_err)
    return best


def _keys(x: torch.Tensor, excl: torch.Tensor, levels: int = fmt.CODE_LEVELS, stat8: bool = False,
          fit: int = 0) -> torch.Tensor:
    """Per-channel keys as s4kv.format quantizes them, over groups of tokens: x [H, G, T, D] (fp16
    range), statistics without the tokens excl [G, T] marks -> dequantized [H, G, T, D]. A group
    with every token excluded gets min 0 and scale 0 (its codes are unused). fit > 0: the
    statistics fitted by least squares (_fit_keys) instead of min-max."""
    e = _token_mask(excl)
    mn, mx = _masked_range(x, e)
    if stat8:  # minimum and scale stored in fp8 (e4m3), nearest; codes clamp what falls outside
        mn = _fp8(mn)
        scale = _fp8((mx - mn) / levels)
    else:
        scale = fmt.fp16_up((mx - mn) / levels)
    if fit:
        mn, scale = _fit_keys(x, (~e).float(), mn, scale, levels, fit)
    codes = torch.floor((x - mn.unsqueeze(-2)) * fmt._inverse(scale).unsqueeze(-2) + 0.5).clamp(0, levels)
    return fmt.dequantize_keys(codes, scale, mn)


def _token_mask(m: torch.Tensor) -> torch.Tensor:
    """A token mask [G, T] (every head) or [H, G, T] (per head) as [H or 1, G, T, 1] against [H, G, T, D]."""
    return (m[None] if m.dim() == 2 else m)[..., None]


def _exact_token(kb: torch.Tensor, var: dict) -> torch.Tensor:
    """xtok: the token of each (kv head, block) that keeps its key exact, [H, NB] (block 0: token 0).
    kb [H, NB, BS, D] are the keys as the block is quantized from (rotated basis)."""
    h, nb, bs, _ = kb.shape
    rule = var["xtok"]
    if rule == "first":
        idx = torch.zeros(h, nb, dtype=torch.long)
    elif rule == "norm":
        idx = kb.float().norm(dim=-1).argmax(-1)
    elif rule == "range":  # what leaving the token out takes off the block's per-channel ranges
        top = kb.float().topk(2, dim=2)
        low = (-kb.float()).topk(2, dim=2)
        gain = torch.zeros(h, nb, bs)
        gain.scatter_add_(2, top.indices[:, :, 0], top.values[:, :, 0] - top.values[:, :, 1])
        gain.scatter_add_(2, low.indices[:, :, 0], low.values[:, :, 0] - low.values[:, :, 1])
        idx = gain.argmax(-1)
    elif rule == "oracle":  # attention mass each token receives in exact attention (kivi_sdpa)
        idx = var["_mass"][:, :nb * bs].reshape(h, nb, bs).argmax(-1)
    else:
        raise ValueError(f"xtok={rule!r}")
    idx[:, 0] = 0
    return idx


def fake_quantize(k: torch.Tensor, v: torch.Tensor, var: dict, key_variance: bool = False):
    """k, v [H, T, D] exact (model dtype), T a multiple of BS -> dequantized k, v fp32 in the
    rotated basis (keys in the model's basis with krot=0), [H, T, D], as the variant stores them;
    key_variance: also every key element's expected rounding-error variance [H, T, D] (step^2 / 12,
    0 for keys kept exact), from the statistics the page stores (min-max, per block only)."""
    h, t, d = k.shape
    nb = t // BS
    kb = (fmt.rotate(k) if var.get("krot", 1) else k.float()).reshape(h, nb, BS, d)
    vb = fmt.rotate(v).reshape(h, nb, BS, d)
    sink = var.get("sink", 0)
    # Key stats: tokens that are stored exact are left out (today: token 0 of every block).
    excl = torch.zeros(nb, BS, dtype=torch.bool)
    if var.get("first_key", 1) == 2:
        excl[0, 0] = True  # the sink's key only
    elif var.get("first_key", 1):
        excl[:, 0] = True
    excl[0, :min(sink, BS)] = True
    if var.get("xtok"):  # one token per (kv head, block), chosen by the rule
        assert var.get("first_key", 1) == 1 and not (sink or var.get("kmin64") or var.get("kblock")), \
            "xtok replaces the first key's rule"
        excl = torch.zeros(h, nb, BS, dtype=torch.bool)
        excl.scatter_(2, _exact_token(kb, var)[..., None], True)
    x = kb.clamp(-fmt.FP16_MAX, fmt.FP16_MAX)
    tb = var.get("kblock", BS)  # key statistics per sub-block of tb tokens (default: the block)
    klev, vlev = 2 ** var.get("kbits", 4) - 1, 2 ** var.get("vbits", 4) - 1
    kq = _keys(x.reshape(h, nb * BS // tb, tb, d), excl.reshape(*excl.shape[:-2], nb * BS // tb, tb), klev,
               bool(var.get("kstat8")), var.get("kfit", 0)).reshape(h, nb, BS, d)
    if var.get("kmin64"):
        assert var.get("first_key") == 2 and tb == BS, "kmin64 takes the first-key slot of blocks 1.."
        kq[:, 1:] = _keys_min64(x[:, 1:], excl[1:], klev, var.get("kfit", 0))
    gsz = var.get("vgroup", d)
    vg = vb.reshape(h, nb, BS, d // gsz, gsz)
    vc, vs = fmt.quantize_values(vg, vlev)
    vq = fmt.dequantize_values(vc, vs, vlev)
    if var.get("vfit"):
        vq = _fit_values(vg, vq, vs, vlev, var["vfit"])
    vq = vq.reshape(h, nb, BS, d)
    exact16 = torch.zeros(nb, BS, dtype=torch.bool)  # K and V of these tokens stay 16-bit exact
    exact16[0, :min(sink, BS)] = True
    k16 = kb.to(fmt.first_key_dtype(k.dtype)).float()
    v16 = vb.to(fmt.first_key_dtype(k.dtype)).float()
    kx = excl.clone() if var.get("first_key", 1) else exact16.clone()
    kx |= exact16
    vx = exact16.clone()
    if var.get("first_value") == 1:
        vx[:, 0] = True
    elif var.get("first_value") == 8 and var.get("xtok"):  # the exact-key token's value in 8 bits
        c8, s8 = fmt.quantize_values(vb, fmt.FIRST_VALUE_LEVELS)
        vq = torch.where(_token_mask(excl), fmt.dequantize_values(c8, s8, fmt.FIRST_VALUE_LEVELS), vq)
    elif var.get("first_value") == 8:  # 8-bit codes, as s4kv.format stores the first value
        # its high nibbles take the exact first key's unused code row: with first_key=2 only block 0 has one
        fb = 1 if var.get("first_key") == 2 else nb
        c8, s8 = fmt.quantize_values(vb[:, :fb, 0], fmt.FIRST_VALUE_LEVELS)
        vq[:, :fb, 0] = fmt.dequantize_values(c8, s8, fmt.FIRST_VALUE_LEVELS)
    if var.get("sink_bits") == 8:  # block 0 in 8 bits: keys per channel, values per token (2 pages)
        kq[:, 0] = _keys(x[:, :1], excl[:1], fmt.FIRST_VALUE_LEVELS)[:, 0]
        c8, s8 = fmt.quantize_values(vb[:, 0], fmt.FIRST_VALUE_LEVELS)
        vq[:, 0] = fmt.dequantize_values(c8, s8, fmt.FIRST_VALUE_LEVELS)
    kq = torch.where(_token_mask(kx), k16, kq)
    vq = torch.where(_token_mask(vx), v16, vq)
    if var.get("kq", 1) == 0:
        kq = k16
    if var.get("vq", 1) == 0:
        vq = v16
    if not key_variance:
        return kq.reshape(h, t, d), vq.reshape(h, t, d)
    assert tb == BS and not (var.get("kfit") or var.get("kstat8") or var.get("kmin64") or var.get("sink_bits")
                             or var.get("xtok")), "key variance: the shipped per-block min-max statistics only"
    mn, mx = _masked_range(x, _token_mask(excl))
    step = fmt.fp16_up((mx - mn) / klev)  # [H, NB, D]
    kvar = (step.square() / 12).unsqueeze(-2).expand(h, nb, BS, d)
    kvar = torch.where(_token_mask(kx), 0.0, kvar)
    if var.get("kq", 1) == 0:
        kvar = torch.zeros_like(kvar)
    return kq.reshape(h, t, d), vq.reshape(h, t, d), kvar.reshape(h, t, d)


def _int8_round(x: torch.Tensor, bound: torch.Tensor) -> torch.Tensor:
    """x rounded to multiples of bound / 127 (bound broadcasts; |x| <= bound)."""
    unit = bound.clamp(min=1e-30) / 127
    return torch.round(x / unit) * unit


def _page_dots(qr, kq, vq, nb, g, mode):
    """The pages' scores [Hq, T, nb*BS] and their values' share [Hq, T, D] (rotated basis) with the
    decode kernel's dot operands rounded (knob `dots`): keys as m + s * code per block and channel
    (the statistics over tokens 1..127; token 0's exact key scores unrounded), values as
    vs * (code - 7.5) per token."""
    hq, t, d = qr.shape
    kb = kq.reshape(-1, nb, BS, d)[:, :, 1:]  # [Hkv, nb, BS-1, D]: token 0 is the exact key
    mn, mx = kb.amin(2), kb.amax(2)  # the stored minimum is a code-0 value, the maximum a code-15 one
    step = (mx - mn) / fmt.CODE_LEVELS
    codes = torch.where(step[:, :, None] > 0, torch.round((kq.reshape(-1, nb, BS, d) - mn[:, :, None]) /
                                                          step[:, :, None].clamp(min=1e-30)), 0.0)
    step, mn, codes = (x.repeat_interleave(g, 0) for x in (step, mn, codes))
    qs = qr[:, :, None, :] * step[:, None]  # [Hq, T, nb, D]
    if mode == 16:
        qs = qs.to(torch.bfloat16).to(qr.dtype)
    elif mode in (8, 88):
        qs = _int8_round(qs, qs.abs().amax(-1, keepdim=True))
    sc = torch.einsum("htbd,hbkd->htbk", qs, codes) + torch.einsum("htd,hbd->htb", qr, mn)[..., None]
    sc[..., 0] = torch.einsum("htd,hbd->htb", qr, kq.reshape(-1, nb, BS, d)[:, :, 0].repeat_interleave(g, 0))
    vb = vq.reshape(-1, nb, BS, d)
    vs = vb.abs().amax(-1) / (fmt.CODE_LEVELS / 2)  # [Hkv, nb, BS]: the largest |value| is a code 0 or 15
    vs = torch.where(vs > 0, vs, 1.0)
    vc = (vb / vs[..., None]).repeat_interleave(g, 0)  # code - 7.5 (token 0's 8-bit value, in those units)
    vs = vs.repeat_interleave(g, 0)

    def values(pb):  # pb [Hq, T, nb, BS] -> [Hq, T, D]
        pv = pb * vs[:, None]
        if mode == 88:
            pv = _int8_round(pv, pb.amax(-1, keepdim=True) * vs.amax(-1)[:, None, :, None])
        elif mode in (8, 16):
            pv = pv.to(torch.bfloat16).to(pb.dtype)
        return torch.einsum("htbk,hbkd->htd", pv, vc)
    return sc.reshape(hq, t, nb * BS), values


def kivi_sdpa(q, k, v, scale, var):
    """q [Hq, T, D], k, v [Hkv, T, D] -> [T, Hq, D] fp32: causal attention under the variant."""
    hq, t, _ = q.shape
    hkv = k.shape[0]
    g = hq // hkv
    nb = t // BS
    pos = torch.arange(t)
    if var.get("xtok") == "oracle":  # the attention mass each key receives, exact attention
        s0 = (torch.matmul(q.float(), k.float().repeat_interleave(g, 0).transpose(-1, -2)) * scale)
        p0 = torch.softmax(s0.masked_fill(pos[None, :] > pos[:, None], float("-inf")), -1)
        var = {**var, "_mass": p0.sum(1).reshape(hkv, g, t).sum(1)}
    if var.get("tail8"):  # what the tail holds (and a completing block is quantized from)
        assert not (var.get("tail_k") or var.get("tail_v")), "tail8 replaces tail_k / tail_v"
        k8r, v8r = fmt.window_round_trip(k), fmt.window_round_trip(v)  # the format's window rows
        kq, vq, *kvar = fake_quantize(fmt.unrotate(k8r[:, :nb * BS]).to(k.dtype),
                                      fmt.unrotate(v8r[:, :nb * BS]).to(v.dtype), var, bool(var.get("kbias")))
    else:
        kq, vq, *kvar = fake_quantize(k[:, :nb * BS], v[:, :nb * BS], var, bool(var.get("kbias")))
    boundary = ((pos + 1) // BS) * BS  # first exact position for each query (the position rule)
    unit = var.get("unit", 1) * BS
    if unit > BS:
        boundary = ((pos + 1) // unit) * unit
    recent = var.get("recent", 0)
    if recent:
        boundary = torch.minimum(boundary, ((pos + 1 - recent).clamp(min=0) // BS) * BS)
    use_q = pos[None, :nb * BS] < boundary[:, None]  # [T, nbBS]
    if var.get("window"):
        use_q &= pos[None, :nb * BS] <= pos[:, None] - var["window"]
    # f64: attention in float64 from the dequantized values on, as the CPU backend computes it
    # (s4kv.backend.torch_ops._attend); otherwise float32
    ft = torch.float64 if var.get("f64") else torch.float32
    qf = q.to(ft)
    kf = k.to(ft).repeat_interleave(g, 0)
    vf = v.to(ft).repeat_interleave(g, 0)
    qr = fmt.rotate(qf, ft)
    kqr = kq.to(ft).repeat_interleave(g, 0)
    vqr = vq.to(ft).repeat_interleave(g, 0)
    s_ex = torch.matmul(qf, kf.transpose(-1, -2))
    tail = ~torch.cat([use_q, torch.zeros(t, t - nb * BS, dtype=torch.bool)], 1)
    if not var.get("own8"):
        tail &= pos[None, :] != pos[:, None]
    kt = None  # the tail's keys (not the query's own) as the variant keeps them, rotated basis
    if var.get("tail_k"):  # fp8, per token
        kr = fmt.rotate(k)
        ks = kr.abs().amax(-1, keepdim=True).clamp(min=1e-30) / FP8_MAX
        kt = _fp8(kr / ks) * ks
    elif var.get("tail8"):
        kt = k8r
    if kt is not None:
        s_ex = torch.where(tail, torch.matmul(qr, kt.to(ft).repeat_interleave(g, 0).transpose(-1, -2)), s_ex)
    s_q = torch.matmul(qr if var.get("krot", 1) else qf, kqr.transpose(-1, -2))
    dots = var.get("dots")
    if dots:
        assert var.get("krot", 1) and not (var.get("kblock") or var.get("kmin64") or var.get("kfit")
                                           or var.get("kbias") or var.get("kq", 1) == 0), "dots: the shipped pages"
        s_q, page_values = _page_dots(qr, kq.to(ft), vq.to(ft), nb, g, dots)
    s = s_ex.clone()
    s[:, :, :nb * BS] = torch.where(use_q, s_q, s_ex[:, :, :nb * BS])
    if var.get("kbias"):  # minus half each quantized logit's expected error variance (in s * scale units)
        q2 = qr.square()
        bias = torch.zeros_like(s)
        bias[:, :, :nb * BS] = torch.where(use_q, torch.matmul(q2, kvar[0].to(ft).repeat_interleave(g, 0).transpose(-1, -2)), 0.0)
        if var.get("tail8"):  # the window's rows: one step per token, every channel
            step8 = fmt.quantize_window(k)[1].to(ft).repeat_interleave(g, 0)  # [Hq, T]
            wvar = q2.sum(-1, keepdim=True) * (step8.square() / 12)[:, None, :]
            bias = torch.where(tail, wvar, bias)
        s = s - 0.5 * scale * bias
    s = (s * scale).masked_fill(pos[None, :] > pos[:, None], float("-inf"))
    p = torch.softmax(s, dim=-1)
    pq = torch.where(use_q, p[:, :, :nb * BS], 0.0)
    pe = p.clone()
    pe[:, :, :nb * BS] = torch.where(use_q, 0.0, p[:, :, :nb * BS])
    vt = None  # the tail's values (not the query's own) as the variant keeps them, rotated basis
    if var.get("tail8"):
        vt = v8r
    elif var.get("tail_v"):  # as pages store values, per token
        assert not (var.get("sink") or var.get("vgroup")), "tail_v simulates the shipped value format only"
        vr = fmt.rotate(v)
        vc, vs = fmt.quantize_values(vr)
        vt = fmt.dequantize_values(vc, vs)
        if var.get("first_value") == 8:
            first = pos % BS == 0
            c8, s8 = fmt.quantize_values(vr[:, first], fmt.FIRST_VALUE_LEVELS)
            vt[:, first] = fmt.dequantize_values(c8, s8, fmt.FIRST_VALUE_LEVELS)
    pages = page_values(pq.reshape(*pq.shape[:2], nb, BS)) if dots else torch.matmul(pq, vqr)
    if vt is not None:
        pt = torch.where(tail, pe, 0.0)
        o = torch.matmul(pe - pt, vf) + fmt.unrotate(pages + torch.matmul(pt, vt.to(ft).repeat_interleave(g, 0)), ft)
    else:
        o = torch.matmul(pe, vf) + fmt.unrotate(pages, ft)
    return o.transpose(0, 1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", default="float32,bfloat16")
    ap.add_argument("--tokens", type=int, default=2048, help="tokens per window (default 2048)")
    ap.add_argument("--windows", type=int, default=1,
                    help="score this many consecutive windows of the text, each its own sequence "
                         "(more positions: a smaller standard error; default 1, what the engine bench scores)")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--model", default=None, help="HF directory (default: the converted SmolLM2)")
    ap.add_argument("--against", default=None,
                    help="also compare every variant with this one, paired position by position (its "
                         "standard error is that of the difference, smaller than either's against bf16)")
    args = ap.parse_args(argv)

    from transformers import AttentionInterface, AutoModelForCausalLM, AutoTokenizer

    from s4kv import models

    path = args.model or str(models.smollm2())
    tok = AutoTokenizer.from_pretrained(path)
    ids = tok.encode((ROOT / "s4kv" / "data" / "eval_text.txt").read_text())
    if len(ids) < args.windows * args.tokens:
        raise SystemExit(f"the text has {len(ids)} tokens, fewer than {args.windows} x {args.tokens}")
    xs = [torch.tensor([ids[i * args.tokens:(i + 1) * args.tokens]]) for i in range(args.windows)]
    current: dict = {"var": None}

    def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kw):
        var = current["var"]
        scale = scaling if scaling is not None else 1.0 / math.sqrt(query.shape[-1])
        if var is None:
            hq, hkv = query.shape[1], key.shape[1]
            kk = key.repeat_interleave(hq // hkv, 1)
            vv = value.repeat_interleave(hq // hkv, 1)
            o = torch.nn.functional.scaled_dot_product_attention(
                query.float(), kk.float(), vv.float(), is_causal=True, scale=scale)
            return o.transpose(1, 2).to(query.dtype), None
        if var.get("exact64"):
            hq, hkv = query.shape[1], key.shape[1]
            o = torch.nn.functional.scaled_dot_product_attention(
                query.double(), key.repeat_interleave(hq // hkv, 1).double(),
                value.repeat_interleave(hq // hkv, 1).double(), is_causal=True, scale=scale)
            return o.transpose(1, 2).to(query.dtype), None
        o = kivi_sdpa(query[0], key[0], value[0], scale, layer_variant(var, module.layer_idx))
        return o[None].to(query.dtype), None

    AttentionInterface.register("s4kv_sim", attention)
    names = args.variants.split(",")
    print(f"# {args.windows} window(s) of {args.tokens} tokens of eval_text.txt, {path}")
    print("| model dtype | variant | bytes/token/head (d128) | Δ perplexity | SE | top-1 agreement | SE |")
    print("|---|---|---|---|---|---|---|")
    for dt in args.dtype.split(","):
        model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=getattr(torch, dt),
                                                     attn_implementation="s4kv_sim").eval()

        def score(model=model, with_margins=False):
            # windows are concatenated per position; a window's 2047 positions are 15 whole
            # 128-position segments and a tail, so batch means mostly stay inside one window
            lps, tops, margins = [], [], []
            for x in xs:
                with torch.no_grad():
                    logits = model(x).logits[0, :-1].float()
                lp = torch.log_softmax(logits, -1)
                tgt = x[0, 1:]
                lps += lp.gather(-1, tgt[:, None])[:, 0].tolist()
                tops += lp.argmax(-1).tolist()
                if with_margins:  # the reference's: where its top two tokens nearly tie
                    top2 = lp.topk(2, dim=-1).values
                    margins += (top2[:, 0] - top2[:, 1]).tolist()
            return lps, tops, margins

        current["var"] = None
        ref_lp, ref_top, ref_margin = score(with_margins=True)
        close = [m < NEAR_TIE for m in ref_margin]
        print(f"<!-- reference: {sum(close)} of {len(close)} positions ({sum(close) / len(close):.1%}) have their "
              f"top two tokens within {NEAR_TIE} nats -->")
        scored = {}
        for name in names:
            var = VARIANTS[name]
            t0 = time.time()
            current["var"] = var
            lp, top, _ = score()
            d, dse = metrics.ppl_delta_with_error(lp, ref_lp)
            a, ase = metrics.top1_agreement_with_error(top, ref_top)
            exact = var is None or var.get("exact64") or (var.get("kq", 1) == 0 and var.get("vq", 1) == 0)
            bpt = "-" if exact else f"{bytes_per_token(var):g}"
            miss = [c for t, r, c in zip(top, ref_top, close) if t != r]
            print(f"| {dt} | {name} | {bpt} | {d:+.3f}% | {dse:.3f}% | {a:.4f} | {ase:.4f} |"
                  f"  <!-- {time.time() - t0:.0f} s; {len(miss)} top-1 misses, {sum(miss)} of them where the "
                  f"reference's top two are within {NEAR_TIE} nats -->", flush=True)
            scored[name] = (lp, top)
        if args.against in scored:
            base_lp, base_top = scored[args.against]
            print(f"\n| model dtype | variant | Δ perplexity against {args.against} | SE (paired) | "
                  f"top-1 agreement with bf16, difference | SE (paired) |\n|---|---|---|---|---|---|")
            for name, (lp, top) in scored.items():
                if name == args.against:
                    continue
                d, dse = metrics.ppl_delta_with_error(lp, base_lp)
                m, mse = metrics.top1_agreement_difference_with_error(top, base_top, ref_top)
                print(f"| {dt} | {name} | {d:+.3f}% | {dse:.3f}% | {m:+.4f} | {mse:.4f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
