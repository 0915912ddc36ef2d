"""Decode-row attention with the page loop's operands rounded as bf16 (shipped), as int8 for q * s only
(int8k), or as int8 for q * s and p * vs (int8): errors against the unrounded row (the reference)."""
import sys
import torch
sys.path.insert(0, "tests")
from s4kv import format as fmt

BS = fmt.BLOCK_SIZE
LOG2E = 1.4426950408889634


def int8_round_rows(x, bound):
    """round(x / unit) * unit, unit = bound / 127, per leading index (bound broadcasts)."""
    unit = torch.clamp(bound, min=1e-30) / 127
    return torch.round(x / unit) * unit


def row(q, k, v, sm_scale, mode):
    rnd = (lambda x: x) if mode == "none" else (lambda x: x.to(torch.bfloat16).float())
    t, hkv, d = k.shape
    nq = t // fmt.UNIT * fmt.UNIT
    nb = nq // BS
    kw, vw = fmt.window_round_trip(k)[:, 0], fmt.window_round_trip(v)[:, 0]
    kcodes, kscale, kmin = fmt.quantize_keys(kw[:nq].reshape(nb, BS, d))
    vcodes, vscale = fmt.quantize_values(vw[:nq].reshape(nb, BS, d))
    first_codes, first_scale = fmt.quantize_values(vw[:nq].reshape(nb, BS, d)[:, 0], fmt.FIRST_VALUE_LEVELS)
    first_k = kw[:nq].reshape(nb, BS, d)[:, 0].to(fmt.first_key_dtype(k.dtype)).float()
    qc = fmt.rotate(q)[0] * (sm_scale * LOG2E)
    qs = qc[:, None, :] * kscale[None]  # [H, nb, D]
    if mode in ("int8k", "int8"):
        qs_r = int8_round_rows(qs, qs.abs().amax(-1, keepdim=True))
    else:
        qs_r = rnd(qs)
    s_pg = torch.einsum("hbd,btd->hbt", qs_r, kcodes.float())
    s_pg += torch.einsum("hd,bd->hb", qc, kmin)[..., None]
    s_pg[:, :, 0] = torch.einsum("hd,bd->hb", qc, first_k)
    s_win = torch.einsum("hd,kd->hk", rnd(qc), kw[nq:-1])
    s_own = qc @ kw[-1]
    s = torch.cat([s_pg.reshape(len(qc), -1), s_win, s_own[:, None]], 1)
    p = torch.exp2(s - s.amax(-1, keepdim=True))
    p_pg = p[:, :nq].reshape(len(qc), nb, BS)
    vs_pg = vscale.clone()
    vs_pg[:, 0] = first_scale
    low = vcodes.float() - fmt.CODE_LEVELS / 2
    low[:, 0] = (first_codes % 16).float() - fmt.CODE_LEVELS / 2
    pvs = p_pg * vs_pg[None]
    if mode == "int8":  # the kernel's bound: the page's largest p times its largest value scale
        bound = p_pg.amax(-1, keepdim=True) * vs_pg.amax(-1)[None, :, None]
        pvs_r = int8_round_rows(pvs, bound)
    else:
        pvs_r = rnd(pvs)
    o = torch.einsum("hbt,btd->hd", pvs_r, low)
    high = 16 * ((first_codes // 16).float() - fmt.CODE_LEVELS / 2)
    o += torch.einsum("hb,bd->hd", p_pg[:, :, 0] * first_scale[None], high)
    w_codes, w_scale = fmt.quantize_window(v[nq:, 0])
    w_centred = w_codes.float() - fmt.WINDOW_LEVELS / 2
    o += rnd(p[:, nq:-1] * w_scale[None, :-1]) @ w_centred[:-1]
    o += (p[:, -1] * w_scale[-1])[:, None] * w_centred[-1][None]
    return fmt.unrotate(o / p.sum(-1, keepdim=True))[None]


def exact(q, k, v, sm_scale):
    """Dense fp32 attention over the unquantized keys and values: the int4 format's own error."""
    s = torch.einsum("hd,td->ht", q[0].float(), k[:, 0].float()) * sm_scale
    return (torch.softmax(s, -1) @ v[:, 0].float())[None]


def rel(a, b):
    return ((a - b).norm() / b.norm()).item()


if __name__ == "__main__":
    t = int(sys.argv[1]) if len(sys.argv) > 1 else 5 * BS + 3
    print(f"tokens {t}, 7 query heads, head_dim 64, bf16 inputs; relative L2 error of the row, mean (max) over 8 seeds")
    print(f"{'queries':>8} {'format vs dense':>18} {'bf16 ops':>18} {'int8 q*s':>18} {'int8 q*s, p*vs':>18}")
    for qscale in (1, 8, 16):
        errs = {m: [] for m in ("format", "bf16", "int8k", "int8")}
        for seed in range(8):
            g = torch.Generator().manual_seed(seed)
            q = (torch.randn(1, 7, 64, generator=g) * qscale).to(torch.bfloat16)
            k = torch.randn(t, 1, 64, generator=g).to(torch.bfloat16)
            v = torch.randn(t, 1, 64, generator=g).to(torch.bfloat16)
            sm = 64 ** -0.5
            ref = row(q, k, v, sm, "none")
            errs["format"].append(rel(ref, exact(q, k, v, sm)))
            for m in ("bf16", "int8k", "int8"):
                errs[m].append(rel(row(q, k, v, sm, m), ref))
        cells = [f"{sum(e) / len(e):.2e} ({max(e):.2e})" for e in errs.values()]
        print(f"{qscale:>7}x " + " ".join(f"{c:>18}" for c in cells))
