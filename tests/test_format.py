"""The int4_kivi format: sizes, round trips against analytic error bounds, edge cases."""

import math

import pytest
import torch

from s4kv import format as fmt

DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def test_bytes_per_token_and_density():
    # head_dim 128: 64 + 64 codes + 2 value scale + (2+2+2)*128/128 key scale/min/first key
    assert fmt.bytes_per_token_per_head(128) == 136
    assert fmt.bytes_per_token_per_head(64) == 69
    assert fmt.density_vs(128) == pytest.approx(512 / 136)
    assert fmt.density_vs(128) >= 3.76
    assert fmt.page_size_bytes(num_kv_heads=4, head_size=128) == 4 * 128 * 136
    lay = fmt.PageLayout(128)
    offsets = [lay.k_codes, lay.v_codes, lay.v_scale, lay.k_scale, lay.k_min, lay.first_key, lay.region_bytes]
    assert offsets == sorted(offsets) and all(o % 2 == 0 for o in offsets)  # fp16 fields aligned


def test_unsupported_head_size_is_refused():
    with pytest.raises(ValueError, match="head_dim"):
        fmt.PageLayout(96)


@pytest.mark.parametrize("d", [64, 128])
def test_rotation_is_orthogonal_and_fixed(d):
    x = torch.randn(5, d)
    assert torch.allclose(fmt.unrotate(fmt.rotate(x)), x, atol=1e-5)
    assert torch.equal(fmt.rotation_pm1(d).abs(), torch.ones(d, d))
    r = fmt.rotation(d)
    assert torch.allclose(r @ r.T, torch.eye(d), atol=1e-6)
    # Entries are +-1/sqrt(d): a Hadamard matrix with a sign pattern, the same on every machine.
    assert torch.allclose(r.abs(), torch.full((d, d), 1 / math.sqrt(d)))
    assert fmt._sign_pattern(d) == fmt._sign_pattern(d)
    assert sum(fmt._sign_pattern(d)) not in (d, -d)


@pytest.mark.parametrize("d", [64, 128])
def test_rotations_right_half_is_its_left_half_with_the_lower_tile_negated(d):
    """What the kernels' forward rotation reads R through (s4kv.kernels.quant.rotate_halves: two tiles
    instead of four): R = diag(s) @ [[H, H], [H, -H]], so R01 = R00 and R11 = -R10."""
    r, h = fmt.rotation_pm1(d), d // 2
    assert torch.equal(r[:h, h:], r[:h, :h])
    assert torch.equal(r[h:, h:], -r[h:, :h])


def test_fp16_rounding_directions():
    x = torch.tensor([0.1, -0.1, 1 / 3, 65504.0, 1e-8, 0.0])
    up, down = fmt.fp16_up(x), fmt.fp16_down(x)
    assert torch.all(up >= x) and torch.all(down <= x)
    assert torch.all(up.to(torch.float16).float() == up) and torch.all(down.to(torch.float16).float() == down)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [64, 128])
def test_key_round_trip_within_half_step(dtype, d):
    g = torch.Generator().manual_seed(0)
    k = (torch.randn(5, 3, 128, d, generator=g) * torch.rand(d, generator=g) * 4 + 1).to(dtype)
    codes, scale, mn = fmt.quantize_keys(k)
    assert codes.max() <= 15
    deq = fmt.dequantize_keys(codes, scale, mn)
    err = (deq - k.float()).abs()[..., 1:, :]  # token 0 is stored exact by the page
    bound = scale.unsqueeze(-2) / 2 + 1e-6 * k.float().abs().amax()
    assert torch.all(err <= bound)


@pytest.mark.parametrize("dtype", DTYPES)
def test_value_round_trip_within_half_step(dtype):
    g = torch.Generator().manual_seed(1)
    v = (torch.randn(7, 4, 128, generator=g) * 3).to(dtype)
    codes, scale = fmt.quantize_values(v)
    deq = fmt.dequantize_values(codes, scale)
    assert torch.all((deq - v.float()).abs() <= scale.unsqueeze(-1) / 2 + 1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [64, 128])
def test_page_round_trip(dtype, d):
    g = torch.Generator().manual_seed(2)
    k = torch.randn(2, 3, 128, d, generator=g).to(dtype)
    v = torch.randn(2, 3, 128, d, generator=g).to(dtype)
    regions = fmt.encode_blocks(k, v)
    assert regions.dtype == torch.uint8 and regions.shape == (2, 3, fmt.PageLayout(d).region_bytes)
    kq, vq = fmt.decode_blocks(regions, d, dtype)
    kr, vr = fmt.window_round_trip(k), fmt.window_round_trip(v)  # pages hold the rotated basis, quantized from the 8-bit window rows
    kc, ks, km = fmt.quantize_keys(kr)
    vc, vs = fmt.quantize_values(vr)
    expect_k = fmt.dequantize_keys(kc, ks.half().float(), km.half().float())
    expect_k[..., 0, :] = kr[..., 0, :].to(fmt.first_key_dtype(dtype)).float()
    assert torch.equal(kq, expect_k)
    expect_v = fmt.dequantize_values(vc, vs.half().float())
    fc, fs = fmt.quantize_values(vr[..., 0, :], fmt.FIRST_VALUE_LEVELS)
    expect_v[..., 0, :] = fmt.dequantize_values(fc, fs.half().float(), fmt.FIRST_VALUE_LEVELS)
    assert torch.equal(vq, expect_v)


@pytest.mark.parametrize("d", [64, 128])
def test_first_value_is_8_bit_in_the_first_tokens_code_bytes(d):
    # The first token's value: symmetric 8-bit codes, their low nibbles in value byte (0, i) and
    # their high nibbles in key byte (0, i), packed like 4-bit codes; its scale in value scale 0;
    # the other tokens are untouched.
    g = torch.Generator().manual_seed(6)
    k = torch.randn(2, 128, d, generator=g).to(torch.bfloat16)
    v = (torch.randn(2, 128, d, generator=g) * 3).to(torch.bfloat16)
    regions = fmt.encode_blocks(k, v)
    lay = fmt.PageLayout(d)
    half = d // 2
    vr = fmt.window_round_trip(v)
    fc, fs = fmt.quantize_values(vr[:, 0], fmt.FIRST_VALUE_LEVELS)
    assert fc.max() > 15  # 8-bit codes, not 4-bit ones
    v_row = regions[:, lay.v_codes:lay.v_scale].reshape(2, half, 128)[:, :, 0]
    k_row = regions[:, lay.k_codes:lay.v_codes].reshape(2, 128, half)[:, 0]
    assert torch.equal(v_row, (fc[:, :half] & 0xF) | ((fc[:, half:] & 0xF) << 4))
    assert torch.equal(k_row, (fc[:, :half] >> 4) | ((fc[:, half:] >> 4) << 4))
    assert torch.equal(regions[:, lay.v_scale:lay.v_scale + 2].view(torch.float16).float()[:, 0], fs)
    _, vq = fmt.decode_blocks(regions, d, torch.bfloat16)
    err = (vq[:, 0] - vr[:, 0]).abs()
    assert torch.all(err <= fs[:, None] / 2 + 1e-6)
    assert torch.all(fs <= vr[:, 0].abs().amax(-1) / 127.5 * (1 + 2 ** -10))  # 17x finer than 4-bit
    vc, vs = fmt.quantize_values(vr[:, 1:])
    assert torch.equal(vq[:, 1:], fmt.dequantize_values(vc, vs.half().float()))


def test_constant_channel_is_reproduced():
    # Every token the same: every (rotated) channel is constant over the block (zero range).
    tok = torch.randn(64)
    k = tok.expand(1, 1, 128, 64).clone()
    codes, scale, mn = fmt.quantize_keys(k)
    assert torch.allclose(fmt.dequantize_keys(codes, scale, mn), k, atol=2e-3)  # fp16 grid of the min
    kq, vq = fmt.fake_quantize_blocks(k, torch.zeros(1, 1, 128, 64))
    assert torch.allclose(kq[..., 1:, :], fmt.window_round_trip(k)[..., 1:, :], atol=2e-3)
    assert torch.allclose(kq[..., 0, :], fmt.window_round_trip(k)[..., 0, :], rtol=4e-3)  # first key: bf16 of fp32
    assert torch.equal(vq, torch.zeros(1, 1, 128, 64))  # zero range: scale 0, exact


def test_outlier_channel_does_not_degrade_other_channels():
    # Per-channel keys: one huge channel keeps its own scale; the others stay fine.
    g = torch.Generator().manual_seed(3)
    k = torch.randn(1, 1, 128, 128, generator=g)
    k[..., 7] *= 1000
    codes, scale, mn = fmt.quantize_keys(k)
    err = (fmt.dequantize_keys(codes, scale, mn) - k).abs()[..., 1:, :]
    others = torch.ones(128, dtype=torch.bool)
    others[7] = False
    assert err[..., others].max() < 0.5  # unaffected: ~range/30
    assert err[..., 7].max() <= scale[..., 7].max() / 2 + 1e-3


def test_values_beyond_fp16_saturate():
    v = torch.tensor([[1e6, -2e5, 1.0, 0.0]], dtype=torch.float32)
    codes, scale = fmt.quantize_values(v)
    deq = fmt.dequantize_values(codes, scale)
    assert torch.isfinite(deq).all()
    assert deq[0, 0] == pytest.approx(65504, rel=0.07) and deq[0, 1] == pytest.approx(-65504, rel=0.07)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_poisons_its_group_only(bad):
    g = torch.Generator().manual_seed(4)
    k = torch.randn(1, 1, 128, 64, generator=g)
    v = torch.randn(1, 1, 128, 64, generator=g)
    k[0, 0, 10, 3] = bad  # key group = (block, channel 3)
    v[0, 0, 20, 5] = bad  # value group = token 20
    codes, scale, mn = fmt.quantize_keys(k)
    kq = fmt.dequantize_keys(codes, scale, mn)
    assert torch.isnan(kq[0, 0, 1:, 3]).all()
    others = torch.ones(64, dtype=torch.bool)
    others[3] = False
    assert torch.isfinite(kq[0, 0][:, others]).all()
    vc, vs = fmt.quantize_values(v)
    vq = fmt.dequantize_values(vc, vs)
    assert torch.isnan(vq[0, 0, 20]).all()
    assert torch.isfinite(vq[0, 0, :20]).all() and torch.isfinite(vq[0, 0, 21:]).all()


def test_non_finite_in_a_page():
    # In a page the rotation mixes a token's channels: a bad key element poisons its block's keys
    # (all channels, first key excepted), a bad value element poisons its token's value.
    g = torch.Generator().manual_seed(5)
    k = torch.randn(2, 1, 128, 64, generator=g)
    v = torch.randn(2, 1, 128, 64, generator=g)
    k[0, 0, 10, 3] = float("nan")
    v[1, 0, 20, 5] = float("inf")
    kq, vq = fmt.fake_quantize_blocks(k, v)
    assert torch.isnan(kq[0, 0, 1:]).all() and torch.isfinite(kq[0, 0, 0]).all()
    assert torch.isfinite(kq[1]).all() and torch.isfinite(vq[0]).all()
    assert torch.isnan(vq[1, 0, 20]).all()
    assert torch.isfinite(vq[1, 0, :20]).all() and torch.isfinite(vq[1, 0, 21:]).all()


def test_non_finite_first_token_stays_exact_and_out_of_statistics():
    k = torch.randn(1, 1, 128, 64)
    k[0, 0, 0, 0] = float("nan")
    v = torch.randn(1, 1, 128, 64)
    kq, vq = fmt.fake_quantize_blocks(k, v)
    assert torch.isnan(kq[0, 0, 0]).all()  # the exact (rotated) first key carries the NaN
    assert torch.isfinite(kq[0, 0, 1:]).all()  # and the block's statistics ignore it
    assert torch.isfinite(vq).all()  # the value that shares the key's code bytes is unaffected
    v[0, 0, 0, 7] = float("inf")
    _, vq = fmt.fake_quantize_blocks(torch.randn(1, 1, 128, 64), v)
    assert torch.isnan(vq[0, 0, 0]).all() and torch.isfinite(vq[0, 0, 1:]).all()


def test_nibble_packing_layout():
    codes = torch.arange(16, dtype=torch.uint8).repeat(2).reshape(1, 32)
    packed = fmt.pack_codes(codes)
    assert packed.shape == (1, 16)
    assert packed[0, 0] == codes[0, 0] | (codes[0, 16] << 4)
    assert torch.equal(fmt.unpack_codes(packed), codes)


def test_position_rule_reads_complete_units_from_pages():
    # a query reads a unit from pages once the unit's last token is at or before it
    assert [fmt.pages_boundary(p) for p in (0, 254, 255, 256, 510, 511)] == [0, 0, 256, 256, 256, 512]
    assert fmt.UNIT == fmt.UNIT_BLOCKS * fmt.BLOCK_SIZE == 256


@pytest.mark.parametrize("d", fmt.SUPPORTED_HEAD_SIZES)
def test_kernel_layout_carries_every_offset_of_both_layouts(d):
    lay, page, window = fmt.kernel_layout(d), fmt.PageLayout(d), fmt.WindowLayout(d)
    expected = {"head_size": d, "half": d // 2, "block_size": fmt.BLOCK_SIZE, "unit": fmt.UNIT,
                "window_pages": fmt.WINDOW_PAGES, "slots": fmt.WINDOW_SLOTS,
                "v_codes": page.v_codes, "v_scale": page.v_scale, "k_scale": page.k_scale, "k_min": page.k_min,
                "first_key": page.first_key, "w_v_codes": window.v_codes, "w_k_scale": window.k_scale,
                "w_v_scale": window.v_scale}
    assert {name: fmt.layout_value(lay, name) for name in expected} == expected
    assert len(lay.split(";")) == len(expected)
    with pytest.raises(KeyError, match="k_codes"):
        fmt.layout_value(lay, "k_codes")
