"""Paged, causal, variable-length attention over 16-bit pages: vLLM's bundled FlashAttention on CUDA
(the same kernel and version that vLLM's `auto` cache runs: FA3 on sm90, FA2 on sm80-sm89), and
the same function in PyTorch where FlashAttention cannot run (CPU tests, Triton's interpreter).

Semantics (FlashAttention's): sequence i has the queries q[cu_seqlens_q[i]:cu_seqlens_q[i+1]] and
the keys 0..seqused_k[i]-1 listed page by page in block_table[i]; the causal mask is aligned at the
bottom right, so query j of Lq sees keys 0..j + (Lk - Lq). K/V pages are [pages, page_size, Hkv, D];
GQA maps query head h to kv head h // (Hq // Hkv).
"""

from __future__ import annotations

import functools

import torch

from s4kv.kernels import interpreted


def flash_attention_available() -> str | None:
    """None when vLLM's FlashAttention runs on this machine's GPU, else the reason it does not."""
    try:
        from vllm.v1.attention.backends.fa_utils import get_flash_attn_version
        from vllm.vllm_flash_attn import flash_attn_varlen_func  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any import failure is a reason
        return f"vLLM's FlashAttention cannot be imported: {type(e).__name__}: {e}"
    if get_flash_attn_version() is None:
        return "vLLM's FlashAttention does not support this GPU"
    return None


@functools.cache
def _fa_version(head_size: int) -> int:
    from vllm.v1.attention.backends.fa_utils import get_flash_attn_version

    return get_flash_attn_version(head_size=head_size)


def varlen_paged_attention(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor,
                           cu_seqlens_q: torch.Tensor, max_seqlen_q: int, seqused_k: torch.Tensor,
                           max_seqlen_k: int, block_table: torch.Tensor, softmax_scale: float,
                           out: torch.Tensor, host: tuple | None = None) -> None:
    """out = attention of q (see the module docstring). `host`: (cu_seqlens_q, seqused_k,
    block_table) as host arrays, used where the PyTorch version runs (it loops on the host)."""
    if q.is_cuda and not interpreted():
        from vllm.vllm_flash_attn import flash_attn_varlen_func

        direct = out.dtype == q.dtype and out.is_contiguous()
        res = flash_attn_varlen_func(q=q, k=k_pages, v=v_pages, out=out if direct else None,
                                     cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q, seqused_k=seqused_k,
                                     max_seqlen_k=max_seqlen_k, softmax_scale=softmax_scale, causal=True,
                                     block_table=block_table, fa_version=_fa_version(q.shape[-1]))
        if not direct:
            out.copy_(res)
        return
    cu, used, table = host if host is not None else (cu_seqlens_q.tolist(), seqused_k.tolist(), block_table.tolist())
    _torch_varlen_paged(q, k_pages, v_pages, cu, used, table, softmax_scale, out)


def _torch_varlen_paged(q, k_pages, v_pages, cu, used, table, scale, out) -> None:
    """The same in fp32 PyTorch, one sequence at a time."""
    page = k_pages.shape[1]
    hq, hkv = q.shape[1], k_pages.shape[2]
    group = hq // hkv
    for i in range(len(used)):
        s, e, lk = int(cu[i]), int(cu[i + 1]), int(used[i])
        if e == s:
            continue
        pages = torch.as_tensor([int(p) for p in table[i][:-(-lk // page)]], device=k_pages.device, dtype=torch.long)
        kk = k_pages[pages].flatten(0, 1)[:lk].float().repeat_interleave(group, dim=1)  # [Lk, Hq, D]
        vv = v_pages[pages].flatten(0, 1)[:lk].float().repeat_interleave(group, dim=1)
        qq = q[s:e].float()
        scores = torch.einsum("qhd,khd->hqk", qq, kk) * scale
        lq = e - s
        visible = torch.arange(lk)[None, :] <= torch.arange(lq)[:, None] + (lk - lq)
        scores = scores.masked_fill(~visible.to(scores.device), float("-inf"))
        out[s:e] = torch.einsum("hqk,khd->qhd", torch.softmax(scores, dim=-1), vv).to(out.dtype)
