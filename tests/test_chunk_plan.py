"""The chunk-attention plan (s4kv.kernels.chunk_plan) on hand-worked cases: query groups, the pages
each group reads, and waves that fit the scratch. Host arithmetic only (no kernels)."""

import numpy as np
import pytest

from s4kv import format as fmt
from s4kv.kernels.chunk_plan import EXACT, PAGE, plan_chunks, scratch_pages

BS = fmt.BLOCK_SIZE


def _plan(rows, first_row=0, capacity=None):
    """rows: (context before the step, new tokens) per batch row."""
    qsl = np.cumsum([0] + [n for _, n in rows])
    seq = np.array([c + n for c, n in rows])
    return plan_chunks(qsl, seq, first_row, capacity)


def _groups(w):
    """[(queries, keys, pages of the group as (kind, block))] of a wave."""
    out = []
    for i in range(len(w.seqused_k)):
        n_pages = -(-int(w.seqused_k[i]) // BS)
        pages = [tuple(w.jobs[p][[2, 1]]) for p in w.block_table[i][:n_pages]]
        out.append((int(w.cu_seqlens_q[i + 1] - w.cu_seqlens_q[i]), int(w.seqused_k[i]), pages))
    return out


def test_prompt_of_two_blocks_and_a_bit():
    # positions 0..290: groups g=0 (0..126), g=1 (127..254), g=2 (255..290)
    (w,) = _plan([(0, 291)])
    assert (w.tok0, w.tok1) == (0, 291)
    assert w.jobs.tolist() == [[0, 0, PAGE], [0, 1, PAGE], [0, 0, EXACT], [0, 1, EXACT], [0, 2, EXACT]]
    assert _groups(w) == [
        (127, 127, [(EXACT, 0)]),  # inside block 0: its own tokens exact
        (128, 255, [(PAGE, 0), (EXACT, 1)]),  # 127 (last of block 0) reads page 0; then block 1 exact
        (36, 291, [(PAGE, 0), (PAGE, 1), (EXACT, 2)]),
    ]


def test_chunk_ending_on_a_block_boundary_has_a_one_query_group():
    # context 100, 156 new: positions 100..255; 255 completes block 1 and reads it quantized
    (w,) = _plan([(100, 156)])
    assert _groups(w) == [(27, 127, [(EXACT, 0)]), (128, 255, [(PAGE, 0), (EXACT, 1)]),
                          (1, 256, [(PAGE, 0), (PAGE, 1)])]
    assert [tuple(j) for j in w.jobs] == [(0, 0, PAGE), (0, 1, PAGE), (0, 0, EXACT), (0, 1, EXACT)]


def test_chunk_starting_at_the_last_token_of_a_block_needs_no_exact_page_for_it():
    # context 127: the first query (127) already sees block 0 quantized, so block 0 needs no exact page
    (w,) = _plan([(127, 10)])
    assert _groups(w) == [(10, 137, [(PAGE, 0), (EXACT, 1)])]
    assert [tuple(j) for j in w.jobs] == [(0, 0, PAGE), (0, 1, EXACT)]


def test_decode_rows_before_first_row_are_skipped_and_empty_rows_too():
    waves = _plan([(500, 1), (40, 0), (300, 30)], first_row=1)
    (w,) = waves
    assert (w.tok0, w.tok1) == (1, 31)  # row 2's tokens follow row 0's single one
    assert {j[0] for j in w.jobs} == {2}
    assert _groups(w) == [(30, 330, [(PAGE, 0), (PAGE, 1), (EXACT, 2)])]


def test_waves_split_rows_to_fit_the_scratch():
    rows = [(3 * BS, 50), (BS, 200), (0, 20)]  # 3 + 1 pages, 2 + 2 pages, 0 + 1 pages
    assert sum(len(w.jobs) for w in _plan(rows)) == 9
    assert [(w.tok0, w.tok1, len(w.jobs)) for w in _plan(rows, capacity=5)] == [(0, 50, 4), (50, 270, 5)]
    waves = _plan(rows, capacity=4)
    assert [(w.tok0, w.tok1, len(w.jobs)) for w in waves] == [(0, 50, 4), (50, 250, 4), (250, 270, 1)]
    # every wave's block table points into its own pages only, and page ids restart per wave
    for w in waves:
        assert w.block_table.max() < len(w.jobs)
    with pytest.raises(RuntimeError, match="needs 4 scratch pages, 3 reserved"):
        _plan(rows, capacity=3)


def test_an_engines_scratch_holds_any_single_row():
    max_len, chunk = 32768, 8192
    cap = scratch_pages(max_len, chunk)
    for ctx, n in [(max_len - chunk, chunk), (max_len - chunk - 1, chunk), (max_len - 1, 1), (5, chunk)]:
        (w,) = _plan([(ctx, n)], capacity=cap)
        assert len(w.jobs) <= cap
