"""tools/quality_paired.py (B against A, position by position) and tools/quality_floor.py (one run's bf16
against another's), on synthetic `s4kv bench quality` records."""

import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import quality_floor
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


def test_the_other_bf16_and_the_positions_where_both_agree(tmp_path):
    n = 640
    ref_top = [i % 7 for i in range(n)]
    auto_a = _rec("auto", [-2.0] * n, ref_top, [[1, 2, 3], [4, 5, 6]])
    # the other implementation: every 10th top-1 differs, 0.01 nats worse, one greedy run differs
    other_top = [t + 1 if i % 10 == 0 else t for i, t in enumerate(ref_top)]
    auto_b = _rec("auto", [-2.01] * n, other_top, [[1, 2, 3], [4, 5, 0]])
    # the cache misses every 5th position: half of its misses fall where the two bf16 disagree
    cache = _rec("int4_kivi", [-2.0] * n, [t + 2 if i % 5 == 0 else t for i, t in enumerate(ref_top)], [[1, 2, 3], [4, 5, 6]])
    f = quality_floor.against(auto_b, auto_a)
    assert math.isclose(f["ppl_pct"], 100 * math.expm1(0.01), rel_tol=1e-9)
    assert math.isclose(f["top1"], 0.9, rel_tol=1e-9) and f["greedy"]["identical_sequences"] == 1
    agree, kept = quality_floor.top1_where_references_agree(cache, auto_a, auto_b)
    assert kept == n - n // 10
    # of the 576 kept positions, the multiples of 5 that are not multiples of 10 are missed: 64
    assert math.isclose(agree, 1 - 64 / 576, rel_tol=1e-9)
    out = subprocess.run([sys.executable, str(ROOT / "tools/quality_floor.py"),
                          _run(tmp_path / "a.jsonl", [auto_a, cache, dict(auto_a, id="quality-auto-r2")]),
                          _run(tmp_path / "b.jsonl", [auto_b])], capture_output=True, text=True, check=True).stdout
    b_row = next(line for line in out.splitlines() if line.startswith("| B: quality-auto"))
    assert b_row.startswith("| B: quality-auto | A's bf16 | +1.005% ± 0.000 | 0.9000 ± ") and "| 1/2 |" in b_row
    assert "| A: quality-int4_kivi | B's bf16 |" in out and "auto-r2" not in out


def test_floor_refuses_runs_of_different_texts(tmp_path):
    a = _rec("auto", [-2.0] * 640, [0] * 640, [[1]])
    b = _rec("auto", [-2.0] * 320, [0] * 320, [[1]])
    p = subprocess.run([sys.executable, str(ROOT / "tools/quality_floor.py"), _run(tmp_path / "a.jsonl", [a]),
                        _run(tmp_path / "b.jsonl", [b])], check=False, capture_output=True, text=True)
    assert p.returncode == 2 and "different texts" in p.stderr


def test_runs_without_greedy_generations(tmp_path):
    """`--prompts none` runs (perplexity and top-1 only) pair too; greedy shows as "–"."""
    n = 640
    auto = _rec("auto", [-2.0] * n, [0] * n, [])
    a = _rec("int4_kivi", [-2.01] * n, [0] * n, [])
    b = _rec("int4_kivi", [-2.0] * n, [0] * n, [])
    assert quality_paired.paired(a, b, auto)["greedy_a"] is None
    out = subprocess.run([sys.executable, str(ROOT / "tools/quality_paired.py"), _run(tmp_path / "a.jsonl", [auto, a]),
                          _run(tmp_path / "b.jsonl", [auto, b])], capture_output=True, text=True, check=True).stdout
    assert "identical greedy – -> – |" in out
    out = subprocess.run([sys.executable, str(ROOT / "tools/quality_floor.py"), _run(tmp_path / "c.jsonl", [auto, a]),
                          _run(tmp_path / "d.jsonl", [auto])], capture_output=True, text=True, check=True).stdout
    assert "| B: quality-auto | A's bf16 | +0.000% ± 0.000 | 1.0000 ± 0.0000 | – |" in out
