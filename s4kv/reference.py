"""Reference attention in plain PyTorch: the semantics every implementation must reproduce.

* :func:`dense_attention` is ordinary causal softmax attention in fp32 (no cache, no quantization).
* :func:`kivi_attention` is what an ``int4_kivi`` cache computes for one sequence: quantize every
  complete block exactly as the page format does (``s4kv.format``: rotated basis), apply the
  position rule (a query sees complete blocks quantized and the rest exact), attend. Scores of
  quantized keys use the rotated query; the part of the output that comes from pages is rotated
  back; exact tokens are used as they are.

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
    """Dequantized K/V (rotated basis, fp32) of every complete block: k, v [T, H, D] -> [nb * block_size, H, D]."""
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
    if quantize:
        kq, vq = quantized_prefix(k, v, block_size)
    else:
        nq = (tk // block_size) * block_size
        kq, vq = fmt.rotate(k[:nq]), fmt.rotate(v[:nq])
    nq = kq.shape[0]

    pos_q = torch.arange(q_start, q_start + tq)[:, None]
    pos_k = torch.arange(tk)[None, :]
    boundary = ((pos_q + 1) // block_size) * block_size  # first exact position for each query
    s_exact = torch.einsum("qhd,khd->hqk", q.float(), k.float().repeat_interleave(group, dim=1))
    s_quant = torch.einsum("qhd,khd->hqk", fmt.rotate(q), kq.repeat_interleave(group, dim=1))
    use_quant = pos_k[:, :nq] < boundary  # [Tq, nq]
    s = s_exact.clone()
    s[:, :, :nq] = torch.where(use_quant, s_quant, s_exact[:, :, :nq])
    s = (s * scale).masked_fill(pos_k > pos_q, float("-inf"))
    p = torch.softmax(s, dim=-1)
    p_quant = torch.where(use_quant, p[:, :, :nq], torch.zeros(()))
    p_exact = p.clone()
    p_exact[:, :, :nq] = torch.where(use_quant, torch.zeros(()), p[:, :, :nq])
    o_exact = torch.einsum("hqk,khd->qhd", p_exact, v.float().repeat_interleave(group, dim=1))
    o_quant = torch.einsum("hqk,khd->qhd", p_quant, vq.repeat_interleave(group, dim=1))
    return o_exact + fmt.unrotate(o_quant)
