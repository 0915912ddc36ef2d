"""Helpers of the tests of the timing tools (tools/plan_time.py, tools/launch_host_time.py), which
time this checkout's s4kv next to another tree's: a copy of s4kv made measurably slower in one
place, and the tools' result table read back."""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def slowed_copy(tmp_path: Path, module: str, anchor: str, seconds: float = 0.002) -> Path:
    """A copy of s4kv under tmp_path whose `module` (a path inside s4kv) sleeps `seconds` before the
    line `anchor` (one in the file, whole, with its indent); returns the tree for --source."""
    shutil.copytree(ROOT / "s4kv", tmp_path / "s4kv", ignore=shutil.ignore_patterns("__pycache__"))
    path = tmp_path / "s4kv" / module
    text = path.read_text()
    assert text.count(anchor + "\n") == 1, f"{anchor!r} is not one line of {module}"
    indent = anchor[:len(anchor) - len(anchor.lstrip())]
    path.write_text(text.replace(anchor + "\n", f"{indent}__import__('time').sleep({seconds})\n{anchor}\n"))
    return tmp_path


def run_table(tool: str, *args: str) -> dict[str, list[float]]:
    """Run tools/<tool> and read its markdown table: first cell -> the numbers of the other cells."""
    out = subprocess.run([sys.executable, str(ROOT / "tools" / tool), *args], capture_output=True, text=True,
                         check=True).stdout
    rows = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.split("|")[1:-1]]
        if line.startswith("| ") and cells and all(_is_number(c) for c in cells[1:]):
            rows[cells[0]] = [float(c) for c in cells[1:]]
    assert rows, out
    return rows


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True
