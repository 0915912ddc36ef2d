"""The CPU implementation (pages with windows inside, batched, chunked) against the reference."""

import pytest
import torch
from paged_harness import Engine
from paged_harness import check as _check


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("hq,hkv,d", [(4, 4, 64), (8, 2, 128), (7, 1, 64)])
def test_mixed_batches_chunked_prefill_and_decode(dtype, hq, hkv, d):
    e = Engine(hq, hkv, d, dtype)
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    e.add("a", 600)
    e.add("b", 300)
    e.add("c", 200)
    # chunked prefill across block boundaries, odd lengths, decode rows mixed with prefill rows
    _check(e, e.step([("a", 200), ("b", 77)]), tol)
    _check(e, e.step([("b", 1), ("a", 150), ("c", 129)]), tol)
    _check(e, e.step([("b", 1), ("c", 1), ("a", 1)]), tol)
    for _ in range(3):
        _check(e, e.step([("a", 1), ("b", 1), ("c", 9)]), tol)
    _check(e, e.step([("b", 47), ("a", 246)]), tol)  # b crosses into its 2nd block, a completes 4 blocks


def test_prefix_cache_hit_reads_shared_pages():
    e = Engine(8, 2, 128, torch.bfloat16)
    e.add("a", 400)
    e.step([("a", 300)])
    e.step([("a", 100)])
    # A new request whose first unit (2 blocks) hits a's cached pages: starts at position 256; its
    # window's pages are fresh from the pool (noise), and a's window pages are not shared.
    e.add("b", 320, shared_prefix_of="a", shared_blocks=2)
    _check(e, e.step([("b", 44)]), 2e-3)
    _check(e, e.step([("b", 1)]), 2e-3)


def test_preempted_request_recomputes_from_its_cached_blocks():
    # Preemption frees the request's pages; on resume it restarts at its last complete unit
    # (prefix cache) with other pages for its window, and must compute the same outputs.
    e = Engine(4, 2, 64, torch.bfloat16)
    e.add("a", 330)
    e.add("other", 200)
    e.step([("a", 200)])
    out_before = e.step([("a", 100)])["a"][0]
    e.free("a", keep_blocks=2)  # blocks 0 and 1 survived in the prefix cache, the rest went back
    e.step([("other", 190)])  # another request took them meanwhile (and left its window there)
    out_after = e.step([("a", 44)])["a"][0]
    assert torch.allclose(out_after, out_before[-44:], atol=2e-3)


def test_request_ending_mid_block_and_page_reuse():
    e = Engine(4, 1, 64, torch.bfloat16)
    e.add("a", 200)
    _check(e, e.step([("a", 170)]), 2e-3)  # ends mid-unit: its window is in its pages
    e.free("a")
    e.add("b", 140)  # the next request gets a's pages, a's window still in them
    _check(e, e.step([("b", 100)]), 2e-3)
    _check(e, e.step([("b", 1)]), 2e-3)


def test_zero_length_rows_are_skipped():
    e = Engine(4, 2, 64, torch.float32)
    e.add("a", 10)
    e.add("pad", 1)
    res = e.step([("a", 10), ("pad", 0)])
    _check(e, {"a": res["a"]}, 1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_outputs_do_not_depend_on_chunking_or_batch(dtype):
    """A query's output is bit-identical however its request is chunked and whatever else is in the
    batch (the position rule makes it the same function; float64 accumulation makes it the same
    bits). Without this, greedy tokens changed with preemption and prefix-cache hits in the engine."""

    def run(prefill, other=None):
        e = Engine(9, 3, 64, dtype, num_blocks=64, seed=0)
        e.add("a", 420)
        if other:  # a second request decoding next to a's 20 decode steps
            e.add("b", other)
            e.step([("b", other - 20)])
        outs = [e.step([("a", c)])["a"][0] for c in prefill]
        outs += [e.step([("a", 1)] + ([("b", 1)] if other else []))["a"][0] for _ in range(20)]
        return torch.cat(outs)

    base = run([400])
    for prefill, other in (([100, 150, 150], None), ([256, 144], None), ([400], 300), ([127, 1, 272], 140)):
        assert torch.equal(run(prefill, other), base), (prefill, other)


def test_chunk_writes_the_pages_its_old_window_lives_in():
    # the old window lives in the pages this chunk's store writes: it is read first
    e = Engine(8, 2, 128, torch.bfloat16)
    e.add("a", 7 * 128)
    e.add("b", 2 * 128)
    _check(e, e.step([("a", 100), ("b", 127)]), 2e-3)
    _check(e, e.step([("b", 1), ("a", 5 * 128 + 3)]), 2e-3)
    _check(e, e.step([("a", 1), ("b", 1)]), 2e-3)
