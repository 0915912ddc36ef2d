"""tools/plan_time.py times each tree from its own source: a copy of s4kv whose chunk plan sleeps
2 ms shows up as such in its own column, next to this checkout's."""

from tool_timing import run_table, slowed_copy


def test_each_tree_is_timed_from_its_own_source(tmp_path):
    tree = slowed_copy(tmp_path, "kernels/chunk_plan.py", "    unit, ub = fmt.UNIT, fmt.UNIT_BLOCKS")
    rows = run_table("plan_time.py", "--repeat", "1", "--source", str(tree))
    assert len(rows) == 5, rows
    for this_plan, this_shapes, slow_plan, slow_shapes in rows.values():
        assert slow_plan > 2000 > this_plan > 0, rows
        assert 0 < this_shapes < 2000 and 0 < slow_shapes < 2000, rows
