"""Argument parsing and the plan (which runs, in which order, which are refused)."""

import pytest

from s4kv import cli as s4kv_cli
from s4kv.bench import cli

OK = {"status": "ok", "reason": None}


def _plan(argv, platform="cpu", status=None, dummy=False, model_max_len=8192):
    args = cli.build_parser().parse_args(argv)
    return cli.plan(args, platform=platform, dtype_status=status or {}, dummy=dummy,
                    model_max_len=model_max_len)


def test_all_on_cpu():
    runs = _plan(["all", "--model", "smollm2", "--kv", "int4_kivi,fp8"],
                 status={"fp8": {"status": "refused", "reason": "needs AVX-512"}, "int4_kivi": OK, "auto": OK})
    assert [r.id for r in runs] == [
        "capacity-auto", "capacity-int4_kivi", "capacity-fp8",
        "quality-auto", "quality-int4_kivi", "quality-fp8", "quality-auto-r2",
        "speed-auto", "speed-int4_kivi", "speed-fp8"]
    refused = {r.id: r.refused for r in runs}
    assert refused["capacity-auto"] is None and refused["capacity-fp8"] == "needs AVX-512"
    assert all(refused[f"speed-{k}"] == cli.CPU_SPEED_REFUSAL for k in ("auto", "int4_kivi", "fp8"))
    cap = runs[0].params
    assert cap["kv_cache_bytes"] == 1 << 30 and cap["max_model_len"] == 8192
    q = runs[3].params
    assert q["chunk"] == 256 and q["text_tokens"] == 2048 and q["text"].endswith("eval_text.txt")
    assert q["text_windows"] == 3
    assert q["prompts"].endswith("prompts_long.jsonl") and q["new_tokens"] == 128


def test_speed_on_gpu_pairs_and_saturation():
    runs = _plan(["speed", "--model", "dummy:qwen2.5-7b", "--kv", "auto,int4_kivi", "--contexts", "1024,8192",
                  "--batches", "64,32", "--saturate", "--new-tokens", "64"], platform="cuda", dummy=True,
                 model_max_len=32768)
    assert [r.id for r in runs] == ["speed-auto", "speed-int4_kivi"]
    p = runs[0].params
    assert p["pairs"] == [[1024, 64], [8192, 32]] and p["saturate_contexts"] == [1024, 8192]
    assert p["gpu_memory_utilization"] == 0.9 and "kv_cache_bytes" not in p
    assert p["max_model_len"] == 8192 + 64 + 1 and p["max_num_seqs"] == 1024
    assert runs[0].refused is None


def test_speed_prompts_end_within_the_model_positions():
    # Qwen2.5-7B has 32,768 positions: a 32k point with 256 new tokens prefills 32,511 tokens, so the
    # last generated token sits at position 32,767 (beyond it vLLM's RoPE cache index asserts)
    p = _plan(["speed", "--model", "dummy:qwen2.5-7b", "--contexts", "8192,32768", "--batches", "32,8",
               "--saturate", "--saturate-contexts", "32768", "--new-tokens", "256"], platform="cuda", dummy=True,
              model_max_len=32768)[0].params
    assert p["pairs"] == [[8192, 32], [32511, 8]] and p["saturate_contexts"] == [32511]
    assert p["max_model_len"] == 32768
    with pytest.raises(SystemExit, match="leaves no prompt"):
        _plan(["speed", "--model", "x", "--contexts", "64", "--batches", "1", "--new-tokens", "64"],
              platform="cuda", model_max_len=64)


def test_batches_broadcast_and_mismatch():
    p = _plan(["speed", "--model", "x", "--contexts", "1024,2048", "--batches", "8"], platform="cuda")[0].params
    assert p["pairs"] == [[1024, 8], [2048, 8]] and p["max_num_seqs"] == 8
    with pytest.raises(SystemExit):
        _plan(["speed", "--model", "x", "--contexts", "1,2,3", "--batches", "8,4"], platform="cuda")


def test_quality_on_dummy_is_refused_and_noise_floor_optional():
    runs = _plan(["quality", "--model", "dummy:llama-3.1-8b", "--no-noise-floor"], dummy=True)
    assert [r.id for r in runs] == ["quality-auto", "quality-fp8", "quality-turboquant_4bit_nc",
                                    "quality-int4_kivi"]
    assert all(r.refused == cli.DUMMY_QUALITY_REFUSAL for r in runs)


def test_floor_engine_args_go_to_the_second_auto_run_only():
    runs = _plan(["quality", "--model", "smollm2", "--kv", "int4_kivi", "--engine-arg", "enforce_eager=true",
                  "--floor-engine-arg", "attention_backend=TRITON_ATTN"], platform="cuda")
    assert [r.id for r in runs] == ["quality-auto", "quality-int4_kivi", "quality-auto-r2"]
    for r in runs[:2]:
        assert r.params["engine_args"] == {"enforce_eager": True} and "floor_engine_args" not in r.params
    floor = runs[2].params
    assert floor["engine_args"] == {"enforce_eager": True, "attention_backend": "TRITON_ATTN"}
    assert floor["floor_engine_args"] == {"attention_backend": "TRITON_ATTN"}
    assert {k: v for k, v in floor.items() if k not in ("engine_args", "floor_engine_args")} == \
        {k: v for k, v in runs[0].params.items() if k != "engine_args"}
    # without it the second run is the same engine as the first
    plain = _plan(["quality", "--model", "smollm2", "--kv", "int4_kivi"], platform="cuda")
    assert plain[2].params == plain[0].params


def test_capacity_max_model_len_capped_and_kv_gib():
    runs = _plan(["capacity", "--model", "x", "--kv", "auto", "--max-model-len", "32768", "--kv-cache-gib", "0.5",
                  "--engine-arg", "enforce_eager=true", "--engine-arg", "dtype=float32"],
                 platform="cuda", model_max_len=8192)
    p = runs[0].params
    assert p["max_model_len"] == 8192 and p["kv_cache_bytes"] == 1 << 29
    assert p["engine_args"] == {"enforce_eager": True, "dtype": "float32"}


def test_prompts_none():
    q = _plan(["quality", "--model", "smollm2", "--kv", "auto", "--prompts", "none"])[0].params
    assert q["prompts"] is None


def test_end_to_end_with_fake_worker(tmp_path, monkeypatch, capsys):
    import sys

    from s4kv.bench import records, runner

    monkeypatch.setattr(runner, "worker_command", lambda: [sys.executable, "-m", "s4kv.bench.testing"])
    monkeypatch.setattr(cli, "resolve_model", lambda args: {"name": args.model, "path": "/m", "dummy": False})
    rc = s4kv_cli.main(["bench", "all", "--model", "smollm2", "--kv", "auto,int4_kivi,bogus", "--out",
                        str(tmp_path), "--no-progress"])
    assert rc == 0
    recs = records.read_jsonl(tmp_path / "results.jsonl")
    by_id = {r["id"]: r for r in recs}
    assert by_id["capacity-bogus"]["status"] == "refused"
    assert by_id["capacity-bogus"]["reason"] == "bogus is not a dtype"
    assert by_id["speed-auto"]["status"] == "refused"  # fake platform is cpu
    assert by_id["quality-int4_kivi"]["vs_auto"]["top1_agreement"] == pytest.approx(55 / 63)
    assert by_id["capacity-auto"]["command"] == "s4kv bench all --model smollm2 --kv auto,int4_kivi,bogus --out " \
        + str(tmp_path) + " --no-progress"
    for f in ("results.md", "capacity.png", "quality.png"):
        assert (tmp_path / f).stat().st_size > 0
    assert not (tmp_path / "decode_vs_context.png").exists()
    # `report` rewrites them from results.jsonl
    (tmp_path / "results.md").unlink()
    assert cli.main(["report", str(tmp_path)]) == 0
    assert "## Capacity" in (tmp_path / "results.md").read_text()


def test_s4kv_cli_usage(capsys):
    assert s4kv_cli.main([]) == 0
    assert "bench" in capsys.readouterr().out
    assert s4kv_cli.main(["nope"]) == 2
