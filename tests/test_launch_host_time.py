"""tools/launch_host_time.py times each tree's own wrappers: a copy of s4kv whose append_window
sleeps 2 ms shows up as such in its own column, next to this checkout's (kernels compiled for sm90
with the tests' Triton, launched by a launcher that does nothing)."""

from tool_timing import run_table, slowed_copy


def test_each_tree_is_timed_from_its_own_source(tmp_path):
    tree = slowed_copy(tmp_path, "kernels/store.py", "    num_rows = md.num_reqs - first_row")
    rows = run_table("launch_host_time.py", "--repeat", "3", "--wrappers", "append,store", "--source", str(tree))
    assert set(rows) == {"append", "store", "total"}, rows
    assert rows["append"][1] > 2000 > rows["append"][0] > 0, rows  # [this, the copy]
    assert 0 < rows["store"][0] < 2000 and 0 < rows["store"][1] < 2000, rows


def test_group_pad_is_tritons_next_power_of_two_at_least_16():
    import triton

    from s4kv.kernels import group_pad

    assert [group_pad(g) for g in range(1, 300)] == [max(16, triton.next_power_of_2(g)) for g in range(1, 300)]
