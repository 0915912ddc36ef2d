"""The CPU implementation (paged pages + residual slots, batched, chunked) against the reference."""

import pytest
import torch
from paged_harness import Engine
from paged_harness import check as _check


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("hq,hkv,d", [(4, 4, 64), (8, 2, 128), (7, 1, 64)])
def test_mixed_batches_chunked_prefill_and_decode(dtype, hq, hkv, d):
    e = Engine(hq, hkv, d, dtype)
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    e.add("a", 600, slot=0)
    e.add("b", 300, slot=3)
    e.add("c", 200, slot=1)
    # chunked prefill across block boundaries, odd lengths, decode rows mixed with prefill rows
    _check(e, e.step([("a", 200), ("b", 77)]), tol)
    _check(e, e.step([("b", 1), ("a", 150), ("c", 129)]), tol)
    _check(e, e.step([("b", 1), ("c", 1), ("a", 1)]), tol)
    for _ in range(3):
        _check(e, e.step([("a", 1), ("b", 1), ("c", 9)]), tol)
    _check(e, e.step([("b", 47), ("a", 246)]), tol)  # b crosses into its 2nd block, a completes 4 blocks


def test_prefix_cache_hit_reads_shared_pages():
    e = Engine(8, 2, 128, torch.bfloat16)
    e.add("a", 400, slot=0)
    e.step([("a", 300)])
    e.step([("a", 100)])
    # A new request whose first 2 blocks hit a's cached pages: starts at position 256 with an empty
    # residual slot (its slot was never used, or belonged to someone else).
    e.res[5].normal_()  # stale garbage from an earlier request must not matter
    e.add("b", 320, slot=5, shared_prefix_of="a", shared_blocks=2)
    _check(e, e.step([("b", 44)]), 2e-3)
    _check(e, e.step([("b", 1)]), 2e-3)


def test_preempted_request_recomputes_from_its_cached_blocks():
    # Preemption frees the slot; on resume the request restarts at its last complete block
    # (prefix cache) in a different slot, and must compute the same outputs.
    e = Engine(4, 2, 64, torch.bfloat16)
    e.add("a", 330, slot=0)
    e.step([("a", 200)])
    out_before = e.step([("a", 100)])["a"][0]
    e.res[0].normal_()  # another request took slot 0 meanwhile
    e.reqs["a"]["done"] = 256  # blocks 0 and 1 survived in the prefix cache
    e.reqs["a"]["slot"] = 2
    e.reqs["a"]["blocks"] = e.reqs["a"]["blocks"][:2]
    out_after = e.step([("a", 44)])["a"][0]
    assert torch.allclose(out_after, out_before[-44:], atol=2e-3)


def test_request_ending_mid_block_and_slot_reuse():
    e = Engine(4, 1, 64, torch.bfloat16)
    e.add("a", 200, slot=0)
    _check(e, e.step([("a", 170)]), 2e-3)  # ends mid-block: tail in slot 0
    e.add("b", 140, slot=0)  # the next request reuses slot 0
    _check(e, e.step([("b", 140)]), 2e-3)


def test_zero_length_rows_are_skipped():
    e = Engine(4, 2, 64, torch.float32)
    e.add("a", 10, slot=0)
    e.add("pad", 1, slot=7)
    res = e.step([("a", 10), ("pad", 0)])
    _check(e, {"a": res["a"]}, 1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_outputs_do_not_depend_on_chunking_or_batch(dtype):
    """A query's output is bit-identical however its request is chunked and whatever else is in the
    batch (the position rule makes it the same function; float64 accumulation makes it the same
    bits). Without this, greedy tokens changed with preemption and prefix-cache hits in the engine."""

    def run(prefill, other=None):
        e = Engine(9, 3, 64, dtype, num_blocks=64, num_slots=8, seed=0)
        e.add("a", 420, slot=0)
        if other:  # a second request decoding next to a's 20 decode steps
            e.add("b", other, slot=1)
            e.step([("b", other - 20)])
        outs = [e.step([("a", c)])["a"][0] for c in prefill]
        outs += [e.step([("a", 1)] + ([("b", 1)] if other else []))["a"][0] for _ in range(20)]
        return torch.cat(outs)

    base = run([400])
    for prefill, other in (([100, 150, 150], None), ([256, 144], None), ([400], 300), ([127, 1, 272], 140)):
        assert torch.equal(run(prefill, other), base), (prefill, other)
