"""tools/decode_window.py: the speed bench's decode window against a steady decode step, per dtype."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import decode_window


def _record(kv: str, wall: float, kernels: dict, idle: float | None, steps: int) -> dict:
    rec = {"kv_cache_dtype": kv, "model": "dummy:qwen2.5-7b", "context": 8192, "batch": 32, "steps": steps,
           "step_wall_us": wall, "kernels_us_per_step": kernels, "device": "test"}
    if idle is not None:
        rec["gpu_idle_us"] = idle
    return rec


# steady steps, and the window's: the model's kernels shrink a little (shorter rows while prompts
# still prefill), int4_kivi's block store and stage kernel grow, bf16's FlashAttention gains a variant
STEADY = [_record("int4_kivi", 6000.0, {"gemm": 4000.0, "_decode_kernel": 1500.0, "_store_blocks_kernel": 40.0}, 200.0, 64),
          _record("auto", 8400.0, {"gemm": 4000.0, "flash_fwd": 4100.0}, 150.0, 64)]
WINDOW = [_record("int4_kivi", 6500.0, {"gemm": 3900.0, "_decode_kernel": 1550.0, "_store_blocks_kernel": 220.0,
                                        "_stage_kernel": 60.0}, 400.0, 256),
          _record("auto", 8600.0, {"gemm": 3900.0, "flash_fwd": 4200.0, "flash_fwd_mixed": 150.0}, 250.0, 256)]


def test_a_window_step_splits_into_the_model_the_idle_time_and_attention():
    c = decode_window.compare(STEADY[0], WINDOW[0])
    assert c["excess"]["wall"] == 500.0
    assert c["excess"]["rest"] == -100.0 and c["excess"]["idle"] == 200.0
    assert c["excess"]["attention"] == pytest.approx(500.0 + 100.0 - 200.0)


def test_the_ratio_at_bf16s_excess_keeps_int4s_steady_step_plus_bf16s_growth():
    a = decode_window.compare(STEADY[0], WINDOW[0])
    b = decode_window.compare(STEADY[1], WINDOW[1])
    wc = decode_window.window_cost(a, b)
    assert wc["steady_ratio"] == pytest.approx(8400 / 6000)
    assert wc["window_ratio"] == pytest.approx(8600 / 6500)
    assert wc["ratio_at_bf16_excess"] == pytest.approx(8600 / (6000 + 200))
    assert wc["extra_excess_us"] == pytest.approx(300.0)


def test_the_kernels_that_moved_most_come_first():
    moved = decode_window.kernel_deltas(STEADY[0], WINDOW[0], top=2)
    assert [k for k, _, _ in moved] == ["_store_blocks_kernel", "gemm"]
    assert moved[0][1:] == (40.0, 220.0)


def test_report_over_files(tmp_path, capsys):
    s, w = tmp_path / "steady.json", tmp_path / "window.json"
    s.write_text(json.dumps(STEADY))
    w.write_text(json.dumps(WINDOW))
    assert decode_window.main(["--steady", str(s), "--window", str(w), "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "excess    +500" in out and "with bf16's excess in the window 1.387x" in out
    assert "+300 us per step (+10.7 per layer)" in out  # Qwen2.5-7B's 28 layers
    assert "no idle time recorded" not in out


def test_missing_idle_time_is_said(tmp_path, capsys):
    s, w = tmp_path / "steady.json", tmp_path / "window.json"
    s.write_text(json.dumps([_record("int4_kivi", 6000.0, {"gemm": 4000.0}, None, 32), STEADY[1]]))
    w.write_text(json.dumps(WINDOW))
    assert decode_window.main(["--steady", str(s), "--window", str(w)]) == 0
    assert "no idle time recorded for int4_kivi steady" in capsys.readouterr().out


def test_files_without_both_dtypes_at_one_point_are_refused(tmp_path, capsys):
    s, w = tmp_path / "steady.json", tmp_path / "window.json"
    s.write_text(json.dumps(STEADY[:1]))
    w.write_text(json.dumps(WINDOW))
    assert decode_window.main(["--steady", str(s), "--window", str(w)]) == 1
    assert "no point with int4_kivi and auto" in capsys.readouterr().err
