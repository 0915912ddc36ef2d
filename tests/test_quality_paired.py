"""tools/quality_paired.py: B against A, position by position, on synthetic `s4kv bench quality` records."""

import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import quality_paired


def _rec(kv, logprobs, top1, greedy):
    return {"id": f"quality-{kv}", "measurement": "quality",
            "raw": {"text_logprobs": logprobs, "text_top1": top1, "greedy_tokens": greedy}}


def _run(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def test_b_better_than_a_by_a_known_margin(tmp_path):
    n = 640
    ref_top = [i % 7 for i in range(n)]
    auto = _rec("auto", [-2.0] * n, ref_top, [[1, 2, 3], [4, 5, 6]])
    # A misses every 10th top-1 and loses 0.01 nats everywhere; B misses every 20th, loses nothing
    a = _rec("int4_kivi", [-2.01] * n, [t + (i % 10 == 0) for i, t in enumerate(ref_top)], [[1, 2, 0], [4, 5, 6]])
    b = _rec("int4_kivi", [-2.0] * n, [t + (i % 20 == 0) for i, t in enumerate(ref_top)], [[1, 2, 3], [4, 5, 6]])
    r = quality_paired.paired(a, b, auto)
    assert math.isclose(r["ppl_b_vs_a_pct"], 100 * math.expm1(-0.01), rel_tol=1e-9)
    assert math.isclose(r["top1_b_minus_a"], 0.05, rel_tol=1e-9)
    assert r["greedy_a"]["identical_sequences"] == 1 and r["greedy_b"]["identical_sequences"] == 2
    out = subprocess.run([sys.executable, str(ROOT / "tools/quality_paired.py"), _run(tmp_path / "a.jsonl", [auto, a]),
                          _run(tmp_path / "b.jsonl", [auto, b])], capture_output=True, text=True, check=True).stdout
    assert "top-1 agreement +0.0500" in out and "1/2 -> 2/2" in out


def test_refuses_runs_whose_bf16_differs(tmp_path):
    n = 640
    auto_a = _rec("auto", [-2.0] * n, [0] * n, [[1]])
    auto_b = _rec("auto", [-2.0] * (n - 1) + [-2.5], [0] * n, [[1]])
    x = _rec("int4_kivi", [-2.0] * n, [0] * n, [[1]])
    p = subprocess.run([sys.executable, str(ROOT / "tools/quality_paired.py"), _run(tmp_path / "a.jsonl", [auto_a, x]),
                        _run(tmp_path / "b.jsonl", [auto_b, x])], check=False, capture_output=True, text=True)
    assert p.returncode == 2 and "differ" in p.stderr
