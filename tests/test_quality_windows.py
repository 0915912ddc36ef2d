"""tools/quality_windows.py: a pooled `s4kv bench quality` run split back into its windows (synthetic records)."""

import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import quality_windows


def _rec(kv, logprobs, top1, sizes):
    return {"id": f"quality-{kv}", "measurement": "quality", "metrics": {"window_positions": sizes},
            "raw": {"text_logprobs": logprobs, "text_top1": top1}}


def test_each_window_and_the_pooled_figure(tmp_path):
    sizes = [511, 511, 511]
    n = sum(sizes)
    ref_top = [i % 7 for i in range(n)]
    auto = _rec("auto", [-2.0] * n, ref_top, sizes)
    # window 2 alone loses 0.02 nats a position and misses every 4th top-1; windows 1 and 3 match auto
    lp = [-2.02 if 511 <= i < 1022 else -2.0 for i in range(n)]
    top = [t + (511 <= i < 1022 and i % 4 == 0) for i, t in enumerate(ref_top)]
    kivi = _rec("int4_kivi", lp, top, sizes)
    rows = quality_windows.rows(kivi, auto)
    assert [r[0] for r in rows] == ["1", "2", "3", "all"]
    assert rows[0][1] == 0.0 and rows[0][3] == 1.0 and rows[2][3] == 1.0
    assert math.isclose(rows[1][1], 100 * math.expm1(0.02), rel_tol=1e-9)
    assert math.isclose(rows[1][3], 1 - sum(i % 4 == 0 for i in range(511, 1022)) / 511, rel_tol=1e-12)
    assert math.isclose(rows[3][1], 100 * math.expm1(0.02 / 3), rel_tol=1e-9)
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in (auto, kivi)))
    out = subprocess.run([sys.executable, str(ROOT / "tools/quality_windows.py"), str(path)],
                         capture_output=True, text=True, check=True).stdout
    assert "| quality-int4_kivi | 2 | +2.020% ±" in out and "| quality-int4_kivi | all |" in out


def test_refuses_records_of_different_windows():
    auto = _rec("auto", [-2.0] * 512, [0] * 512, [256, 256])
    kivi = _rec("int4_kivi", [-2.0] * 512, [0] * 512, [512])
    try:
        quality_windows.rows(kivi, auto)
    except SystemExit as e:
        assert "different windows" in str(e)
    else:
        raise AssertionError("windows that differ were compared")
