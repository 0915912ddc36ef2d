"""tools/launch_host_time.py times each tree's own wrappers: a copy of s4kv whose append_window
sleeps 2 ms shows up as such in its own column, next to this checkout's (kernels compiled for sm90
with the tests' Triton, launched by a launcher that does nothing)."""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_each_tree_is_timed_from_its_own_source(tmp_path):
    shutil.copytree(ROOT / "s4kv", tmp_path / "s4kv", ignore=shutil.ignore_patterns("__pycache__"))
    store = tmp_path / "s4kv" / "kernels" / "store.py"
    text = store.read_text()
    head = "    num_rows = md.num_reqs - first_row\n"
    assert text.count(head) == 1
    store.write_text(text.replace(head, "    __import__('time').sleep(0.002)\n" + head))
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "launch_host_time.py"), "--repeat", "3",
                          "--wrappers", "append,store", "--source", str(tmp_path)],
                         capture_output=True, text=True, check=True).stdout
    rows = {line.split("|")[1].strip(): [float(x) for x in line.split("|")[2:4]]
            for line in out.splitlines() if line.startswith("| ") and "wrapper" not in line}
    assert set(rows) == {"append", "store", "total"}, out
    assert rows["append"][1] > 2000 > rows["append"][0] > 0, out  # [this, the copy]
    assert 0 < rows["store"][0] < 2000 and 0 < rows["store"][1] < 2000, out
