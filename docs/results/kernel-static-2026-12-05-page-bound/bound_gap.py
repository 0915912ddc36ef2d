"""How loose is a page's score upper bound from its key statistics alone?
U = sum_c max(0, 15 * q_c * s_c) + q . mn  (rotated basis, 4-bit per-channel codes), against the
page's true max over its quantized keys (tokens 1..127; token 0 is exact and scored on its own).
Reports, in log2 units (scores scaled by sm_scale * log2 e): per page U - max, and per (query, head)
max_pages U - max over all pages (what an online softmax keyed on the bound would lose to underflow)."""
import math
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
from transformers import AttentionInterface, AutoModelForCausalLM, AutoTokenizer

from s4kv import format as fmt
from s4kv import models

path = str(models.smollm2())
tok = AutoTokenizer.from_pretrained(path)
ids = tok.encode((ROOT / "s4kv" / "data" / "eval_text.txt").read_text())[:2048]
page_gaps, row_gaps, first_gaps = [], [], []
LOG2E = 1.4426950408889634

def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kw):
    scale = scaling if scaling is not None else 1.0 / math.sqrt(query.shape[-1])
    q, k = query[0].float(), key[0].float()  # [H, T, D]
    hq, hkv, T, D = q.shape[0], k.shape[0], q.shape[1], q.shape[2]
    g = hq // hkv
    qr, kr = fmt.rotate(q), fmt.rotate(k)
    BS = fmt.BLOCK_SIZE
    nb = T // BS
    kb = kr[:, :nb * BS].reshape(hkv, nb, BS, D)
    codes, s, mn = fmt.quantize_keys(kb)  # [hkv, nb, BS, D], [hkv, nb, D]
    kq = fmt.dequantize_keys(codes, s, mn)  # [hkv, nb, BS, D]
    for p in range(3 * BS, T, 97):  # queries that see at least 2 complete pages before their window
        npg = (p // (2 * BS)) * 2 - 0  # pages of complete units
        if npg < 1:
            continue
        qq = qr[:, p] * scale * LOG2E  # [hq, D]
        qh = qq.view(hkv, g, D)
        sc = torch.einsum("hgd,hntd->hgnt", qh, kq[:, :npg])[..., 1:]  # tokens 1..127
        tmax = sc.amax(-1)  # [hkv, g, npg]
        qs = qh[:, :, None, :] * s[:, None, :npg, :]  # [hkv, g, npg, D]
        U = (15 * qs).clamp(min=0).sum(-1) + torch.einsum("hgd,hnd->hgn", qh, mn[:, :npg])
        page_gaps.append((U - tmax).flatten())
        sfirst = torch.einsum("hgd,hnd->hgn", qh, kr[:, :npg * BS].reshape(hkv, npg, BS, D)[:, :, 0])
        first_gaps.append((torch.maximum(U, sfirst) - sfirst).flatten())
        row_gaps.append((U.amax(-1) - tmax.amax(-1)).flatten())
    kk = key.repeat_interleave(hq // hkv, 1)
    vv = value.repeat_interleave(hq // hkv, 1)
    o = torch.nn.functional.scaled_dot_product_attention(query.float(), kk.float(), vv.float(), is_causal=True, scale=scale)
    return o.transpose(1, 2).to(query.dtype), None

AttentionInterface.register("gap", attention)
model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, attn_implementation="gap").eval()
with torch.no_grad():
    model(torch.tensor([ids]))
pg, rg, fg = torch.cat(page_gaps), torch.cat(row_gaps), torch.cat(first_gaps)
print(f"pages whose bound lies more than 160 above their exact first score (the kernel takes their true max): "
      f"{(fg > 160).float().mean().item():.2%}")
for name, x in (("page U - page max", pg), ("row max U - row max", rg), ("page U - exact first score", fg)):
    qs = torch.quantile(x, torch.tensor([0.5, 0.9, 0.99, 0.999]))
    print(f"{name}: n={x.numel()} median {qs[0]:.1f} p90 {qs[1]:.1f} p99 {qs[2]:.1f} p99.9 {qs[3]:.1f} max {x.max():.1f} (log2 units)")
