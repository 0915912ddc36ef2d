"""The int4_kivi KV-cache format: the single source of truth.

Everything that knows how a page is laid out, how a value becomes a 4-bit code and back, and how
many bytes a token costs lives here. Kernels (Triton, CUDA) and the CPU backend read these
constants and mirror these functions; the functions below are the PyTorch reference that every
implementation is tested against.

The scheme (KIVI, in a rotated basis)
-------------------------------------
* Rotation. Keys and values are multiplied by one fixed orthogonal matrix R (a Walsh-Hadamard
  matrix with a fixed sign pattern, divided by sqrt(head_size)) before they are quantized into a
  page, and queries are rotated the same way before they meet a page; the part of the attention
  output that comes from pages is rotated back. q.k and p@V are unchanged (R R^T = I), but outlier
  channels are spread over all channels, so 4-bit codes lose far less. Pages live in the rotated
  basis; exact tokens (the tail and this step's tokens) are used as they are, bit-identical
  to what a bf16/fp16 cache would hold.
* Keys: per-channel asymmetric int4 (KIVI). For each (block of BLOCK_SIZE tokens, kv head,
  channel): min and scale over the block's tokens, ``k ~ code * scale + min``, code in 0..15.
* Values: per-token symmetric int4, one group per (token, kv head) spanning the whole head_dim:
  ``v ~ (code - 7.5) * scale``. In the rotated basis values are close to zero-mean, so a
  symmetric grid loses nothing measurable and halves the scale bytes.
* The first token of every block keeps its key exact (16-bit) and is left out of the block's
  per-channel key statistics. For block 0 that token is the attention sink, which nearly every
  query attends to: quantizing its key costs more than all other tokens together, and its outlier
  channels would also widen every channel's range for the rest of the block.
* The first token of every block keeps its value in 8 bits (symmetric over the head,
  ``v ~ (code - 127.5) * scale``, code in 0..255): the low nibbles of its codes sit where its 4-bit
  value codes would, the high nibbles in its key code row (unused: the key is exact), so it costs
  no byte, and a kernel that reads the row as 4-bit codes gets the low-nibble part of the value
  and adds ``16 * (high - 7.5) * scale`` (``code - 127.5 = (low - 7.5) + 16 * (high - 7.5)``). The sink's value is read with
  the weight of the sink, so its 4-bit error mattered more than any other token's: on SmolLM2
  (bf16, 3 x 2,048 tokens, tools/format_sim.py) it moved perplexity +0.69% -> +0.33% and
  top-1 agreement 0.961 -> 0.964 against bf16 (docs/format-variants.md).
* Scales and mins are fp16 and live inside the page, so vLLM's allocator counts every byte.
* A block is quantized only when it is full. Until then its tokens (the request's *tail*) stay
  exact, in the model dtype, inside the request's own pages: the incomplete block's page and the
  TAIL_BLOCKS - 1 pages after it (see "The exact tail" below), so per-channel key statistics
  always cover a whole block, the most recent tokens are exact, and vLLM's allocator owns and
  counts every byte a request holds.

Which tokens a query sees quantized (the position rule)
-------------------------------------------------------
A query at position p sees the tokens of every *complete* block quantized, where complete means
that the block's last token is at or before p; the tokens after the last complete block are exact.
In other words: positions j < floor((p + 1) / BLOCK_SIZE) * BLOCK_SIZE are read from pages, the rest
from exact K/V. The rule depends only on positions, so chunked prefill, prefix-cache hits, preemption
and plain decode all compute the same function.

Page layout (one (block, kv head) region of BLOCK_SIZE * bytes_per_token bytes)
------------------------------------------------------------------------------
    [ key codes   : BLOCK_SIZE * D/2 bytes ]  token-major: byte (t, i) at t * D/2 + i
    [ value codes : BLOCK_SIZE * D/2 bytes ]  channel-major: byte (t, i) at i * BLOCK_SIZE + t
                                              Byte (t, i) holds the code of channel i of token t
                                              in its low nibble and of channel i + D/2 in its high
                                              nibble (so unpacking yields the two halves of the
                                              head without interleaving). Each code region is
                                              ordered along the axis its attention product sums
                                              over (channels for q.k, tokens for p@V), so a
                                              thread's share of a dot operand is contiguous bytes.
                                              Token 0's value codes are 8-bit: value byte (0, i)
                                              holds their low nibbles, key byte (0, i) their high
                                              nibbles, each packed like 4-bit codes (channel i
                                              low, channel i + D/2 high).
    [ value scale : BLOCK_SIZE fp16        ]  one per token (token 0: the scale of its 8-bit codes)
    [ key scale   : D fp16                 ]  one per channel
    [ key min     : D fp16                 ]  one per channel
    [ first key   : D x 16-bit             ]  exact key of the block's first token: the model
                                              dtype for fp16/bf16 models, bf16 for fp32 models

The exact tail (one request's tokens after its last complete block, up to BLOCK_SIZE - 1)
------------------------------------------------------------------------------------------
A request of L tokens holds pages 0 .. (L - 1) // BLOCK_SIZE + TAIL_BLOCKS - 1 (``blocks_held``; its
scheduler asks vLLM for them, s4kv.backend.spec). Its tail block is b = L // BLOCK_SIZE; the tail
lives in the regions of pages b .. b + TAIL_BLOCKS - 1, in the same kv-head region as that head's
pages, as 2 * BLOCK_SIZE rows of D model-dtype elements: rows 0..BLOCK_SIZE-1 are the keys of tail
tokens 0..BLOCK_SIZE-1, rows BLOCK_SIZE.. their values. (At a block boundary the tail is empty and
the request holds pages b .. b + TAIL_BLOCKS - 2 beyond its blocks, the rest of the completed
block's tail: the next token brings the last page.) A region holds
R = region_bytes // (D * itemsize) whole rows (68 at head_dim 128, 69 at 64, 16-bit models), and
row r sits in page b + r // R at byte (r % R) * D * itemsize of the region. When block b completes,
its page is quantized over the first rows of its own tail (the store reads the whole tail before it
writes), and the next tail starts in page b + 1. Tail pages are never shared: prefix caching shares
complete blocks only, and a request always (re)starts at a block boundary (prefix-cache hits are
whole blocks, a resumed request recomputes from its last cached block), so the tokens it reads from
its tail are always ones it wrote. 16-bit models need TAIL_BLOCKS = 4 (256 rows in 4 x 68 or
4 x 69): a running request holds 3 pages more than a 16-bit cache would leave partly empty, and
only while it runs.

Bytes per token per kv head: D + 2 + 6 * D / BLOCK_SIZE (K and V together).
    head_dim 128: 128 + 2 + 6 = 136 B  (bf16: 512 B, 3.76x)
    head_dim  64:  64 + 2 + 3 =  69 B  (bf16: 256 B, 3.71x)

Numerics, precisely (implementations must match)
------------------------------------------------
* Inputs are first clamped to the finite fp16 range (+-65504): larger values saturate.
* Any non-finite input (NaN, +-inf) poisons its quantization group: the group's scale is stored
  as NaN, so the whole group (a block-channel of keys, a token of values) dequantizes to NaN,
  just as a NaN in a bf16 cache would poison attention.
* Keys:   m = fp16_down(min);  s = fp16_up((max - m) / 15);  code = clamp(floor((k - m) * inv + 0.5), 0, 15)
          min and max over tokens 1..BLOCK_SIZE-1 of the block (token 0 is stored exact).
* Values: s = fp16_up(max|v| / 7.5);                         code = clamp(floor(v * inv + 8), 0, 15)
  token 0 of a block: s = fp16_up(max|v| / 127.5);           code = clamp(floor(v * inv + 128), 0, 255)
  with inv = 1 / s (fp32), or 0 when s == 0. Rounding the scale up and the min down guarantees
  |x - dequant(x)| <= s / 2 for every element.
* fp16_up(x) / fp16_down(x): the nearest fp16 at or above / at or below x.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from functools import cache

import torch

KV_CACHE_DTYPE = "int4_kivi"
BLOCK_SIZE = 128
SUPPORTED_HEAD_SIZES = (64, 128)
CODE_LEVELS = 15  # codes 0..15
FIRST_VALUE_LEVELS = 255  # the first token's value: codes 0..255
FP16_MAX = 65504.0
SCALE_DTYPE = torch.float16


@dataclass(frozen=True)
class PageLayout:
    """Byte offsets inside one (block, kv head) region of a page."""

    head_size: int
    block_size: int = BLOCK_SIZE

    def __post_init__(self):
        if self.head_size not in SUPPORTED_HEAD_SIZES:
            raise ValueError(f"{KV_CACHE_DTYPE} supports head_dim {SUPPORTED_HEAD_SIZES}, not {self.head_size}")
        if (6 * self.head_size) % self.block_size:
            raise ValueError("key scales must amortize to whole bytes per token")

    @property
    def code_bytes_per_token(self) -> int:
        return self.head_size // 2

    @property
    def k_codes(self) -> int:
        return 0

    @property
    def v_codes(self) -> int:
        return self.block_size * self.code_bytes_per_token

    @property
    def v_scale(self) -> int:
        return 2 * self.block_size * self.code_bytes_per_token

    @property
    def k_scale(self) -> int:
        return self.v_scale + 2 * self.block_size

    @property
    def k_min(self) -> int:
        return self.k_scale + 2 * self.head_size

    @property
    def first_key(self) -> int:
        return self.k_min + 2 * self.head_size

    @property
    def region_bytes(self) -> int:
        """Bytes of one (block, kv head) region."""
        return self.first_key + 2 * self.head_size

    @property
    def bytes_per_token(self) -> int:
        """Bytes per token per kv head, K and V together (what vLLM sizes pages with)."""
        assert self.region_bytes % self.block_size == 0
        return self.region_bytes // self.block_size


def bytes_per_token_per_head(head_size: int) -> int:
    return PageLayout(head_size).bytes_per_token


def page_size_bytes(num_kv_heads: int, head_size: int, block_size: int = BLOCK_SIZE) -> int:
    """Bytes of one page (one block of every kv head of one layer)."""
    return num_kv_heads * PageLayout(head_size, block_size).region_bytes


def tail_rows_per_region(head_size: int, itemsize: int = 2) -> int:
    """Exact tail rows (D elements of `itemsize` bytes) that fit in one (block, kv head) region."""
    return PageLayout(head_size).region_bytes // (head_size * itemsize)


def tail_blocks(head_size: int, itemsize: int = 2) -> int:
    """Pages that hold a request's exact tail: its incomplete block's page and the ones after it."""
    return -(-2 * BLOCK_SIZE // tail_rows_per_region(head_size, itemsize))


TAIL_BLOCKS = tail_blocks(128)  # 16-bit models, every supported head size
assert all(tail_blocks(d) == TAIL_BLOCKS for d in SUPPORTED_HEAD_SIZES)


def blocks_held(num_tokens: int, head_size: int = 128, itemsize: int = 2) -> int:
    """Pages a request of `num_tokens` tokens holds: its complete blocks and its tail's pages.

    At a block boundary (num_tokens a multiple of BLOCK_SIZE) its tail is empty: it holds the pages
    of the block that just completed and of that block's tail (the store read it there), not yet
    the next tail's; the token after it takes one page more. So the count never falls as a request
    grows, and its largest value up to max_model_len is this function at max_model_len, with no
    assumption about how the scheduler caps a request's length."""
    if num_tokens <= 0:
        return 0
    return (num_tokens - 1) // BLOCK_SIZE + tail_blocks(head_size, itemsize)


def density_vs(head_size: int, dtype_bytes: int = 2) -> float:
    """How many times more tokens fit than with a cache of `dtype_bytes` per element."""
    return 2 * head_size * dtype_bytes / bytes_per_token_per_head(head_size)


# ---------------------------------------------------------------------------------------------
# Rotation


def _sign_pattern(n: int) -> list[float]:
    # Fixed, platform-independent signs (no RNG whose stream could change between torch versions).
    digest = b""
    counter = 0
    while len(digest) * 8 < n:
        digest += hashlib.sha256(f"s4kv-rotation-{n}-{counter}".encode()).digest()
        counter += 1
    return [1.0 if (digest[i // 8] >> (i % 8)) & 1 else -1.0 for i in range(n)]


@cache
@cache
def _hadamard_pm1(n: int) -> torch.Tensor:
    if n & (n - 1):
        raise ValueError(f"rotation needs a power-of-two head size, got {n}")
    h = torch.ones(1, 1, dtype=torch.float32)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    signs = torch.tensor(_sign_pattern(n), dtype=torch.float32)
    return signs[:, None] * h


def rotation_pm1(head_size: int, device=None, dtype=torch.float32) -> torch.Tensor:
    """R * sqrt(D): entries +-1, exact in every float dtype (kernels multiply with it and scale
    the fp32 result by 1/sqrt(D), so no rounding of R enters)."""
    return _hadamard_pm1(head_size).to(device=device, dtype=dtype)


def rotation(head_size: int, device=None, dtype=torch.float32) -> torch.Tensor:
    """The orthogonal matrix R [D, D]: x_rot = x @ R, x = x_rot @ R.T."""
    return (rotation_pm1(head_size) / math.sqrt(head_size)).to(device=device, dtype=dtype)


def rotate(x: torch.Tensor) -> torch.Tensor:
    """x [..., D] -> x @ R in fp32 (the +-1 product accumulated in fp32, then scaled)."""
    d = x.shape[-1]
    return (x.float() @ rotation_pm1(d, x.device)) * (1.0 / math.sqrt(d))


def unrotate(y: torch.Tensor) -> torch.Tensor:
    """y [..., D] (rotated basis, fp32) -> y @ R.T."""
    d = y.shape[-1]
    return (y.float() @ rotation_pm1(d, y.device).T) * (1.0 / math.sqrt(d))


# ---------------------------------------------------------------------------------------------
# Scalar encoding


def fp16_up(x: torch.Tensor) -> torch.Tensor:
    """Nearest fp16 value >= x (as fp32). NaN stays NaN."""
    h = x.to(torch.float16)
    up = torch.nextafter(h, torch.full_like(h, float("inf")))
    return torch.where(h.float() < x, up, h).float()


def fp16_down(x: torch.Tensor) -> torch.Tensor:
    """Nearest fp16 value <= x (as fp32). NaN stays NaN."""
    h = x.to(torch.float16)
    down = torch.nextafter(h, torch.full_like(h, float("-inf")))
    return torch.where(h.float() > x, down, h).float()


def _inverse(scale: torch.Tensor) -> torch.Tensor:
    return torch.where(scale > 0, 1.0 / torch.where(scale > 0, scale, 1.0), torch.zeros_like(scale))


def _saturate(x: torch.Tensor):
    x = x.float()
    nonfinite = ~torch.isfinite(x)
    return x.clamp(-FP16_MAX, FP16_MAX).nan_to_num(0.0), nonfinite


# ---------------------------------------------------------------------------------------------
# Keys: per-channel over the tokens of a block


def quantize_keys(k: torch.Tensor):
    """k [..., T, D] (one block of T tokens) -> codes uint8 [..., T, D], scale, min fp32 [..., D].

    Statistics cover tokens 1..T-1; token 0 is stored exact (its codes are clamped and unused).
    """
    x, bad = _saturate(k)
    stats, bad = x[..., 1:, :], bad[..., 1:, :]
    mn = fp16_down(stats.amin(dim=-2))
    scale = fp16_up((stats.amax(dim=-2) - mn) / CODE_LEVELS)
    scale = torch.where(bad.any(dim=-2), torch.full_like(scale, float("nan")), scale)
    inv = _inverse(scale).unsqueeze(-2)
    codes = torch.floor((x - mn.unsqueeze(-2)) * inv + 0.5).clamp(0, CODE_LEVELS)
    return codes.to(torch.uint8), scale, mn


def dequantize_keys(codes: torch.Tensor, scale: torch.Tensor, mn: torch.Tensor) -> torch.Tensor:
    return codes.float() * scale.unsqueeze(-2) + mn.unsqueeze(-2)


# ---------------------------------------------------------------------------------------------
# Values: per token, symmetric, one group per (token, head)


def quantize_values(v: torch.Tensor, levels: int = CODE_LEVELS):
    """v [..., D] -> codes uint8 [..., D], scale fp32 [...]: symmetric, codes 0..levels
    (CODE_LEVELS for pages, FIRST_VALUE_LEVELS for a block's first token)."""
    x, bad = _saturate(v)
    scale = fp16_up(x.abs().amax(dim=-1) / (levels / 2))
    scale = torch.where(bad.any(dim=-1), torch.full_like(scale, float("nan")), scale)
    codes = torch.floor(x * _inverse(scale).unsqueeze(-1) + (levels + 1) / 2).clamp(0, levels)
    return codes.to(torch.uint8), scale


def dequantize_values(codes: torch.Tensor, scale: torch.Tensor, levels: int = CODE_LEVELS) -> torch.Tensor:
    return (codes.float() - levels / 2) * scale.unsqueeze(-1)


# ---------------------------------------------------------------------------------------------
# Nibble packing: byte i = code[i] | code[i + D/2] << 4


def pack_codes(codes: torch.Tensor) -> torch.Tensor:
    half = codes.shape[-1] // 2
    return codes[..., :half] | (codes[..., half:] << 4)


def unpack_codes(packed: torch.Tensor) -> torch.Tensor:
    return torch.cat([packed & 0xF, packed >> 4], dim=-1)


# ---------------------------------------------------------------------------------------------
# Whole pages


def first_key_dtype(model_dtype: torch.dtype) -> torch.dtype:
    """16-bit dtype of the exact first key: the model's own, bf16 for fp32 models."""
    return model_dtype if model_dtype in (torch.float16, torch.bfloat16) else torch.bfloat16


def encode_blocks(k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Rotate and quantize full blocks. k, v [..., BLOCK_SIZE, D] (exact, model dtype) -> regions
    uint8 [..., region_bytes]."""
    *lead, t, d = k.shape
    lay = PageLayout(d, t)
    model_dtype = k.dtype
    k, v = rotate(k), rotate(v)
    kc, ks, km = quantize_keys(k)
    vc, vs = quantize_values(v)
    kp, vp = pack_codes(kc), pack_codes(vc)
    # token 0: its value's 8-bit codes, low nibbles in its value code row, high nibbles in its key
    # code row (the key is stored exact)
    fc, fs = quantize_values(v[..., 0, :], FIRST_VALUE_LEVELS)
    vp[..., 0, :], kp[..., 0, :] = pack_codes(fc & 0xF), pack_codes(fc >> 4)
    vs[..., 0] = fs
    n = len(lead)

    def as_bytes(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return x.to(dtype).contiguous().view(torch.uint8).flatten(n)

    parts = [
        kp.flatten(n),
        vp.transpose(-1, -2).flatten(n),  # channel-major
        as_bytes(vs, SCALE_DTYPE),
        as_bytes(ks, SCALE_DTYPE),
        as_bytes(km, SCALE_DTYPE),
        as_bytes(k[..., 0, :], first_key_dtype(model_dtype)),
    ]
    out = torch.cat(parts, dim=-1)
    assert out.shape[-1] == lay.region_bytes
    return out


def decode_blocks(regions: torch.Tensor, head_size: int, model_dtype: torch.dtype,
                  block_size: int = BLOCK_SIZE):
    """regions uint8 [..., region_bytes] -> k, v fp32 [..., block_size, head_size] (rotated basis)."""
    lay = PageLayout(head_size, block_size)
    *lead, nbytes = regions.shape
    assert nbytes == lay.region_bytes, (nbytes, lay.region_bytes)
    t, half = block_size, head_size // 2

    def f16(off, n):
        return regions[..., off:off + 2 * n].contiguous().view(SCALE_DTYPE).float()

    kp = regions[..., lay.k_codes:lay.v_codes].reshape(*lead, t, half)
    vp = regions[..., lay.v_codes:lay.v_scale].reshape(*lead, half, t).transpose(-1, -2)
    k = dequantize_keys(unpack_codes(kp), f16(lay.k_scale, head_size), f16(lay.k_min, head_size))
    first = regions[..., lay.first_key:lay.region_bytes].contiguous().view(first_key_dtype(model_dtype))
    k[..., 0, :] = first.float()
    vs = f16(lay.v_scale, t)
    v = dequantize_values(unpack_codes(vp), vs)
    first_codes = unpack_codes(vp[..., 0, :]) | (unpack_codes(kp[..., 0, :]) << 4)
    v[..., 0, :] = dequantize_values(first_codes, vs[..., 0], FIRST_VALUE_LEVELS)
    return k, v


def fake_quantize_blocks(k: torch.Tensor, v: torch.Tensor):
    """What a full block reads back as after encode/decode, in the rotated basis:
    k, v [..., T, D] (exact, model dtype) -> fp32."""
    return decode_blocks(encode_blocks(k, v), k.shape[-1], k.dtype, k.shape[-2])


# ---------------------------------------------------------------------------------------------
# The exact tail inside the pages


def _tail_rows(regions: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """regions uint8 [num_blocks, Hkv, region_bytes] -> a view [num_blocks, Hkv, R, D] of the tail
    rows each region can hold, in `dtype` (writes go through to the pages)."""
    nb, hkv, nbytes = regions.shape
    d = next(h for h in SUPPORTED_HEAD_SIZES if PageLayout(h).region_bytes == nbytes)
    rows = tail_rows_per_region(d, dtype.itemsize)
    return regions[..., :rows * d * dtype.itemsize].view(dtype).view(nb, hkv, rows, d)


def tail_index(tail_pages: torch.Tensor, rows_per_region: int, tail_rows: torch.Tensor):
    """(page id, row inside the region) of tail rows: tail_pages [..., TAIL_BLOCKS] (the block
    table entries b .. b + TAIL_BLOCKS - 1), tail_rows [..., n] (0..2*BLOCK_SIZE-1, broadcast)."""
    j = torch.div(tail_rows, rows_per_region, rounding_mode="floor")
    return torch.gather(tail_pages, -1, j.expand(*tail_pages.shape[:-1], j.shape[-1])), tail_rows % rows_per_region


def read_tail(regions: torch.Tensor, tail_pages: torch.Tensor, n: int, dtype: torch.dtype):
    """The first n exact tail tokens of requests: tail_pages [R, TAIL_BLOCKS] (int64, page ids
    b .. b + TAIL_BLOCKS - 1 of each request's tail block b) -> k, v [R, Hkv, n, D] in `dtype`."""
    rows = _tail_rows(regions, dtype)
    t = torch.arange(n, device=tail_pages.device)[None, :]
    out = []
    for base in (0, BLOCK_SIZE):  # keys, then values
        page, r = tail_index(tail_pages, rows.shape[2], base + t)
        out.append(rows[page, :, r].transpose(1, 2))  # [R, n, Hkv, D] -> [R, Hkv, n, D]
    return out[0], out[1]


def write_tail(regions: torch.Tensor, tail_pages: torch.Tensor, pos: torch.Tensor, k: torch.Tensor,
               v: torch.Tensor) -> None:
    """Write tail tokens: tail_pages [R, TAIL_BLOCKS], pos [R, n] (token index in the tail block),
    k, v [R, n, Hkv, D] (model dtype)."""
    rows = _tail_rows(regions, k.dtype)
    for base, x in ((0, k), (BLOCK_SIZE, v)):
        page, r = tail_index(tail_pages, rows.shape[2], base + pos)
        rows[page, :, r] = x
