"""The int4_kivi KV-cache spec and its manager, with vLLM's own block pool and registry: a
request's window is pages vLLM allocates, counts and frees (s4kv.backend.spec)."""

import itertools

import pytest
import torch

from s4kv import format as fmt

pytest.importorskip("vllm")


def _spec(num_kv_heads=4, head_size=128):
    from s4kv.backend.spec import S4KVFullAttentionSpec

    return S4KVFullAttentionSpec(block_size=fmt.BLOCK_SIZE, num_kv_heads=num_kv_heads, head_size=head_size,
                                 head_size_v=head_size, dtype=torch.uint8,
                                 state_content_bytes=fmt.bytes_per_token_per_head(head_size))


def _manager(spec, num_blocks):
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.single_type_kv_cache_manager import get_manager_for_kv_cache_spec

    pool = BlockPool(num_gpu_blocks=num_blocks, enable_caching=False, hash_block_size=fmt.BLOCK_SIZE)
    return pool, get_manager_for_kv_cache_spec(spec, max_in_flight_tokens=8192, max_model_len=8192,
                                               block_pool=pool, enable_caching=False, kv_cache_group_id=0,
                                               scheduler_block_size=fmt.BLOCK_SIZE)


def test_the_registry_gives_int4_kivi_specs_the_tail_manager_and_keeps_vllms_own():
    from vllm.v1.core.single_type_kv_cache_manager import FullAttentionManager
    from vllm.v1.kv_cache_interface import FullAttentionSpec
    from vllm.v1.kv_cache_spec_registry import KVCacheSpecRegistry

    from s4kv.backend.spec import S4KVAttentionManager

    assert KVCacheSpecRegistry.get_manager_class(_spec()) is S4KVAttentionManager
    plain = FullAttentionSpec(block_size=16, num_kv_heads=4, head_size=128, head_size_v=128, dtype=torch.bfloat16)
    assert KVCacheSpecRegistry.get_manager_class(plain) is FullAttentionManager
    assert KVCacheSpecRegistry.get_uniform_type_base_spec(_spec()) is FullAttentionSpec


def test_page_size_and_per_request_bounds():
    spec = _spec()
    assert spec.page_size_bytes == fmt.page_size_bytes(4, 128) == 4 * 128 * 136
    # the workers' block table and vLLM's "fits one request" check include the tail's pages: the
    # most a request of at most 8192 tokens ever holds is at 8191 (64 at 8192, whose tail is empty)
    assert spec.max_num_blocks_per_req(None, 8192) == 63 + fmt.WINDOW_PAGES
    assert spec.max_num_blocks_per_req(None, 8200) == 64 + fmt.WINDOW_PAGES
    assert max(fmt.blocks_held(n) for n in range(8193)) == fmt.blocks_held(8192)


def test_blocks_held_never_falls_and_covers_the_window():
    """A request's pages never shrink while it grows (vLLM's manager only adds); while its window
    has rows it holds the window's pages, and at a unit boundary it still holds the completed
    unit's window pages, which the store reads in that step."""
    bs, unit, wp = fmt.BLOCK_SIZE, fmt.UNIT, fmt.WINDOW_PAGES
    held = [fmt.blocks_held(n) for n in range(4 * unit + 2)]
    assert held[0] == 0 and all(a <= b for a, b in itertools.pairwise(held))
    for n in range(1, len(held)):
        u = n // unit if n % unit else n // unit - 1  # the window this step writes or (boundary) reads
        assert held[n] >= unit // bs * u + wp, n
    for m in (1, 2, 3):
        assert held[m * unit] == held[m * unit - 1]
        assert held[m * unit + 1] == held[m * unit] + 1  # the next token: the next window's last page


@pytest.mark.parametrize("tokens", [1, 127, 128, 300, 1000])
def test_a_request_holds_its_blocks_and_its_tail_pages_until_freed(tokens):
    pool, mgr = _manager(_spec(), num_blocks=64)
    free0 = pool.get_num_free_blocks()
    mgr.req_to_blocks["r"]  # a new request (defaultdict)
    blocks = mgr.allocate_new_blocks("r", tokens, tokens)
    assert len(blocks) == (tokens - 1) // 128 + fmt.WINDOW_PAGES == fmt.blocks_held(tokens)
    assert pool.get_num_free_blocks() == free0 - len(blocks)
    # growing to the end of its block allocates nothing; the next block's first token, one page
    end = -(-tokens // 128) * 128
    assert mgr.allocate_new_blocks("r", end, 0) == []
    assert len(mgr.allocate_new_blocks("r", end + 1, 0)) == 1
    mgr.free("r")  # finished or preempted: the tail's pages go back with the rest
    assert pool.get_num_free_blocks() == free0


def test_window_layout_fits_the_pages():
    for d in fmt.SUPPORTED_HEAD_SIZES:
        assert fmt.WindowLayout(d).nbytes <= fmt.PageLayout(d).region_bytes
        assert fmt.WINDOW_PAGES * fmt.WINDOW_SLOTS == fmt.UNIT
    assert (fmt.WindowLayout(128).nbytes, fmt.WindowLayout(64).nbytes) == (16640, 8448)


def test_each_window_row_has_its_own_slot_and_a_block_page_holds_only_that_block_rows():
    """What lets the block store quantize a unit's blocks at once (s4kv.kernels.store): every window
    row has a (page, slot) of its own, and the page block j of the unit is stored into (the window's
    page j) holds rows of block j only; block j's rows are in pages j, j + UNIT_BLOCKS, ..."""
    rows = torch.arange(fmt.UNIT)
    page = fmt.window_page(rows)
    slots = page * fmt.WINDOW_SLOTS + rows % fmt.WINDOW_SLOTS
    assert sorted(slots.tolist()) == list(range(fmt.WINDOW_PAGES * fmt.WINDOW_SLOTS))
    block = rows // fmt.BLOCK_SIZE
    for j in range(fmt.UNIT_BLOCKS):
        assert set(block[page == j].tolist()) == {j}
        assert set(page[block == j].tolist()) == set(range(j, fmt.WINDOW_PAGES, fmt.UNIT_BLOCKS))
    assert [fmt.window_page(r) for r in (0, 63, 64, 127, 128, 191, 192, 255)] == [0, 0, 2, 2, 1, 1, 3, 3]


def test_window_round_trip_through_the_pages():
    g = torch.Generator().manual_seed(0)
    regions = torch.randint(0, 256, (12, 2, fmt.PageLayout(64).region_bytes), dtype=torch.uint8, generator=g)
    pages = torch.tensor([[7, 2, 9, 4], [1, 11, 0, 5]])
    k = torch.randn(2, 200, 2, 64, generator=g).bfloat16()
    v = torch.randn(2, 200, 2, 64, generator=g).bfloat16()
    (kc, ks), (vc, vs) = fmt.quantize_window(k), fmt.quantize_window(v)
    before = regions.clone()
    fmt.write_window(regions, pages, torch.arange(200).expand(2, -1), kc, ks, vc, vs)
    rk, rv = fmt.read_window(regions, pages, 200)
    assert torch.equal(rk, fmt.dequantize_window(kc, ks).transpose(1, 2))
    assert torch.equal(rv, fmt.dequantize_window(vc, vs).transpose(1, 2))
    untouched = [b for b in range(12) if b not in pages.flatten().tolist()]
    assert torch.equal(regions[untouched], before[untouched])
    # 8 bits of the rotated token, against its exact value
    assert (rk - fmt.rotate(k).transpose(1, 2)).abs().max() <= fmt.rotate(k).abs().max() / 255 * 1.01
