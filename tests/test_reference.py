"""The reference semantics (s4kv.reference) against dense fp32 attention."""

import pytest
import torch

from s4kv import format as fmt
from s4kv.reference import dense_attention, kivi_attention

BS = fmt.BLOCK_SIZE


def _qkv(tq, tk, hq, hkv, d, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(tq, hq, d, generator=g).to(dtype)
    k = torch.randn(tk, hkv, d, generator=g).to(dtype)
    v = torch.randn(tk, hkv, d, generator=g).to(dtype)
    return q, k, v


def _rel(a, b):
    return ((a - b).norm() / b.norm()).item()


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
    assert _rel(out, ref) < 1e-5


@pytest.mark.parametrize("d", [64, 128])
def test_within_exact_window_equals_dense(d):
    # Fewer tokens than a block: nothing is quantized yet, so int4_kivi is dense attention
    # (only the bf16 rounding of the rotated K/V, which the residual stores).
    q, k, v = _qkv(100, 100, 4, 2, d, torch.bfloat16)
    ref = dense_attention(q, k, v, d ** -0.5)
    out = kivi_attention(q, k, v, d ** -0.5)
    assert _rel(out, ref) < 1e-2
    q32, k32, v32 = _qkv(100, 100, 4, 2, d, torch.float32)
    assert _rel(kivi_attention(q32, k32, v32, d ** -0.5), dense_attention(q32, k32, v32, d ** -0.5)) < 1e-5


@pytest.mark.parametrize("hq,hkv", [(4, 4), (8, 2), (7, 1)])
@pytest.mark.parametrize("tk", [256, 300, 640])
def test_quantized_close_to_dense(hq, hkv, tk):
    q, k, v = _qkv(tk, tk, hq, hkv, 128, torch.bfloat16, seed=tk)
    ref = dense_attention(q, k, v, 128 ** -0.5)
    out = kivi_attention(q, k, v, 128 ** -0.5)
    err = _rel(out, ref)
    assert 1e-4 < err < 0.08  # int4 noise is present but bounded on random data


def test_position_rule_boundary():
    # A query on the last token of a block sees that block quantized; the token before it
    # sees it exact. Build K/V where quantization matters and compare with a manual mix.
    q, k, v = _qkv(2, BS, 2, 1, 64, seed=5)
    out = kivi_attention(q, k, v, 0.125, q_start=BS - 2)  # positions 126 and 127
    exact = kivi_attention(q, k, v, 0.125, q_start=BS - 2, quantize=False)
    assert torch.allclose(out[0], exact[0], atol=1e-5)  # position 126: block incomplete, exact
    assert not torch.allclose(out[1], exact[1], atol=1e-4)  # position 127: block complete


def test_chunking_does_not_change_the_result():
    # The position rule makes the result a function of positions only.
    q, k, v = _qkv(300, 300, 4, 2, 64, seed=6)
    whole = kivi_attention(q, k, v, 0.125)
    parts = [kivi_attention(q[s:e], k[:e], v[:e], 0.125) for s, e in [(0, 100), (100, 256), (256, 300)]]
    assert torch.allclose(torch.cat(parts), whole, atol=1e-5)
