"""tools/decode_ceiling.py: the bound on int4_kivi's decode step against bf16's from profiled steps."""

import json
import sys
from pathlib import Path

import pytest

from s4kv import format as fmt

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import decode_ceiling


def _record(kv: str, wall: float, kernels: dict, idle: float, context=32704, batch=8, steps=32) -> dict:
    return {"kv_cache_dtype": kv, "model": "dummy:qwen2.5-7b", "context": context, "batch": batch, "steps": steps,
            "step_wall_us": wall, "kernels_us_per_step": kernels, "gpu_idle_us": idle, "device": "test"}


# a step of each dtype: the model's own kernels (same names for both), the attention path's, and
# the reduction's duration overlapping the page kernel's (programmatic launch)
INT4 = _record("int4_kivi", 6200.0, {"nvjet_sm90_gemm": 4000.0, "triton_poi_fused_3": 267.0, "_decode_kernel": 1435.0,
                                     "_reduce_kernel": 400.0, "_quantize_rows_kernel": 145.0,
                                     "_store_blocks_kernel": 29.0}, 304.0)
BF16 = _record("auto", 8247.0, {"nvjet_sm90_gemm": 4000.0, "triton_poi_fused_3": 276.0,
                                "void cutlass::device_kernel<flash::FlashAttnFwdSm90<...>>": 3768.0,
                                "void vllm::reshape_and_cache_flash_kernel<...>": 61.0}, 142.0)


def test_attention_is_the_wall_time_the_model_and_idle_leave():
    a = decode_ceiling.split_step(INT4)
    assert a["rest"] == 4267.0 and a["idle"] == 304.0
    assert a["attention"] == pytest.approx(6200.0 - 4267.0 - 304.0)
    assert a["attention_kernel_sum"] == pytest.approx(1435.0 + 400.0 + 145.0 + 29.0)  # overlaps counted twice
    b = decode_ceiling.split_step(BF16)
    assert b["rest"] == 4276.0 and b["attention_kernel_sum"] == pytest.approx(3829.0)


def test_ceiling_reads_the_format_bytes_at_copy_bandwidth():
    copy = 4.27e12
    c = decode_ceiling.ceiling(INT4, BF16, copy, [1.4, 1.5])
    tokens = 8 * (32704 + 16)  # the sequences' mean length over the 32 profiled steps
    floor_us = tokens * 4 * fmt.bytes_per_token_per_head(128) / copy * 1e6
    assert fmt.bytes_per_token_per_head(128) == 136
    assert c["kv_copy_us_per_layer"] == pytest.approx(floor_us)
    assert c["ceiling_ratio"] == pytest.approx(8247.0 / (4267.0 + 304.0 + 28 * floor_us))
    assert c["measured_ratio"] == pytest.approx(8247.0 / 6200.0)
    assert c["ceiling_ratio_bf16_idle"] == pytest.approx(8247.0 / (4267.0 + 142.0 + 28 * floor_us))
    # an attention path of exactly the allowance gives the target ratio
    for t, us in c["allowed_us_per_layer"].items():
        assert 8247.0 / (4267.0 + 304.0 + 28 * us) == pytest.approx(t)
        assert 8247.0 / (4267.0 + 142.0 + 28 * c["allowed_us_per_layer_bf16_idle"][t]) == pytest.approx(t)
    assert c["allowed_us_per_layer"][1.5] < floor_us < c["allowed_us_per_layer"][1.4]


def test_cli_pairs_the_dtypes_of_each_file(tmp_path, capsys):
    other = [_record("int4_kivi", 6000.0, INT4["kernels_us_per_step"], 300.0, context=8192, batch=32),
             _record("auto", 8500.0, BF16["kernels_us_per_step"], 300.0, context=8192, batch=32)]
    (tmp_path / "a.json").write_text(json.dumps([INT4, BF16]))
    (tmp_path / "b.json").write_text(json.dumps(other))
    (tmp_path / "kernels.json").write_text(json.dumps({"device": "test", "rows": [{"context": 8192, "copy_bandwidth": 4.27e12}]}))
    assert decode_ceiling.main([str(tmp_path / "a.json"), str(tmp_path / "b.json"),
                                "--kernels", str(tmp_path / "kernels.json")]) == 0
    out = capsys.readouterr().out
    assert "copy bandwidth 4.27 TB/s" in out
    assert out.count("ceiling") == 2 and "32704 x 8" in out and "8192 x 32" in out
    assert "measured 1.33x bf16" in out and "measured 1.42x bf16" in out
