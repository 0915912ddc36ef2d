"""The attention of one decode row with exactly the decode kernel's dot-operand roundings: what the
kernel computes when its 16-bit operands round, so that a test can check the kernel's logic tightly
on inputs where those roundings alone move the output beyond a tolerance (queries whose scores
spread over hundreds of log2 units: bf16 operands put a row 1.1e-2 / 1.9e-2 from the fp32 reference
at 8x / 16x queries on the H100, docs/results/cpu-2026-12-06-peaky-emulation/).

The page loop (s4kv/kernels/decode.py, _page_keys and _pages_partial) rounds, per page and channel,
q * s (the rotated, scaled query times the page's key scale) and, per token, p * vs (the softmax
weight times the value scale). With int8 key dots (s4kv.kernels.decode.int8_keys: a bf16 model) q * s
is rounded to int8 instead, with one scale per page and query head (its largest |q * s| is 127). A
block's token 0 has an exact key (its score from the unrounded query) and an 8-bit value whose low
nibble goes through the rounded p * vs and whose high nibble is added with the unrounded p. The
window loop rounds the query once and p * vs per row; this step's own token is computed in fp32.
Everything else is fp32: with an fp32 operand dtype this is the reference
(s4kv.reference.kivi_attention), which the test checks too."""

import torch

from s4kv import format as fmt

BS = fmt.BLOCK_SIZE
LOG2E = 1.4426950408889634


def int8_round(x: torch.Tensor) -> torch.Tensor:
    """x [..., D] rounded as the int8 key dots take it: to multiples of max |x| / 127 over the last axis."""
    unit = x.abs().amax(-1, keepdim=True).clamp(min=1e-30) / 127
    return torch.round(x / unit) * unit


def decode_row_with_operand_roundings(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sm_scale: float,
                                      operand_dtype: torch.dtype, int8_keys: bool = False) -> torch.Tensor:
    """q [1, Hq, D] at the last position of k, v [T, 1, D] (one kv head, exact, model dtype) ->
    [1, Hq, D] fp32, with the kernel's operands rounded to operand_dtype (torch.float32: none) and,
    with int8_keys, the pages' q * s to int8 with one scale per page and query head."""
    def rnd(x):
        return x.to(operand_dtype).float()

    t, hkv, d = k.shape
    assert hkv == 1 and q.shape[0] == 1
    nq = t // fmt.UNIT * fmt.UNIT  # positions in complete units: read from pages
    nb = nq // BS
    # pages: keys and values through their 8-bit window rows, then per block (s4kv.format.encode_blocks)
    kw, vw = fmt.window_round_trip(k)[:, 0], fmt.window_round_trip(v)[:, 0]  # [T, D] fp32, rotated
    kcodes, kscale, kmin = fmt.quantize_keys(kw[:nq].reshape(nb, BS, d))
    vcodes, vscale = fmt.quantize_values(vw[:nq].reshape(nb, BS, d))
    first_codes, first_scale = fmt.quantize_values(vw[:nq].reshape(nb, BS, d)[:, 0], fmt.FIRST_VALUE_LEVELS)
    first_k = kw[:nq].reshape(nb, BS, d)[:, 0].to(fmt.first_key_dtype(k.dtype)).float()
    qc = fmt.rotate(q)[0] * (sm_scale * LOG2E)  # [Hq, D] in log2 units, fp32 (the row kernel's output)

    # scores: pages (q * s) . codes + q . min with token 0's exact key; the window with the query
    # rounded once; the step's own token (the last row) in fp32
    qs = qc[:, None, :] * kscale[None]  # [Hq, nb, D]
    s_pg = torch.einsum("hbd,btd->hbt", int8_round(qs) if int8_keys else rnd(qs), kcodes.float())
    s_pg += torch.einsum("hd,bd->hb", qc, kmin)[..., None]
    s_pg[:, :, 0] = torch.einsum("hd,bd->hb", qc, first_k)
    s_win = torch.einsum("hd,kd->hk", rnd(qc), kw[nq:-1])
    s_own = qc @ kw[-1]
    s = torch.cat([s_pg.reshape(len(qc), -1), s_win, s_own[:, None]], 1)  # [Hq, T]
    p = torch.exp2(s - s.amax(-1, keepdim=True))

    # values: round(p * vs) times the centred codes, over the sum of the unrounded p
    p_pg = p[:, :nq].reshape(len(qc), nb, BS)
    vs_pg = vscale.clone()
    vs_pg[:, 0] = first_scale
    low = vcodes.float() - fmt.CODE_LEVELS / 2  # token 0: its 8-bit code's low nibble, as the page holds it
    low[:, 0] = (first_codes % 16).float() - fmt.CODE_LEVELS / 2
    o = torch.einsum("hbt,btd->hd", rnd(p_pg * vs_pg[None]), low)
    high = 16 * ((first_codes // 16).float() - fmt.CODE_LEVELS / 2)  # [nb, D]
    o += torch.einsum("hb,bd->hd", p_pg[:, :, 0] * first_scale[None], high)
    w_codes, w_scale = fmt.quantize_window(v[nq:, 0])  # the window rows and the own token's
    w_centred = w_codes.float() - fmt.WINDOW_LEVELS / 2
    o += rnd(p[:, nq:-1] * w_scale[None, :-1]) @ w_centred[:-1]
    o += (p[:, -1] * w_scale[-1])[:, None] * w_centred[-1][None]
    return fmt.unrotate(o / p.sum(-1, keepdim=True))[None]
