"""Reference attention in plain PyTorch: the semantics every implementation must reproduce.

* :func:`dense_attention` is ordinary causal softmax attention in fp32 (no cache, no quantization).
* :func:`kivi_attention` is what an ``int4_kivi`` cache computes for one sequence: every token's
  8-bit window row and every complete unit's pages exactly as the format builds them
  (``s4kv.format``: rotated basis, pages quantized from the window rows), the position rule (a
  query sees complete units from pages and the rest, its own token included, from window rows),
  attend with the rotated query, rotate the output back.

Both take the full, exact K/V of the sequence, so they are independent of how a runtime pages,
chunks or batches it. The CPU backend and the Triton kernels are tested against
:func:`kivi_attention`; :func:`kivi_attention` itself is tested against :func:`dense_attention`.
"""

from __future__ import annotations

import torch

from s4kv import format as fmt


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                    q_start: int | None = None) -> torch.Tensor:
    """Causal attention in fp32.

    q [Tq, Hq, D] holds the queries of positions q_start .. q_start + Tq - 1 (default: the last
    Tq positions); k, v [Tk, Hkv, D] hold positions 0 .. Tk - 1. GQA: query head h reads kv head
    h // (Hq // Hkv). Returns [Tq, Hq, D] fp32.
    """
    tq, hq, _ = q.shape
    tk, hkv, _ = k.shape
    q_start = tk - tq if q_start is None else q_start
    group = hq // hkv
    kf = k.float().repeat_interleave(group, dim=1)
    vf = v.float().repeat_interleave(group, dim=1)
    s = torch.einsum("qhd,khd->hqk", q.float(), kf) * scale
    pos_q = torch.arange(q_start, q_start + tq)[:, None]
    pos_k = torch.arange(tk)[None, :]
    s = s.masked_fill(pos_k > pos_q, float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(s, dim=-1), vf)


def quantized_prefix(k: torch.Tensor, v: torch.Tensor, block_size: int = fmt.BLOCK_SIZE):
    """Pages of every complete block, dequantized (rotated basis, fp32): k, v [T, H, D] ->
    [nb * block_size, H, D]."""
    t, h, d = k.shape
    nb = t // block_size
    kb = k[: nb * block_size].reshape(nb, block_size, h, d).permute(0, 2, 1, 3)
    vb = v[: nb * block_size].reshape(nb, block_size, h, d).permute(0, 2, 1, 3)
    kq, vq = fmt.fake_quantize_blocks(kb, vb)  # [nb, H, K, D]
    return (kq.permute(0, 2, 1, 3).reshape(nb * block_size, h, d),
            vq.permute(0, 2, 1, 3).reshape(nb * block_size, h, d))


def kivi_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                   q_start: int | None = None, block_size: int = fmt.BLOCK_SIZE,
                   quantize: bool = True) -> torch.Tensor:
    """What ``int4_kivi`` computes. Same arguments and result as :func:`dense_attention`.

    ``k``/``v`` are the exact keys/values in the model dtype. ``quantize=False`` keeps the rotation
    and the position rule but skips quantization (it must then equal dense attention).
    """
    tq, hq, _d = q.shape
    tk, hkv, _ = k.shape
    q_start = tk - tq if q_start is None else q_start
    group = hq // hkv
    unit = fmt.UNIT_BLOCKS * block_size
    nq = (tk // unit) * unit  # positions in complete units: the only ones any query reads from pages
    if quantize:
        kw, vw = fmt.window_round_trip(k), fmt.window_round_trip(v)
        kq, vq = quantized_prefix(k[:nq], v[:nq], block_size)
    else:
        kw, vw = fmt.rotate(k), fmt.rotate(v)
        kq, vq = kw[:nq], vw[:nq]

    pos_q = torch.arange(q_start, q_start + tq)[:, None]
    pos_k = torch.arange(tk)[None, :]
    use_page = pos_k[:, :nq] < (pos_q + 1) // unit * unit  # [Tq, nq]
    qr = fmt.rotate(q)

    def mixed(page: torch.Tensor, window: torch.Tensor) -> torch.Tensor:
        """[Tq, Tk, Hkv, D]: for each query, the page copy where it reads pages, else the window's."""
        out = window[None].expand(tq, -1, -1, -1).clone()
        out[:, :nq] = torch.where(use_page[:, :, None, None], page[None], window[None, :nq])
        return out.repeat_interleave(group, dim=2)

    s = torch.einsum("qhd,qkhd->hqk", qr, mixed(kq, kw)) * scale
    s = s.masked_fill(pos_k > pos_q, float("-inf"))
    o = torch.einsum("hqk,qkhd->qhd", torch.softmax(s, dim=-1), mixed(vq, vw))
    return fmt.unrotate(o)
