"""The V1 runner's residual-slot table (s4kv.residual.SlotTable) through the scheduler events it
sees: every live request holds exactly one slot, no two live requests share one, a slot comes back
when its request finishes or is preempted, rows that move keep their request's slot, and running
out of slots is an error naming the request, never a shared slot."""

import random

import numpy as np
import pytest

from s4kv.residual import SlotTable


def _live(table: SlotTable) -> dict:
    return {rid: table.slot_of(rid) for rid in list(table._slot_of)}


def _check_invariants(table: SlotTable, rows, row_req_ids):
    live = _live(table)
    assert len(set(live.values())) == len(live), live  # no slot shared
    assert all(0 <= s < table.num_request_slots for s in live.values())
    for slot, rid in zip(rows, row_req_ids):
        assert slot == (table.scratch if rid is None else live[rid])


def test_new_requests_get_distinct_slots_and_empty_rows_the_scratch_slot():
    t = SlotTable(4)
    rows = t.update(set(), None, ["a", "b", None, "c"])
    assert list(rows) == [0, 1, t.scratch, 2] and t.scratch == 4
    assert t.generation == 1


def test_rows_that_move_keep_their_requests_slot():
    t = SlotTable(4)
    first = dict(zip("abc", t.update(set(), None, ["a", "b", "c"])))
    rows = t.update(set(), None, ["c", "a", "b"])  # condense / swap_states reorder the batch
    assert list(rows) == [first["c"], first["a"], first["b"]]


def test_finished_and_new_in_one_step_reuse_the_freed_slot():
    t = SlotTable(2)
    t.update(set(), None, ["a", "b"])
    rows = t.update({"a"}, None, ["b", "d"])  # a finished, d arrives: the table is full without a's slot
    assert set(rows) == {0, 1} and t.slot_of("a") is None
    _check_invariants(t, rows, ["b", "d"])


def test_preempted_request_releases_its_slot_and_gets_one_when_it_resumes():
    t = SlotTable(2)
    t.update(set(), None, ["a", "b"])
    rows = t.update(set(), {"a"}, ["b", "c"])  # a preempted (recomputed later), c takes its slot
    _check_invariants(t, rows, ["b", "c"])
    t.update({"c"}, None, ["b"])
    rows = t.update(set(), None, ["b", "a"])  # a resumes: it restarts at a block boundary, any free slot
    _check_invariants(t, rows, ["b", "a"])


def test_an_aborted_id_resubmitted_in_the_same_step_holds_one_slot():
    t = SlotTable(2)
    t.update(set(), None, ["a", "b"])
    rows = t.update({"a"}, None, ["b", "a"])  # a aborted and a new request with the same id
    _check_invariants(t, rows, ["b", "a"])
    assert len(t) == 2


def test_running_out_of_slots_raises_naming_the_request():
    t = SlotTable(2)
    t.update(set(), None, ["a", "b"])
    with pytest.raises(RuntimeError, match="no free residual slot for request 'c': 2 slots"):
        t.update(set(), None, ["a", "b", "c"])


def test_random_schedules_never_share_a_slot():
    rng = random.Random(0)
    t = SlotTable(8)
    live: set[str] = set()
    order: list[str] = []
    next_id = 0
    for _ in range(2000):
        finished = {r for r in live if rng.random() < 0.15}
        preempted = {r for r in live - finished if rng.random() < 0.05}
        live -= finished | preempted
        order = [r for r in order if r in live]
        while len(live) < 8 and rng.random() < 0.6:  # arrivals, sometimes reusing a finished id
            if finished and rng.random() < 0.2:
                rid = rng.choice(sorted(finished))
            else:
                rid, next_id = f"r{next_id}", next_id + 1
            if rid not in live:
                live.add(rid)
                order.append(rid)
        rng.shuffle(order)  # rows move
        rows = t.update(finished, preempted, order)
        _check_invariants(t, rows, order)
        assert set(_live(t)) == live
    assert np.all(t.row_slots < t.scratch)
