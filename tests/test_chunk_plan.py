"""The chunk-attention plan (s4kv.kernels.chunk_plan) on hand-worked cases: query groups, the pages
each group reads, and waves that fit the scratch. Host arithmetic only (no kernels)."""

import numpy as np
import pytest

from s4kv import format as fmt
from s4kv.kernels.chunk_plan import PAGE, WINDOW, plan_chunks, scratch_pages

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

def test_prompt_of_two_units_and_a_bit():
    # positions 0..580: groups g=0 (0..254), g=1 (255..510), g=2 (511..580)
    (w,) = _plan([(0, 581)])
    assert (w.tok0, w.tok1) == (0, 581)
    assert [tuple(j) for j in w.jobs] == [(0, b, PAGE) for b in range(4)] + [(0, b, WINDOW) for b in range(5)]
    assert _groups(w) == [
        (255, 255, [(WINDOW, 0), (WINDOW, 1)]),  # inside unit 0: its rows
        (256, 511, [(PAGE, 0), (PAGE, 1), (WINDOW, 2), (WINDOW, 3)]),  # 255 (last of unit 0) reads its pages
        (70, 581, [(PAGE, 0), (PAGE, 1), (PAGE, 2), (PAGE, 3), (WINDOW, 4)]),
    ]


def test_chunk_ending_on_a_unit_boundary_has_a_one_query_group():
    # context 100, 412 new: positions 100..511; 511 completes unit 1 and reads it from pages
    (w,) = _plan([(100, 412)])
    assert _groups(w) == [(155, 255, [(WINDOW, 0), (WINDOW, 1)]),
                          (256, 511, [(PAGE, 0), (PAGE, 1), (WINDOW, 2), (WINDOW, 3)]),
                          (1, 512, [(PAGE, 0), (PAGE, 1), (PAGE, 2), (PAGE, 3)])]
    assert [tuple(j) for j in w.jobs] == [(0, b, PAGE) for b in range(4)] + [(0, b, WINDOW) for b in range(4)]


def test_chunk_starting_at_the_last_token_of_a_unit_reads_no_rows_of_it():
    # context 255: the first query (255) already sees unit 0 from pages
    (w,) = _plan([(255, 10)])
    assert _groups(w) == [(10, 265, [(PAGE, 0), (PAGE, 1), (WINDOW, 2)])]
    assert [tuple(j) for j in w.jobs] == [(0, 0, PAGE), (0, 1, PAGE), (0, 2, WINDOW)]


def test_decode_rows_before_first_row_are_skipped_and_empty_rows_too():
    waves = _plan([(500, 1), (40, 0), (300, 30)], first_row=1)
    (w,) = waves
    assert (w.tok0, w.tok1) == (1, 31)  # row 2's tokens follow row 0's single one
    assert {j[0] for j in w.jobs} == {2}
    assert _groups(w) == [(30, 330, [(PAGE, 0), (PAGE, 1), (WINDOW, 2)])]


def test_waves_split_rows_to_fit_the_scratch():
    rows = [(3 * BS, 50), (BS, 200), (0, 20)]  # 2 + 2 pages, 2 + 3 pages, 0 + 1 pages
    assert sum(len(w.jobs) for w in _plan(rows)) == 10
    assert [(w.tok0, w.tok1, len(w.jobs)) for w in _plan(rows, capacity=6)] == [(0, 50, 4), (50, 270, 6)]
    waves = _plan(rows, capacity=5)
    assert [(w.tok0, w.tok1, len(w.jobs)) for w in waves] == [(0, 50, 4), (50, 250, 5), (250, 270, 1)]
    # every wave's block table points into its own pages only, and page ids restart per wave
    for w in waves:
        assert w.block_table.max() < len(w.jobs)
    with pytest.raises(RuntimeError, match="needs 5 scratch pages, 4 reserved"):
        _plan(rows, capacity=4)



def test_an_engines_scratch_holds_any_single_row():
    max_len, chunk = 32768, 8192
    cap = scratch_pages(max_len, chunk)
    for ctx, n in [(max_len - chunk, chunk), (max_len - chunk - 1, chunk), (max_len - chunk - 255, chunk),
                   (max_len - 1, 1), (5, chunk), (255, chunk)]:
        (w,) = _plan([(ctx, n)], capacity=cap)
        assert len(w.jobs) <= cap


def _plan_by_position(rows, first_row, capacity):
    """The plan built query by query from the position rule (the implementation before the closed
    forms, kept as the reference): a query at p reads blocks below floor((p + 1) / UNIT) * UNIT /
    BLOCK_SIZE from pages and the blocks of its own unit up to itself from window rows; queries that
    read the same pages form a group."""
    unit, ub = fmt.UNIT, fmt.UNIT_BLOCKS
    qsl = np.cumsum([0] + [n for _, n in rows])
    waves, cur = [], None
    for r in range(first_row, len(rows)):
        ctx, qlen = rows[r]
        if qlen == 0:
            continue
        seq = ctx + qlen
        by_g: dict[int, list[int]] = {}
        for p in range(ctx, seq):
            by_g.setdefault((p + 1) // unit, []).append(p)
        n_full = seq // unit * ub
        groups = [(g, ps[-1], [b for b in range(ub * g, ub * g + ub) if b * BS <= ps[-1]]) for g, ps in by_g.items()]
        window = sorted({b for _, _, bl in groups for b in bl})
        need = n_full + len(window)
        if cur is None or (capacity is not None and len(cur["jobs"]) + need > capacity):
            cur = {"tok0": int(qsl[r]), "row0": r, "jobs": [], "cu": [0], "used": [], "pages": [], "new": 0}
            waves.append(cur)
        base = len(cur["jobs"])
        cur["jobs"] += [(r, b, PAGE) for b in range(n_full)] + [(r, b, WINDOW) for b in window]
        for g, last, bl in groups:
            cur["pages"].append(list(range(base, base + ub * g)) + [base + n_full + window.index(b) for b in bl])
            cur["cu"].append(cur["cu"][-1] + len(by_g[g]))
            cur["used"].append(last + 1)
        cur["tok1"], cur["row1"] = int(qsl[r + 1]), r + 1
        cur["new"] = max(cur["new"], n_full - ctx // unit * ub)
    return waves


def test_the_plan_is_the_position_rule_query_by_query_on_random_batches():
    rng = np.random.default_rng(0)
    for trial in range(300):
        n = int(rng.integers(1, 9))
        rows = []
        for _ in range(n):
            ctx = int(rng.choice([0, int(rng.integers(0, 6000)), int(rng.integers(1, 20)) * fmt.UNIT - 1,
                                  int(rng.integers(1, 20)) * fmt.UNIT]))
            qlen = int(rng.choice([0, 1, int(rng.integers(1, 700)), fmt.UNIT - ctx % fmt.UNIT]))
            rows.append((ctx, qlen))
        first_row = int(rng.integers(0, n))
        capacity = None if trial % 3 == 0 else int(rng.choice([40, 120]))
        ref = _plan_by_position(rows, first_row, capacity)
        if capacity is not None and any(n_full_plus_window > capacity for n_full_plus_window in
                                        (len(w["jobs"]) for w in ref)):
            continue  # a row that needs more than the scratch: the plan refuses it (test_waves_split...)
        got = _plan(rows, first_row, capacity)
        assert len(got) == len(ref), rows
        for w, r in zip(got, ref):
            assert (w.tok0, w.tok1, w.row0, w.row1, w.max_new_blocks) == (r["tok0"], r["tok1"], r["row0"], r["row1"],
                                                                         r["new"]), rows
            assert [tuple(j) for j in w.jobs] == r["jobs"], rows
            kinds = [j[2] for j in r["jobs"]]
            assert (w.page_jobs, w.window_jobs) == (kinds.count(PAGE), kinds.count(WINDOW)), rows
            assert w.cu_seqlens_q.tolist() == r["cu"] and w.seqused_k.tolist() == r["used"], rows
            width = max(len(p) for p in r["pages"])
            assert w.block_table.shape == (len(r["pages"]), width), rows
            assert w.block_table.tolist() == [p + [0] * (width - len(p)) for p in r["pages"]], rows
            assert all(a.dtype == np.int32 for a in (w.jobs, w.cu_seqlens_q, w.seqused_k, w.block_table))


def test_a_wave_of_prompts_shorter_than_a_unit_has_no_page_jobs():
    """Such a step reads no complete unit: chunk attention launches no page stage for it."""
    (w,) = plan_chunks(np.array([0, 90, 290], dtype=np.int32), np.array([90, 200], dtype=np.int32), 0, None)
    assert (w.page_jobs, w.window_jobs) == (0, len(w.jobs)) and len(w.jobs) > 0
    (w,) = plan_chunks(np.array([0, 300], dtype=np.int32), np.array([300], dtype=np.int32), 0, None)
    assert w.page_jobs == fmt.UNIT_BLOCKS
