"""CPU: the decode kernel's dot-operand roundings, emulated on test_peaky_queries_against_reference's
inputs, to predict what each choice of operand dtype does to the kernel's distance from the fp32
reference (s4kv.reference.kivi_attention) before a GPU lease times it.

The page loop (s4kv/kernels/decode.py, _page_keys and _pages_partial) runs its dots on 16-bit
operands (DOT_DTYPE, the model's dtype): per page and channel it rounds q * s (the rotated, scaled
query times the page's key scale) once, and per token p * vs (the softmax weight times the value
scale). The window loop rounds the query once and p * vs per row. Everything else is fp32. This
script recomputes the attention output from the format's own codes and scales with exactly those
roundings, for the operand choices:
  fp32        no rounding (must equal the reference: a check of the emulation itself)
  bf16        what the kernel does for a bf16 model today
  fp16        fp16 operands for both products (the same dots the kernel runs for fp16 models)
  fp16 q*s    fp16 for q * s and the window's query only, bf16 for p * vs
  bf16 hi+lo  q * s as two bf16 operands (hi + lo, two dots per page), bf16 p * vs
Queries 1x..32x larger make the scores spread over hundreds of log2 units (the test's 8x and 16x
failed on the H100 with 1.12e-2 / 1.90e-2 against a 1e-2 bound, docs/results/gpu-h100-2026-12-06-reduce-pdl/).

Run: PYTHONPATH=. python docs/results/cpu-2026-12-06-peaky-emulation/emulate_dot_roundings.py
(torch only: the test's inputs are regenerated here as tests/paged_harness.Engine.add makes them.)"""
import torch

from s4kv import format as fmt
from s4kv.reference import kivi_attention

BS = fmt.BLOCK_SIZE
LOG2E = 1.4426950408889634


def rounder(dtype):
    return lambda x: x if dtype is None else x.to(dtype).float()


def hi_lo(x):
    hi = x.to(torch.bfloat16).float()
    return hi + (x - hi).to(torch.bfloat16).float()


BF, F16, EXACT = rounder(torch.bfloat16), rounder(torch.float16), rounder(None)
CHOICES = {"fp32": (EXACT, EXACT), "bf16": (BF, BF), "fp16": (F16, F16), "fp16 q*s": (F16, BF),
           "bf16 hi+lo": (hi_lo, BF)}


def test_inputs(hq, d, q_scale, length=5 * BS + 3):
    """The test's request: Engine(hq, 1, d, bf16).add("a", length) draws q, k, v from seed 1."""
    g = torch.Generator().manual_seed(1)
    q = torch.randn(length, hq, d, generator=g).to(torch.bfloat16)
    k = torch.randn(length, 1, d, generator=g).to(torch.bfloat16)
    v = torch.randn(length, 1, d, generator=g).to(torch.bfloat16)
    return q * q_scale, k, v


def emulate(q, k, v, sm_scale, round_qs, round_pv):
    """One query row (q [1, Hq, D]) at the last position of k, v [T, 1, D], with the kernel's roundings."""
    t, _, d = k.shape
    nq = t // fmt.UNIT * fmt.UNIT  # positions in complete units: read from pages
    nb = nq // BS
    # pages: keys and values through their 8-bit window rows, then per block (s4kv.format.encode_blocks)
    kw, vw = fmt.window_round_trip(k)[:, 0], fmt.window_round_trip(v)[:, 0]  # [T, D] fp32, rotated
    kcodes, kscale, kmin = fmt.quantize_keys(kw[:nq].reshape(nb, BS, d))
    vcodes, vscale = fmt.quantize_values(vw[:nq].reshape(nb, BS, d))
    first_v_codes, first_v_scale = fmt.quantize_values(vw[:nq].reshape(nb, BS, d)[:, 0], fmt.FIRST_VALUE_LEVELS)
    vq = (vcodes.float() - fmt.CODE_LEVELS / 2) * vscale[..., None]
    vq[:, 0] = (first_v_codes.float() - fmt.FIRST_VALUE_LEVELS / 2) * first_v_scale[..., None]
    vscale = vscale.clone()
    vscale[:, 0] = first_v_scale
    first_k = kw[:nq].reshape(nb, BS, d)[:, 0].to(fmt.first_key_dtype(k.dtype)).float()
    qc = fmt.rotate(q)[0] * (sm_scale * LOG2E)  # [Hq, D], log2 units, fp32 (the row kernel's output)
    # page scores: (q * s) . codes + q . min, token 0 exact
    qs = round_qs(qc[:, None, :] * kscale[None])  # [Hq, nb, D]
    s_pg = torch.einsum("hbd,btd->hbt", qs, kcodes.float()) + torch.einsum("hd,bd->hb", qc, kmin)[..., None]
    s_pg[:, :, 0] = torch.einsum("hd,bd->hb", qc, first_k)
    # window scores: the query rounded once (round_qs's dtype; hi+lo does not apply there)
    round_q = BF if round_qs is hi_lo else round_qs
    s_win = torch.einsum("hd,kd->hk", round_q(qc), kw[nq:])
    s = torch.cat([s_pg.reshape(len(qc), -1), s_win], 1)  # [Hq, T]
    p = torch.exp2(s - s.amax(-1, keepdim=True))
    # values: round(p * vs) times the codes, over the sum of the unrounded p
    wscale = fmt.quantize_window(v[nq:, 0])[1]  # the window rows' per-row value scales
    vs_all = torch.cat([vscale.reshape(-1), wscale])
    v_codes = torch.cat([vq.reshape(nq, d), vw[nq:]]) / torch.where(vs_all == 0, 1, vs_all)[:, None]
    o = torch.einsum("hk,kd->hd", round_pv(p * vs_all), v_codes) / p.sum(-1, keepdim=True)
    return fmt.unrotate(o)[None]


def rel(a, b):
    return ((a - b).norm() / b.norm()).item()


if __name__ == "__main__":
    print("relative L2 distance of the emulated kernel output from the fp32 reference")
    print(f"{'shape':>8} {'q':>4}  " + "  ".join(f"{n:>10}" for n in CHOICES))
    for hq, d in ((7, 64), (7, 128)):
        for q_scale in (1, 8, 16, 32):
            q, k, v = test_inputs(hq, d, q_scale)
            ctx = k.shape[0] - 1
            q, k, v = q[ctx:ctx + 1], k[:ctx + 1], v[:ctx + 1]
            ref = kivi_attention(q, k, v, d ** -0.5, q_start=ctx)
            errs = [rel(emulate(q, k, v, d ** -0.5, *c), ref) for c in CHOICES.values()]
            print(f"{hq}x{d:<6} {q_scale:>3}x  " + "  ".join(f"{e:>10.2e}" for e in errs), flush=True)
