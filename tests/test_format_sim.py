"""tools/format_sim.py's knobs change what they say and nothing else: fake_quantize on random
keys and values, compared with the exact rotated tensors (no model needed)."""

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import format_sim

from s4kv import format as fmt

BS = fmt.BLOCK_SIZE


def _kv(blocks: int = 3, heads: int = 2, d: int = 64):
    g = torch.Generator().manual_seed(0)
    k = torch.randn(heads, blocks * BS, d, generator=g).to(torch.bfloat16)
    v = torch.randn(heads, blocks * BS, d, generator=g).to(torch.bfloat16)
    return k, v


def _qkv(seed: int, t: int):
    """bf16 q [4, t, 64], k, v [2, t, 64] (GQA 2) and the softmax scale, for kivi_sdpa."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(4, t, 64, generator=g).to(torch.bfloat16)
    k = torch.randn(2, t, 64, generator=g).to(torch.bfloat16)
    v = torch.randn(2, t, 64, generator=g).to(torch.bfloat16)
    return q, k, v, 64 ** -0.5


def _err(x, exact):
    return (x - exact).abs().mean(dim=(0, 2))  # per position


def test_sink_bits_8_quantizes_block_0_finer_and_leaves_the_rest():
    k, v = _kv()
    kr, vr = fmt.rotate(k.float()), fmt.rotate(v.float())
    k4, v4 = format_sim.fake_quantize(k, v, {"first_value": 8})
    k8, v8 = format_sim.fake_quantize(k, v, {"first_value": 8, "sink_bits": 8})
    # block 0: 8-bit codes, an error an order of magnitude below 4-bit's (255 vs 15 levels)
    assert _err(k8, kr)[1:BS].mean() < _err(k4, kr)[1:BS].mean() / 8
    assert _err(v8, vr)[1:BS].mean() < _err(v4, vr)[1:BS].mean() / 8
    # the first key stays exact (16-bit) as in every block; later blocks are untouched
    assert torch.equal(k8[:, 0], k4[:, 0])
    assert torch.equal(k8[:, BS:], k4[:, BS:]) and torch.equal(v8[:, BS:], v4[:, BS:])


def test_exact_sink_keeps_block_0_as_16_bit():
    k, v = _kv()
    ks, vs = format_sim.fake_quantize(k, v, {"first_value": 8, "sink": BS})
    exact = fmt.first_key_dtype(k.dtype)  # what the format keeps an exact token in
    kr, vr = fmt.rotate(k).to(exact).float(), fmt.rotate(v).to(exact).float()
    assert torch.equal(ks[:, :BS], kr[:, :BS]) and torch.equal(vs[:, :BS], vr[:, :BS])
    k4, _ = format_sim.fake_quantize(k, v, {"first_value": 8})
    assert not torch.equal(k4[:, 1:BS], kr[:, 1:BS])


def test_code_bits_move_the_error_between_keys_and_values():
    k, v = _kv()
    kr, vr = fmt.rotate(k.float()), fmt.rotate(v.float())
    k44, v44 = format_sim.fake_quantize(k, v, {"first_value": 8})
    k53, v53 = format_sim.fake_quantize(k, v, {"first_value": 8, "kbits": 5, "vbits": 3})
    body = slice(1, None)  # past the first token (exact key, 8-bit value)
    assert _err(k53, kr)[body].mean() < _err(k44, kr)[body].mean() * 0.6
    assert _err(v53, vr)[body].mean() > _err(v44, vr)[body].mean() * 1.6
    k44b, v44b = format_sim.fake_quantize(k, v, {"first_value": 8, "kbits": 4, "vbits": 4})
    assert torch.equal(k44b, k44) and torch.equal(v44b, v44)  # the defaults are the shipped format


def test_fp8_key_statistics_per_64_tokens_cost_the_shipped_bytes():
    shipped = {"first_value": 8}
    fine = {"first_value": 8, "kblock": 64}
    fine8 = {"first_value": 8, "kblock": 64, "kstat8": 1}
    assert format_sim.bytes_per_token(fine8) == format_sim.bytes_per_token(shipped) == 136
    assert format_sim.bytes_per_token(fine) == 140
    k, v = _kv()
    kr = fmt.rotate(k.float())
    e = {name: _err(format_sim.fake_quantize(k, v, var)[0], kr)[1:].mean().item()
         for name, var in (("shipped", shipped), ("fine", fine), ("fine8", fine8))}
    # fp8 statistics are coarser than fp16 ones over the same tokens, and stay in the codes' range
    assert e["fine"] < e["fine8"] < 2 * e["fine"]


def test_keys_in_the_model_basis_keep_a_channel_outlier_to_its_own_channel():
    k, v = _kv()
    k = k.float()
    k[..., 5] *= 30  # one outlier channel, as RoPE'd keys have
    k = k.to(torch.bfloat16)
    rot = {"first_value": 8}
    plain = {"first_value": 8, "krot": 0}
    kq_rot, vq_rot = format_sim.fake_quantize(k, v, rot)
    kq_plain, vq_plain = format_sim.fake_quantize(k, v, plain)
    assert torch.equal(vq_plain, vq_rot)  # the values stay rotated and untouched
    assert torch.equal(kq_plain[:, ::BS], k.float()[:, ::BS])  # first keys exact, model basis
    body = [i for i in range(k.shape[1]) if i % BS]
    # in one basis: per-channel statistics keep the outlier's range out of the other channels
    err_rot = _err(fmt.unrotate(kq_rot), k.float())[body].mean()
    err_plain = _err(kq_plain, k.float())[body].mean()
    assert err_plain < err_rot / 2
    assert format_sim.bytes_per_token(plain) == format_sim.bytes_per_token(rot)


def test_sink_key_only_frees_the_first_key_slot_of_later_blocks():
    k, v = _kv()
    kr = fmt.rotate(k.float())
    exact = fmt.first_key_dtype(k.dtype)
    sinkkey = {"first_value": 8, "first_key": 2}
    kq, _ = format_sim.fake_quantize(k, v, sinkkey)
    assert torch.equal(kq[:, 0], fmt.rotate(k).to(exact).float()[:, 0])  # the sink's key exact
    assert not torch.equal(kq[:, BS], kr.to(exact).float()[:, BS])  # later first keys quantized
    assert format_sim.bytes_per_token(sinkkey) == 134
    assert format_sim.bytes_per_token({**sinkkey, "kmin64": 1}) == 136


def test_a_minimum_per_half_block_follows_a_drifting_channel():
    # keys that drift along the block (as low-frequency RoPE channels do): a minimum per 64 tokens
    # with one shared scale halves the range each code spans, and never exceeds scale / 2 in error
    g = torch.Generator().manual_seed(1)
    t = torch.arange(3 * BS, dtype=torch.float32)
    k = (torch.randn(2, 3 * BS, 64, generator=g) * 0.1 + (t % BS / BS)[None, :, None] * 4).to(torch.bfloat16)
    v = torch.randn(2, 3 * BS, 64, generator=g).to(torch.bfloat16)
    x = k.float()  # in the model basis (krot=0) the drift stays in every channel
    base = {"first_value": 8, "first_key": 2, "krot": 0}
    e_block = _err(format_sim.fake_quantize(k, v, base)[0], x)[BS:].mean()
    kq, _ = format_sim.fake_quantize(k, v, {**base, "kmin64": 1})
    e_half = _err(kq, x)[BS:].mean()
    assert e_half < 0.6 * e_block
    assert torch.equal(kq[:, :BS], format_sim.fake_quantize(k, v, base)[0][:, :BS])  # block 0 as before


def test_least_squares_key_statistics_lower_the_squared_error():
    k, v = _kv()
    kr = fmt.rotate(k.float())
    body = [i for i in range(k.shape[1]) if i % BS]
    mse = {n: ((format_sim.fake_quantize(k, v, {"first_value": 8, "kfit": n})[0] - kr)[:, body] ** 2).mean()
           for n in (0, 3)}
    assert mse[3] < 0.95 * mse[0]
    # the same for the two-minimum statistics of kmin64 (blocks 1..), and for the values' scale
    half = {"first_value": 8, "first_key": 2, "kmin64": 1}
    later = slice(BS, None)
    e0 = ((format_sim.fake_quantize(k, v, half)[0] - kr)[:, later] ** 2).mean()
    e3 = ((format_sim.fake_quantize(k, v, {**half, "kfit": 3})[0] - kr)[:, later] ** 2).mean()
    assert e3 < 0.95 * e0
    vr = fmt.rotate(v.float())
    v0 = ((format_sim.fake_quantize(k, v, {"first_value": 8})[1] - vr)[:, body] ** 2).mean()
    v3 = ((format_sim.fake_quantize(k, v, {"first_value": 8, "vfit": 3})[1] - vr)[:, body] ** 2).mean()
    assert v3 < 0.97 * v0


def test_an_8_bit_tail_costs_far_less_than_a_page_and_leaves_a_lone_token_exact():
    t = 3 * BS + 50
    q, k, v, scale = _qkv(2, t)
    exact = format_sim.kivi_sdpa(q, k, v, scale, {"first_value": 8, "kq": 0, "vq": 0})
    shipped = format_sim.kivi_sdpa(q, k, v, scale, {"first_value": 8})
    tail8 = format_sim.kivi_sdpa(q, k, v, scale, {"first_value": 8, "tail8": 1})
    assert torch.equal(tail8[0], shipped[0])  # position 0 attends only to itself: the step's exact input
    early = slice(1, BS - 1)  # no complete block yet: the shipped format reads the exact tail there
    assert torch.allclose(shipped[early], exact[early], atol=1e-5)
    e_tail = (tail8[early] - exact[early]).abs().mean()
    e_page = (shipped[BS:] - exact[BS:]).abs().mean()
    assert 0 < e_tail < 0.5 * e_page


def test_recent_window_keeps_w_to_w_plus_127_positions_off_the_pages():
    t = 3 * BS + 10
    q, k, v, scale = _qkv(3, t)
    exact = torch.nn.functional.scaled_dot_product_attention(  # fp32, causal, GQA: [Hq, T, D]
        q.float(), k.float().repeat_interleave(2, 0), v.float().repeat_interleave(2, 0), is_causal=True,
        scale=scale).transpose(0, 1)
    shipped = format_sim.kivi_sdpa(q, k, v, scale, {"first_value": 8})
    r128 = format_sim.kivi_sdpa(q, k, v, scale, {"first_value": 8, "recent": BS})

    def exact_rows(o):
        return [p for p in range(t) if torch.allclose(o[p], exact[p], atol=1e-5)]

    # the position rule: position p reads block 0 from pages once p + 1 >= BS; one more block
    # off the pages (recent = BS) moves that to p + 1 >= 2 * BS, and so on for every block
    assert exact_rows(shipped) == list(range(BS - 1))
    assert exact_rows(r128) == list(range(2 * BS - 1))
    later = slice(3 * BS - 1, t)  # both read pages there: the longer window errs less
    assert (r128[later] - exact[later]).abs().mean() < (shipped[later] - exact[later]).abs().mean()


def test_unit_of_two_blocks_leaves_nothing_off_the_pages_at_a_unit_boundary():
    t = 4 * BS + 10
    q, k, v, scale = _qkv(5, t)
    exact = torch.nn.functional.scaled_dot_product_attention(
        q.float(), k.float().repeat_interleave(2, 0), v.float().repeat_interleave(2, 0), is_causal=True,
        scale=scale).transpose(0, 1)
    unit2 = format_sim.kivi_sdpa(q, k, v, scale, {"first_value": 8, "unit": 2})
    shipped = format_sim.kivi_sdpa(q, k, v, scale, {"first_value": 8})
    exact_rows = [p for p in range(t) if torch.allclose(unit2[p], exact[p], atol=1e-5)]
    # blocks 0 and 1 reach the pages together, once p + 1 >= 2 * BS: positions before read them exact
    assert exact_rows == list(range(2 * BS - 1))
    # at a unit boundary (p + 1 = 4 * BS) every complete block is in pages, as under the shipped rule;
    # one position earlier block 2 is still off the pages
    p = 4 * BS - 1
    assert torch.allclose(unit2[p], shipped[p], atol=1e-6)
    assert not torch.allclose(unit2[p - 1], shipped[p - 1], atol=1e-6)


def test_own8_reads_the_query_own_token_in_8_bits_too():
    t = BS + 20
    q, k, v, scale = _qkv(4, t)
    tail8 = format_sim.kivi_sdpa(q, k, v, scale, {"first_value": 8, "tail8": 1})
    own8 = format_sim.kivi_sdpa(q, k, v, scale, {"first_value": 8, "tail8": 1, "own8": 1})
    # position 0 attends only to itself: its output is its value, exact or through 8-bit codes
    v0 = v[:, 0].float().repeat_interleave(2, 0)  # [Hq, D]
    assert torch.allclose(tail8[0], v0, atol=1e-6)
    v0_8 = fmt.unrotate(fmt.window_round_trip(v[:, :1]))[:, 0]
    assert torch.allclose(own8[0], v0_8.repeat_interleave(2, 0), atol=1e-5)
    assert not torch.allclose(own8[0], v0, atol=1e-6)


def test_f64_runs_the_attention_in_float64_and_changes_only_its_rounding():
    torch.manual_seed(0)
    q = torch.randn(4, 300, 64).bfloat16()
    k, v = torch.randn(2, 300, 64).bfloat16(), torch.randn(2, 300, 64).bfloat16()
    shipped = format_sim.VARIANTS["first_value8+tail8own+unit2"]
    o32 = format_sim.kivi_sdpa(q, k, v, 0.125, shipped)
    o64 = format_sim.kivi_sdpa(q, k, v, 0.125, {**shipped, "f64": 1})
    assert o32.dtype == torch.float32 and o64.dtype == torch.float64
    assert torch.allclose(o64, o32.double(), atol=1e-5)
    assert not torch.equal(o64.float(), o32)  # another arithmetic, not the same one relabelled


def test_xtok_keeps_the_chosen_token_exact_per_head_and_first_is_the_shipped_rule():
    k, v = _kv()
    shipped = format_sim.fake_quantize(k, v, {"first_value": 8})
    first = format_sim.fake_quantize(k, v, {"first_value": 8, "xtok": "first"})
    assert all(torch.equal(a, b) for a, b in zip(shipped, first))
    # an outlier key in block 1 of head 1, at token 37: "norm" keeps that one exact there, and the
    # block's other tokens lose the range it widened
    k = k.clone()
    k[1, BS + 37] *= 8
    kr, vr = fmt.rotate(k).to(fmt.first_key_dtype(k.dtype)).float(), fmt.rotate(v.float())
    kn, vn = format_sim.fake_quantize(k, v, {"first_value": 8, "xtok": "norm"})
    k0, _ = format_sim.fake_quantize(k, v, {"first_value": 8})
    assert torch.equal(kn[1, BS + 37], kr[1, BS + 37]) and not torch.equal(k0[1, BS + 37], kr[1, BS + 37])
    assert not torch.equal(kn[1, BS], kr[1, BS])  # the first token no longer exact there
    rest = torch.ones(BS, dtype=torch.bool)
    rest[[0, 37]] = False
    assert (kn[1, BS:2 * BS][rest] - kr[1, BS:2 * BS][rest]).abs().mean() \
        < (k0[1, BS:2 * BS][rest] - kr[1, BS:2 * BS][rest]).abs().mean() / 2
    # its value in 8 bits (an error far below 4-bit's); block 0 keeps the sink, token 0
    v4 = shipped[1]  # the values do not depend on the keys' outlier
    assert (vn[1, BS + 37] - vr[1, BS + 37]).abs().max() < (v4[1, BS + 37] - vr[1, BS + 37]).abs().max() / 8
    assert torch.equal(kn[:, :BS], k0[:, :BS]) and torch.equal(vn[:, :BS], shipped[1][:, :BS])


def test_kbias_key_variance_is_the_rounding_error_and_no_quantized_key_means_no_bias():
    k, v = _kv()
    shipped = format_sim.VARIANTS["first_value8+tail8own+unit2"]
    kq, _, kvar = format_sim.fake_quantize(k, v, shipped, key_variance=True)
    assert torch.equal(kq, format_sim.fake_quantize(k, v, shipped)[0])
    err = (kq - fmt.rotate(k.float())).square().reshape(2, 3, BS, -1)
    kvar = kvar.reshape(2, 3, BS, -1)
    assert (kvar[:, :, 0] == 0).all()  # the exact first keys
    ratio = err[:, :, 1:].mean(dim=2) / kvar[:, :, 1:].mean(dim=2)  # per (head, block, channel)
    assert 0.85 < float(ratio.mean()) < 1.15
    # with every key exact there is nothing to correct: the same output to the bit
    torch.manual_seed(0)
    q = torch.randn(4, 3 * BS, 64).bfloat16()
    exact_keys = {"first_value": 8, "kq": 0}
    assert torch.equal(format_sim.kivi_sdpa(q, k, v, 0.125, exact_keys),
                       format_sim.kivi_sdpa(q, k, v, 0.125, {**exact_keys, "kbias": 1}))
    assert not torch.equal(format_sim.kivi_sdpa(q, k, v, 0.125, shipped),
                           format_sim.kivi_sdpa(q, k, v, 0.125, {**shipped, "kbias": 1}))


def test_klayers_makes_keys_exact_in_those_layers_only():
    var = format_sim.VARIANTS["first_value8+tail8own+unit2+keys_exact_L1-3"]
    shipped = format_sim.VARIANTS["first_value8+tail8own+unit2"]
    keys_exact = format_sim.VARIANTS["first_value8+tail8own+unit2+keys_exact"]
    q, k, v, scale = _qkv(3, 2 * fmt.UNIT + 40)
    for layer in range(6):
        run = format_sim.layer_variant(var, layer)
        same_as = keys_exact if 1 <= layer <= 3 else shipped
        assert torch.equal(format_sim.kivi_sdpa(q, k, v, scale, run), format_sim.kivi_sdpa(q, k, v, scale, same_as))
    assert format_sim.layer_variant(shipped, 2) is shipped


def test_dots_rounds_only_the_page_operands_and_unrounded_is_the_plain_page_attention():
    """dots=32 (the codes and statistics recovered from the pages, no rounding) is the variant's own
    attention; bf16 operands (16) move it a little, int8 q * s (8) and int8 p * vs (88) more, all far
    less than the format's own error against exact attention."""
    q, k, v, scale = _qkv(3, 3 * BS + 40)
    shipped = {"first_value": 8, "tail8": 1, "own8": 1, "unit": 1}
    plain = format_sim.kivi_sdpa(q, k, v, scale, shipped)
    exact = torch.nn.functional.scaled_dot_product_attention(
        q.float(), k.float().repeat_interleave(2, 0), v.float().repeat_interleave(2, 0), is_causal=True,
        scale=scale).transpose(0, 1)
    fmt_err = ((plain - exact).norm() / exact.norm()).item()
    errs = {}
    for dots in (32, 16, 8, 88):
        o = format_sim.kivi_sdpa(q, k, v, scale, {**shipped, "dots": dots})
        errs[dots] = ((o - plain).norm() / plain.norm()).item()
        # positions before the first complete block read no page: untouched
        assert torch.equal(o[:BS - 1], plain[:BS - 1])
    assert errs[32] < 1e-5, errs
    assert 1e-5 < errs[16] < errs[8] < 0.2 * fmt_err, (errs, fmt_err)
    assert errs[8] < errs[88] < 0.3 * fmt_err, (errs, fmt_err)
