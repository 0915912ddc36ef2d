"""The reference semantics (s4kv.reference) against dense fp32 attention."""

import pytest
import torch
from paged_harness import relative_error

from s4kv import format as fmt
from s4kv.reference import dense_attention, kivi_attention

BS = fmt.BLOCK_SIZE


def _qkv(tq, tk, hq, hkv, d, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(tq, hq, d, generator=g).to(dtype)
    k = torch.randn(tk, hkv, d, generator=g).to(dtype)
    v = torch.randn(tk, hkv, d, generator=g).to(dtype)
    return q, k, v


def test_dense_attention_matches_naive_loop():
    q, k, v = _qkv(5, 9, 4, 2, 16)
    out = dense_attention(q, k, v, 0.25)
    for i in range(5):
        p = 9 - 5 + i
        for h in range(4):
            s = (k[: p + 1, h // 2] @ q[i, h]) * 0.25
            ref = torch.softmax(s, 0) @ v[: p + 1, h // 2]
            assert torch.allclose(out[i, h], ref, atol=1e-5)


@pytest.mark.parametrize("hq,hkv", [(4, 4), (8, 2), (7, 1)])  # GQA ratios 1, 4, 7
@pytest.mark.parametrize("tk,tq", [(1, 1), (127, 127), (129, 3), (300, 300), (385, 1), (513, 77)])
def test_without_quantization_equals_dense(hq, hkv, tk, tq):
    # Rotation + position rule + splitting into page/exact parts is exact algebra.
    q, k, v = _qkv(tq, tk, hq, hkv, 64)
    ref = dense_attention(q, k, v, 0.125)
    out = kivi_attention(q, k, v, 0.125, quantize=False)
    assert relative_error(out, ref) < 1e-5


def _window_only(q, k, v, scale):
    """Dense attention over every token's 8-bit window row (what a query reads before any unit is complete)."""
    o = dense_attention(fmt.rotate(q), fmt.window_round_trip(k), fmt.window_round_trip(v), scale)
    return fmt.unrotate(o)


@pytest.mark.parametrize("d", [64, 128])
def test_within_the_window_reads_8_bit_rows(d):
    # Fewer tokens than a unit: nothing is read from pages; every token, the query's own included,
    # is its 8-bit window row: dense attention over those rows, close to dense attention.
    for dtype in (torch.bfloat16, torch.float32):
        q, k, v = _qkv(200, 200, 4, 2, d, dtype)
        out = kivi_attention(q, k, v, d ** -0.5)
        assert relative_error(out, _window_only(q, k, v, d ** -0.5)) < 1e-5
        assert relative_error(out, dense_attention(q, k, v, d ** -0.5)) < 1e-2


@pytest.mark.parametrize("hq,hkv", [(4, 4), (8, 2), (7, 1)])
@pytest.mark.parametrize("tk", [256, 300, 640])
def test_quantized_close_to_dense(hq, hkv, tk):
    q, k, v = _qkv(tk, tk, hq, hkv, 128, torch.bfloat16, seed=tk)
    ref = dense_attention(q, k, v, 128 ** -0.5)
    out = kivi_attention(q, k, v, 128 ** -0.5)
    err = relative_error(out, ref)
    assert 1e-4 < err < 0.08  # int4 noise is present but bounded on random data


def test_position_rule_boundary():
    # The last token of a unit sees the unit from pages; the token before it from window rows.
    unit = fmt.UNIT
    q, k, v = _qkv(2, unit, 2, 1, 64, seed=5)
    out = kivi_attention(q, k, v, 0.125, q_start=unit - 2)  # positions 254 and 255
    window = _window_only(q, k, v, 0.125)  # [2, ...]: the last two queries over the rows
    assert torch.allclose(out[0], window[0], atol=1e-5)  # position 254: unit incomplete, its rows
    assert not torch.allclose(out[1], window[1], atol=1e-4)  # position 255: unit complete, its pages
    pages = kivi_attention(q, k, v, 0.125, q_start=unit - 2, quantize=False)
    assert relative_error(out, pages) < 0.1


def test_chunking_does_not_change_the_result():
    # The position rule makes the result a function of positions only.
    q, k, v = _qkv(300, 300, 4, 2, 64, seed=6)
    whole = kivi_attention(q, k, v, 0.125)
    parts = [kivi_attention(q[s:e], k[:e], v[:e], 0.125) for s, e in [(0, 100), (100, 256), (256, 300)]]
    assert torch.allclose(torch.cat(parts), whole, atol=1e-5)
