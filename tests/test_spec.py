"""The int4_kivi KV-cache spec and its manager, with vLLM's own block pool and registry: a
request's exact tail is pages vLLM allocates, counts and frees (s4kv.backend.spec)."""

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
    assert spec.max_num_blocks_per_req(None, 8192) == 63 + fmt.TAIL_BLOCKS
    assert spec.max_num_blocks_per_req(None, 8200) == 64 + fmt.TAIL_BLOCKS
    assert max(fmt.blocks_held(n) for n in range(8193)) == fmt.blocks_held(8192)


def test_blocks_held_never_falls_and_covers_the_old_tail_at_a_boundary():
    """A request's pages never shrink while it grows (vLLM's manager only adds), and at a block
    boundary it still holds the completed block's tail pages, which the store reads in that step."""
    bs, tb = fmt.BLOCK_SIZE, fmt.TAIL_BLOCKS
    held = [fmt.blocks_held(n) for n in range(4 * bs + 2)]
    assert held[0] == 0 and all(a <= b for a, b in itertools.pairwise(held))
    for m in (1, 2, 3):
        b = m - 1  # the block that completes at m * bs tokens, its tail in pages b .. b + tb - 1
        assert held[m * bs] == b + tb == held[m * bs - 1]
        assert held[m * bs + 1] == m + tb  # the next token: the next tail's pages


@pytest.mark.parametrize("tokens", [1, 127, 128, 300, 1000])
def test_a_request_holds_its_blocks_and_its_tail_pages_until_freed(tokens):
    pool, mgr = _manager(_spec(), num_blocks=64)
    free0 = pool.get_num_free_blocks()
    mgr.req_to_blocks["r"]  # a new request (defaultdict)
    blocks = mgr.allocate_new_blocks("r", tokens, tokens)
    assert len(blocks) == (tokens - 1) // 128 + fmt.TAIL_BLOCKS == fmt.blocks_held(tokens)
    assert pool.get_num_free_blocks() == free0 - len(blocks)
    # growing to the end of its block allocates nothing; the next block's first token, one page
    end = -(-tokens // 128) * 128
    assert mgr.allocate_new_blocks("r", end, 0) == []
    assert len(mgr.allocate_new_blocks("r", end + 1, 0)) == 1
    mgr.free("r")  # finished or preempted: the tail's pages go back with the rest
    assert pool.get_num_free_blocks() == free0


def test_tail_layout_fits_the_pages():
    for d in fmt.SUPPORTED_HEAD_SIZES:
        rows = fmt.tail_rows_per_region(d)
        assert rows * d * 2 <= fmt.PageLayout(d).region_bytes
        assert fmt.TAIL_BLOCKS * rows >= 2 * fmt.BLOCK_SIZE > (fmt.TAIL_BLOCKS - 1) * rows
    assert (fmt.tail_rows_per_region(128), fmt.tail_rows_per_region(64)) == (68, 69)


def test_tail_round_trip_through_the_pages():
    g = torch.Generator().manual_seed(0)
    regions = torch.randint(0, 256, (12, 2, fmt.PageLayout(64).region_bytes), dtype=torch.uint8, generator=g)
    pages = torch.tensor([[7, 2, 9, 4], [1, 11, 0, 5]])
    k = torch.randn(2, 100, 2, 64, generator=g).bfloat16()
    v = torch.randn(2, 100, 2, 64, generator=g).bfloat16()
    before = regions.clone()
    fmt.write_tail(regions, pages, torch.arange(100).expand(2, -1), k, v)
    rk, rv = fmt.read_tail(regions, pages, 100, torch.bfloat16)
    assert torch.equal(rk, k.transpose(1, 2)) and torch.equal(rv, v.transpose(1, 2))
    untouched = [b for b in range(12) if b not in pages.flatten().tolist()]
    assert torch.equal(regions[untouched], before[untouched])
