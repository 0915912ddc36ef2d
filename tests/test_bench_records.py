"""The record format, the vLLM log fallback and the comparisons with auto."""

import json

import pytest

from s4kv.bench import records, testing


def test_sample_records_are_valid():
    for rec in testing.sample_records():
        assert records.validate(rec) == [], rec["id"]
        json.dumps(rec)  # serialisable


def test_validate_catches_problems():
    rec = testing.record("capacity", "auto")
    del rec["env"]["vllm"]
    rec["status"] = "failed"
    rec["reason"] = None
    errors = records.validate(rec)
    assert "env lacks vllm" in errors
    assert "a record that is not ok needs a reason" in errors


def test_jsonl_round_trip(tmp_path):
    recs = testing.sample_records()
    records.write_jsonl(tmp_path / "r.jsonl", recs[:2])
    records.append_jsonl(tmp_path / "r.jsonl", recs[2])
    assert records.read_jsonl(tmp_path / "r.jsonl") == json.loads(json.dumps(recs[:3]))


def test_run_id_and_label():
    assert records.run_id("quality", "auto") == "quality-auto"
    assert records.run_id("quality", "auto", 2) == "quality-auto-r2"
    assert records.label(testing.record("quality", "auto", 2)) == "auto (repeat)"
    floor = testing.record("quality", "auto", 2)
    floor["params"]["floor_engine_args"] = {"attention_backend": "TRITON_ATTN"}
    assert records.label(floor) == "auto (attention_backend=TRITON_ATTN)"


LOG_032 = """INFO 11-29 12:00:01 [kv_cache_utils.py:2328] CPU KV cache size: 46,592 tokens, Maximum \
concurrency for 8,192 tokens per request: 5.69x
"""
LOG_024 = """(EngineCore pid=1) INFO [kv_cache_utils.py:2146] GPU KV cache size: 1,234,567 tokens
(EngineCore pid=1) INFO [kv_cache_utils.py:2147] Maximum concurrency for 32,768 tokens per request: 37.68x
"""


def test_parse_capacity_log_both_formats():
    assert records.parse_capacity_log(LOG_032) == {"kv_cache_tokens": 46592, "max_concurrency": 5.69,
                                                   "max_model_len": 8192}
    assert records.parse_capacity_log(LOG_024) == {"kv_cache_tokens": 1234567, "max_concurrency": 37.68,
                                                   "max_model_len": 32768}
    assert records.parse_capacity_log("nothing here") == {"kv_cache_tokens": None, "max_concurrency": None,
                                                          "max_model_len": None}
    # the last occurrence wins
    assert records.parse_capacity_log(LOG_024 + LOG_032)["kv_cache_tokens"] == 46592


def test_compare_capacity():
    auto, int4 = testing.record("capacity", "auto"), testing.record("capacity", "int4_kivi")
    vs = records.compare(int4, auto)
    assert vs["kv_cache_tokens_ratio"] == pytest.approx(3.5)
    assert vs["max_concurrency_ratio"] == pytest.approx(3.5)
    assert records.compare(int4, None) is None
    refused = testing.record("capacity", "fp8", status="refused", reason="no")
    assert records.compare(refused, auto) is None


def test_compare_quality_hand_computed():
    auto, fp8 = testing.record("quality", "auto"), testing.record("quality", "fp8")
    vs = records.compare(fp8, auto)
    # ppl(auto) = 2; ppl(fp8) = exp(ln 2 + 0.01)
    assert vs["perplexity_delta_pct"] == pytest.approx(100 * (2 * 2.718281828 ** 0.01 - 2) / 2, rel=1e-6)
    # 63 positions, positions 0, 8, ..., 56 differ: 8 of 63
    assert vs["top1_agreement"] == pytest.approx(55 / 63)
    g = vs["greedy"]
    # 4 prompts of 8 tokens; prompt p has its last p tokens changed
    assert g["identical_sequences"] == 1
    assert g["first_divergence"] == [None, 7, 6, 5]
    assert g["token_agreement"] == pytest.approx((8 + 7 + 6 + 5) / 32)
    assert g["median_first_divergence"] == pytest.approx(6.5)
    same = records.compare(testing.record("quality", "auto", 2), auto)
    assert same["top1_agreement"] == 1.0 and same["perplexity_delta_pct"] == 0.0
    assert same["greedy"]["identical_sequences"] == 4


def test_compare_speed_matches_points():
    auto, int4 = testing.record("speed", "auto"), testing.record("speed", "int4_kivi")
    pts = records.compare(int4, auto)["points"]
    assert [(p["mode"], p["context"]) for p in pts] == [("fixed", 1024), ("fixed", 8192), ("fixed", 32768),
                                                         ("saturated", 8192)]
    assert pts[0]["decode_ratio"] == pytest.approx(1.35 / 1.1)
    assert pts[3]["decode_ratio"] == pytest.approx(3.5)
    assert pts[3]["batch_ratio"] == pytest.approx(42 / 12)


def test_reference_is_first_ok_auto():
    recs = [testing.record("quality", "auto", status="failed", reason="x"), testing.record("quality", "auto", 2),
            testing.record("capacity", "auto")]
    assert records.reference(recs, "quality") is None
    assert records.reference(recs, "capacity") is recs[2]


LOG_FAIL = """(Worker pid=1) WARNING [utils.py:597] Failed to create oneDNN linear. Exception: could not create
(Worker pid=1) ERROR [multiproc_executor.py:1063]     raise NotImplementedError(
(Worker pid=1) ERROR [multiproc_executor.py:1063] NotImplementedError: FP8 KV cache on CPU requires x86 with AVX-512 or AMX.
(EngineCore pid=2) ERROR [core.py:1510] RuntimeError: Worker failed with error 'FP8 KV cache ...', please check
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""


def test_root_cause():
    assert records.root_cause(LOG_FAIL) == ("NotImplementedError: FP8 KV cache on CPU requires x86 with "
                                            "AVX-512 or AMX.")
    assert records.root_cause("RuntimeError: Engine core initialization failed. See root cause above.") is None
    assert records.root_cause("all fine") is None


# the H200 speed run of 2026-12-02 (s4kv's worker and vLLM 0.24's engine core write one log),
# with the timing markers the worker prints since: compiles in a warm-up do not count, compiles
# between a point's marker and its result line do
LOG_SPEED = """\
(EngineCore pid=1762) INFO 12-02 10:50:03 [jit_monitor.py:60] Kernel JIT monitor activated
(EngineCore pid=1762) WARNING 12-02 10:50:04 [jit_monitor.py:106] Triton kernel JIT compilation during \
inference: _compute_slot_mapping_kernel. This causes a latency spike; consider extending warmup
[s4kv.bench.worker] timing 1024x64
(EngineCore pid=1762) WARNING 12-02 10:50:12 [jit_monitor.py:106] Triton kernel JIT compilation during \
inference: _store_blocks_kernel. This causes a latency spike; consider extending warmup
[s4kv.bench.worker] speed {"context": 1024, "batch": 64}
[s4kv.bench.worker] timing 8192x32
[s4kv.bench.worker] speed {"context": 8192, "batch": 32}
(EngineCore pid=1762) WARNING 12-02 10:50:30 [jit_monitor.py:106] Triton kernel JIT compilation during \
inference: _chunk_plan_kernel. This causes a latency spike; consider extending warmup
[s4kv.bench.worker] timing 32511x8
(EngineCore pid=1762) WARNING 12-02 10:50:42 [jit_monitor.py:106] Triton kernel JIT compilation during \
inference: _stage_kernel. This causes a latency spike; consider extending warmup
[s4kv.bench.worker] speed {"context": 32511, "batch": 8}
"""


def test_jit_compiles_while_timing_are_attributed_to_their_point():
    assert records.jit_compiles_while_timing(LOG_SPEED) == [["_store_blocks_kernel"], [], ["_stage_kernel"]]
    assert records.jit_compiles_while_timing("no markers\n") == []


def test_speed_report_notes_a_point_timed_over_a_compile():
    from s4kv.bench import report

    rec = testing.record("speed", "int4_kivi")
    rec["metrics"]["points"][0]["jit_compiles_while_timing"] = ["_store_blocks_kernel"]
    table = report.speed_table([rec])
    assert "not steady: Triton compiled _store_blocks_kernel while timed" in table
    assert table.count("not steady") == 1
