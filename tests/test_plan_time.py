"""tools/plan_time.py times the tree it is pointed at: a copy of s4kv whose chunk plan sleeps 2 ms
shows up as such in its own column, next to this checkout's."""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_each_tree_is_timed_from_its_own_source(tmp_path):
    shutil.copytree(ROOT / "s4kv", tmp_path / "s4kv", ignore=shutil.ignore_patterns("__pycache__"))
    plan = tmp_path / "s4kv" / "kernels" / "chunk_plan.py"
    text = plan.read_text()
    head = "def plan_chunks(query_start_loc"
    assert head in text
    plan.write_text(text.replace(head, "import time as _t\n\n\ndef plan_chunks(query_start_loc", 1).replace(
        '    unit, ub = fmt.UNIT, fmt.UNIT_BLOCKS\n', '    unit, ub = fmt.UNIT, fmt.UNIT_BLOCKS\n    _t.sleep(0.002)\n', 1))
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "plan_time.py"), "--repeat", "1", "--source",
                          str(tmp_path)], capture_output=True, text=True, check=True).stdout
    rows = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| ") and "µs" not in line]
    assert len(rows) == 5, out
    for name, this_plan, this_shapes, slow_plan, slow_shapes in rows:
        assert float(slow_plan) > 2000 > float(this_plan) > 0, out
        assert 0 < float(this_shapes) < 2000 and 0 < float(slow_shapes) < 2000, out
