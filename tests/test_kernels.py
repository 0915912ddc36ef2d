"""Triton kernels against the PyTorch reference.

On a CUDA machine they run as compiled kernels (bf16/fp16); on CPU (CI) under Triton's interpreter
(TRITON_INTERPRET=1, set here before the kernels are defined) on small shapes.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
triton = pytest.importorskip("triton")

from paged_harness import Engine, check  # noqa: E402

from s4kv import format as fmt  # noqa: E402
from s4kv.backend import triton_ops  # noqa: E402
from s4kv.kernels.store import store_blocks  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BS = fmt.BLOCK_SIZE


def _engine(hq, hkv, d, dtype, **kw):
    e = Engine(hq, hkv, d, dtype, ops=triton_ops, **kw)
    return e


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("d", [64, 128])
def test_store_matches_format(dtype, d):
    from s4kv.backend.metadata import S4KVMetadata, plan_launch

    g = torch.Generator().manual_seed(0)
    hkv, n = 2, 2 * BS + 5
    k = (torch.randn(n, hkv, d, generator=g) * 3).to(dtype)
    v = torch.randn(n, hkv, d, generator=g).to(dtype)
    k[7, 1, 3] = float("nan")  # poisons (block 0, head 1, channel 3) only
    regions = torch.zeros(8, hkv, fmt.PageLayout(d).region_bytes, dtype=torch.uint8)
    res = torch.zeros(2, 2, hkv, BS, d, dtype=dtype)
    i32 = lambda x: torch.tensor(x, dtype=torch.int32)  # noqa: E731
    md = S4KVMetadata(num_reqs=1, num_actual_tokens=n, max_query_len=n, max_seq_len=n,
                      query_start_loc=i32([0, n]), seq_lens=i32([n]), block_table=i32([[5, 2, 7]]),
                      slots=i32([0]), query_start_loc_cpu=i32([0, n]), seq_lens_cpu=i32([n]), slots_cpu=i32([0]))
    plan_launch(md, hkv, num_sms=4)
    assert md.max_new_blocks == 2
    store_blocks(k, v, res, regions, md, md.max_new_blocks)
    expect = fmt.encode_blocks(k[:2 * BS].reshape(2, BS, hkv, d).transpose(1, 2),
                               v[:2 * BS].reshape(2, BS, hkv, d).transpose(1, 2))
    got = regions[[5, 2]]
    lay = fmt.PageLayout(d)
    # scales, mins and first keys: bit-identical
    assert torch.equal(got[..., lay.v_scale:], expect[..., lay.v_scale:])
    # codes: identical except where FMA contraction rounds a tie the other way
    codes_got, codes_exp = got[..., :lay.v_scale], expect[..., :lay.v_scale]
    assert (codes_got != codes_exp).float().mean() < 1e-3
    kq, vq = fmt.decode_blocks(got, d, dtype)
    assert torch.isnan(kq[0, 1, 1:, 3]).all() and torch.isfinite(kq[1]).all()
    assert regions[[0, 1, 3, 4, 6]].eq(0).all()  # nothing else written


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("hq,hkv,d", [(4, 4, 64), (8, 2, 128), (7, 1, 64)])
def test_mixed_batches_against_reference(dtype, hq, hkv, d):
    e = _engine(hq, hkv, d, dtype)
    e.add("a", 420, slot=0)
    e.add("b", 300, slot=3)
    e.add("c", 200, slot=1)
    check(e, e.step([("a", 200), ("b", 77)]), 3e-3)  # chunks crossing block boundaries, odd lengths
    check(e, e.step([("b", 1), ("a", 150), ("c", 129)]), 3e-3)  # decode row + chunk rows
    check(e, e.step([("b", 1), ("c", 1), ("a", 1)]), 3e-3)  # pure decode
    check(e, e.step([("a", 1), ("b", 47), ("c", 70)]), 3e-3)  # a completes its 3rd block in decode


def test_decode_completing_a_block_and_single_token_request():
    e = _engine(8, 2, 64, torch.bfloat16)
    e.add("a", BS + 2, slot=2)
    e.add("one", 1, slot=4)
    check(e, e.step([("a", BS - 1)]), 3e-3)
    check(e, e.step([("a", 1), ("one", 1)]), 3e-3)  # a's token BS-1 completes block 0
    check(e, e.step([("a", 1)]), 3e-3)


def test_prefix_hit_and_empty_rows():
    e = _engine(4, 2, 128, torch.float16)
    e.add("a", 300, slot=0)
    e.step([("a", 260)])
    e.add("b", 290, slot=5, shared_prefix_of="a", shared_blocks=2)
    e.res[5].normal_()
    e.add("pad", 1, slot=7)
    res = e.step([("b", 1), ("pad", 0)])  # b starts as a decode right at its prefix hit
    check(e, {"b": res["b"]}, 3e-3)
    check(e, e.step([("b", 20)]), 3e-3)


def test_many_splits():
    # more splits than pages, and pages spread over splits
    from s4kv.kernels import decode

    e = _engine(4, 1, 64, torch.bfloat16, num_blocks=16)
    e.add("a", 5 * BS + 3, slot=1)
    e.step([("a", 5 * BS + 2)])
    orig = decode.num_splits
    try:
        for splits in (1, 3, 8):
            decode.num_splits = lambda *a, s=splits, **k: s  # noqa: E731
            out = e.step([("a", 1)])
            check(e, out, 3e-3)
            e.reqs["a"]["done"] -= 1  # recompute the same query with another split count
    finally:
        decode.num_splits = orig
