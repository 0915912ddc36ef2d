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
  basis, and so do the window's 8-bit rows (below), so a query meets everything rotated and
  the output is rotated back once.
* Keys: per-channel asymmetric int4 (KIVI). For each (block of BLOCK_SIZE tokens, kv head,
  channel): min and scale over the block's tokens, ``k ~ code * scale + min``, code in 0..15.
* Values: per-token symmetric int4, one group per (token, kv head) spanning the whole head_dim:
  ``v ~ (code - 7.5) * scale``. In the rotated basis values are close to zero-mean, so a
  symmetric grid loses nothing measurable and halves the scale bytes.
* The first token of every block keeps its key "exact": its 8-bit window row's key, stored in 16
  bits and not quantized further (the page's "first key"), left out of the block's per-channel key
  statistics. For block 0 that token is the attention sink, which nearly every
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
* Blocks are quantized two at a time, as a *unit* of UNIT = 2 * BLOCK_SIZE tokens, when the
  unit's last token arrives. Until then the unit's tokens (the request's *window*, 0..255 of its
  most recent tokens) are kept per token in 8 bits: keys and values each as codes 0..255 with one
  fp16 scale over the head, ``x ~ (code - 127.5) * scale`` in the rotated basis (the first value's
  rule), inside the request's own pages (see "The window" below). A unit's blocks are quantized
  from those 8-bit rows, so every path that reads a token (window or page) starts from the same
  8-bit copy of it. Per-channel key statistics always cover a whole block, the most recent 128 to
  255 tokens of a long request are 8-bit, and vLLM's allocator owns and counts every byte a
  request holds. (Why units and not one more block read off the pages: a window that reached
  into the blocks of a prefix-cache hit would need their 8-bit rows, which only the request that
  computed them held; a unit boundary leaves nothing off the pages, and prefix hits are cut at
  unit boundaries, s4kv.backend.spec. docs/format-variants.md §11.)

Which tokens a query sees quantized (the position rule)
-------------------------------------------------------
A query at position p sees the tokens of every *complete unit* from pages, where complete means
that the unit's last token is at or before p; the tokens after the last complete unit, its own
included, in 8 bits. In other words: positions j < floor((p + 1) / UNIT) * UNIT are read from pages,
the rest from the window's 8-bit rows. The rule depends only on positions, and every token's 8-bit
row and every page depend only on that token's (block's) K/V, so chunked prefill, prefix-cache hits
cut at unit boundaries, preemption and plain decode all compute the same function.

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

The window (one request's tokens after its last complete unit, up to UNIT - 1)
---------------------------------------------------------------------------------
A request of L tokens holds pages 0 .. (L - 1) // BLOCK_SIZE + WINDOW_PAGES - 1 (``blocks_held``;
its scheduler asks vLLM for them, s4kv.backend.spec). Its window unit is u = L // UNIT; the window
lives in pages 2u .. 2u + WINDOW_PAGES - 1 (the unit's own two pages and the two after them), in
the same kv-head region as that head's pages, as WINDOW_SLOTS rows per region. Row r (token
2u * BLOCK_SIZE + r) belongs to block j = r // BLOCK_SIZE of the unit and lives in page
2u + j + UNIT_BLOCKS * ((r % BLOCK_SIZE) // WINDOW_SLOTS), slot r % WINDOW_SLOTS: block 2u's rows
in pages 2u and 2u + 2, block 2u + 1's in pages 2u + 1 and 2u + 3 (``window_index``), laid out as

    [ key codes   : WINDOW_SLOTS * D bytes ]  slot-major: byte (s, i) at s * D + i, code 0..255
    [ value codes : WINDOW_SLOTS * D bytes ]
    [ key scale   : WINDOW_SLOTS fp16      ]
    [ value scale : WINDOW_SLOTS fp16      ]

(16,640 of a region's 17,408 bytes at head_dim 128; 8,448 of 8,832 at 64). When the unit
completes, its two pages are quantized from its rows: block 2u's from rows 0..127 (pages 2u and
2u + 2), written to page 2u, and block 2u + 1's from rows 128..255 (pages 2u + 1 and 2u + 3),
written to page 2u + 1. Each block's page holds only that block's own rows, so the two are stored
at once (each reads its rows before it writes its page); a step that also completes the next unit
writes pages 2u + 2 and 2u + 3 over the old rows, so those two wait for blocks 2u and 2u + 1
(s4kv.kernels.store). The next window starts in page 2u + 2. (At a unit boundary the window is empty
and the request holds pages 2u + 2 and 2u + 3, not yet 2u + 4: the next token brings it.) Window
pages are never shared: prefix caching shares complete units only (s4kv.backend.spec caches a
block only once its unit is complete and cuts hits at unit boundaries), and a request always
(re)starts at a unit boundary, so the rows it reads from its window are always ones it wrote. A
running request holds 3 pages more than a 16-bit cache would leave partly empty, and only while it
runs.

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
  window rows (keys and values): the token 0 rule, codes 0..255, on the rotated token
  with inv = 1 / s (fp32), or 0 when s == 0. Rounding the scale up and the min down guarantees
  |x - dequant(x)| <= s / 2 for every element.
* fp16_up(x) / fp16_down(x): the nearest fp16 at or above / at or below x.
* A unit's pages are quantized from its window rows dequantized in fp32 ((code - 127.5) * scale),
  the exact first key of a block being its first row's dequantized key (16-bit).
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
UNIT_BLOCKS = 2  # blocks quantized together
UNIT = UNIT_BLOCKS * BLOCK_SIZE  # tokens of a unit: the window holds 0..UNIT-1 of them
WINDOW_LEVELS = FIRST_VALUE_LEVELS  # window rows: codes 0..255
WINDOW_SLOTS = 64  # window rows per (page, kv head) region
WINDOW_PAGES = UNIT // WINDOW_SLOTS  # pages that hold a window: its unit's two and the two after them
assert BLOCK_SIZE % WINDOW_SLOTS == 0  # a block's rows fill whole regions (window_page)


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


@dataclass(frozen=True)
class WindowLayout:
    """Byte offsets of the window rows inside one (page, kv head) region (s4kv.format, "The window")."""

    head_size: int

    def __post_init__(self):
        if self.nbytes > PageLayout(self.head_size).region_bytes:
            raise ValueError("window rows do not fit a region")

    @property
    def k_codes(self) -> int:
        return 0

    @property
    def v_codes(self) -> int:
        return WINDOW_SLOTS * self.head_size

    @property
    def k_scale(self) -> int:
        return 2 * WINDOW_SLOTS * self.head_size

    @property
    def v_scale(self) -> int:
        return self.k_scale + 2 * WINDOW_SLOTS

    @property
    def nbytes(self) -> int:
        return self.v_scale + 2 * WINDOW_SLOTS


@cache
def kernel_layout(head_size: int) -> str:
    """Every constant of this format a kernel needs for a head size, as one string (built once per
    head size): a kernel takes it as a single constexpr argument and reads each constant with
    layout_value at compile time. One argument instead of a dozen because Triton's launch path
    costs host time per constexpr argument (about 0.6 µs each, in every eager launch:
    tools/launch_host_time.py), and the string, being the argument, keys Triton's kernel cache on
    these values."""
    page, window = PageLayout(head_size), WindowLayout(head_size)
    values = {"head_size": head_size, "half": head_size // 2, "block_size": BLOCK_SIZE, "unit": UNIT,
              "window_pages": WINDOW_PAGES, "v_codes": page.v_codes, "v_scale": page.v_scale,
              "k_scale": page.k_scale, "k_min": page.k_min, "first_key": page.first_key,
              "slots": WINDOW_SLOTS, "w_v_codes": window.v_codes, "w_k_scale": window.k_scale,
              "w_v_scale": window.v_scale}
    return ";".join(f"{name}={value}" for name, value in values.items())


def layout_value(layout: str, name: str) -> int:
    """One constant of a kernel_layout string."""
    for item in layout.split(";"):
        key, _, value = item.partition("=")
        if key == name:
            return int(value)
    raise KeyError(f"{name!r} is not in the kernel layout {layout!r}")


def pages_boundary(pos):
    """First position a query at `pos` reads from its window (the position rule): every position
    below it is read from pages. Works on ints and tensors."""
    return (pos + 1) // UNIT * UNIT


def blocks_held(num_tokens: int, head_size: int = 128, itemsize: int = 2) -> int:
    """Pages a request of `num_tokens` tokens holds: its blocks and its window's pages.

    Its last token's block and the WINDOW_PAGES - 1 pages after it: the window of unit u lives in
    pages 2u .. 2u + WINDOW_PAGES - 1 and its last token is in block 2u or 2u + 1. At a unit
    boundary (num_tokens a multiple of UNIT) the window is empty, and the token after it takes one
    page more. So the count never falls as a request grows, and its largest value up to
    max_model_len is this function at max_model_len, with no assumption about how the scheduler
    caps a request's length. (`head_size`, `itemsize`: every supported shape holds the same.)"""
    if num_tokens <= 0:
        return 0
    return (num_tokens - 1) // BLOCK_SIZE + WINDOW_PAGES


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


def rotate(x: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """x [..., D] -> x @ R in `dtype` (the +-1 product accumulated in float64, scaled, rounded to
    fp32 once by default: a token's rotated row does not depend on the batch it is computed in,
    whose shape picks how a fp32 matmul orders its sums)."""
    d = x.shape[-1]
    return ((x.double() @ rotation_pm1(d, x.device, torch.float64)) * (1.0 / math.sqrt(d))).to(dtype)


def unrotate(y: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """y [..., D] (rotated basis) -> y @ R.T, computed in `dtype`."""
    d = y.shape[-1]
    return (y.to(dtype) @ rotation_pm1(d, y.device, dtype).T) * (1.0 / math.sqrt(d))


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
    """Full blocks as the format stores them: k, v [..., BLOCK_SIZE, D] (exact, model dtype), through
    their 8-bit window rows -> regions uint8 [..., region_bytes]."""
    return encode_window_blocks(window_round_trip(k), window_round_trip(v), k.dtype)


def encode_window_blocks(k: torch.Tensor, v: torch.Tensor, model_dtype: torch.dtype) -> torch.Tensor:
    """Quantize full blocks from their dequantized window rows: k, v [..., BLOCK_SIZE, D] (fp32,
    rotated basis) -> regions uint8 [..., region_bytes]."""
    *lead, t, d = k.shape
    lay = PageLayout(d, t)
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
    """What a full block reads back as from its page, in the rotated basis:
    k, v [..., T, D] (exact, model dtype) -> fp32."""
    return decode_blocks(encode_blocks(k, v), k.shape[-1], k.dtype, k.shape[-2])


# ---------------------------------------------------------------------------------------------
# The window: 8-bit rows inside the pages


def quantize_window(x: torch.Tensor):
    """x [..., D] (exact, model dtype) -> the token's window row: codes uint8 [..., D] and scale fp32
    [...] of its rotated copy."""
    return quantize_values(rotate(x), WINDOW_LEVELS)


def dequantize_window(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Window rows -> fp32 [..., D] in the rotated basis."""
    return dequantize_values(codes, scale, WINDOW_LEVELS)


def window_round_trip(x: torch.Tensor) -> torch.Tensor:
    """What a token reads back as from the window: x [..., D] exact -> fp32, rotated basis."""
    return dequantize_window(*quantize_window(x))


def _window_views(regions: torch.Tensor):
    """regions uint8 [num_blocks, Hkv, region_bytes] -> views (writes go through to the pages) of the
    window rows every region can hold: key codes, value codes [num_blocks, Hkv, WINDOW_SLOTS, D]
    uint8, key scales, value scales [num_blocks, Hkv, WINDOW_SLOTS] fp16."""
    nb, hkv, nbytes = regions.shape
    d = next(h for h in SUPPORTED_HEAD_SIZES if PageLayout(h).region_bytes == nbytes)
    lay = WindowLayout(d)
    n = WINDOW_SLOTS

    def codes(off):
        return regions[..., off:off + n * d].view(nb, hkv, n, d)

    def scales(off):
        return regions[..., off:off + 2 * n].view(SCALE_DTYPE)

    return codes(lay.k_codes), codes(lay.v_codes), scales(lay.k_scale), scales(lay.v_scale)


def window_page(rows):
    """Which of its window's pages (0..WINDOW_PAGES-1) window row `rows` lives in (int or int tensor):
    block j's rows (j = row // BLOCK_SIZE) in pages j, j + UNIT_BLOCKS, ..., so that the page a
    block is stored into holds no other block's rows (see "The window")."""
    return rows // BLOCK_SIZE + UNIT_BLOCKS * (rows % BLOCK_SIZE // WINDOW_SLOTS)


def window_index(window_pages: torch.Tensor, rows: torch.Tensor):
    """(page id, slot) of window rows: window_pages [..., WINDOW_PAGES] (the block table entries
    2u .. 2u + WINDOW_PAGES - 1 of the window's unit u), rows [..., n] (0..UNIT-1, broadcast)."""
    j = window_page(rows)
    return torch.gather(window_pages, -1, j.expand(*window_pages.shape[:-1], j.shape[-1])), rows % WINDOW_SLOTS


def read_window(regions: torch.Tensor, window_pages: torch.Tensor, n: int):
    """The first n window rows of requests, dequantized: window_pages [R, WINDOW_PAGES] (int64) ->
    k, v fp32 [R, Hkv, n, D] in the rotated basis. Rows a request has not written hold whatever
    bytes its pages hold (NaN included): callers mask them."""
    kc, vc, ks, vs = _window_views(regions)
    page, slot = window_index(window_pages, torch.arange(n, device=window_pages.device)[None, :])
    out = []
    for c, s in ((kc, ks), (vc, vs)):  # [R, n, Hkv, ...] -> [R, Hkv, n, ...]
        out.append(dequantize_window(c[page, :, slot].transpose(1, 2), s[page, :, slot].transpose(1, 2).float()))
    return out[0], out[1]


def write_window(regions: torch.Tensor, window_pages: torch.Tensor, pos: torch.Tensor, k_codes: torch.Tensor,
                 k_scale: torch.Tensor, v_codes: torch.Tensor, v_scale: torch.Tensor) -> None:
    """Write window rows: window_pages [R, WINDOW_PAGES], pos [R, n] (row index in the window),
    codes [R, n, Hkv, D] uint8, scales [R, n, Hkv] (quantize_window's)."""
    kc, vc, ks, vs = _window_views(regions)
    page, slot = window_index(window_pages, pos)
    kc[page, :, slot] = k_codes
    vc[page, :, slot] = v_codes
    ks[page, :, slot] = k_scale.to(SCALE_DTYPE)
    vs[page, :, slot] = v_scale.to(SCALE_DTYPE)
