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
