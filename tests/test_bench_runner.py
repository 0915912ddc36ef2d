"""The runner with the fake worker (no vLLM): subprocess per run, records, failures, live lines."""

import sys

from s4kv.bench import records, runner

FAKE = [sys.executable, "-m", "s4kv.bench.testing"]
MODEL = {"name": "smollm2", "path": "/models/smollm2", "dummy": False}


def _execute(tmp_path, runs, **kw):
    return runner.execute(runs, out=tmp_path, model=MODEL, command="s4kv bench capacity --model smollm2",
                          argv=["capacity", "--model", "smollm2"], timeout=kw.pop("timeout", 60),
                          env={"vllm": "x", "torch": "y", "s4kv": "z", "device": "d"}, worker_cmd=FAKE,
                          progress=False, **kw)


def test_runs_each_in_a_worker_and_writes_jsonl(tmp_path, capsys):
    runs = [runner.Run("capacity", "auto", {}), runner.Run("capacity", "int4_kivi", {}),
            runner.Run("capacity", "fp8", {}, refused="fp8 needs AVX-512")]
    recs = _execute(tmp_path, runs)
    assert [r["status"] for r in recs] == ["ok", "ok", "refused"]
    assert records.read_jsonl(tmp_path / "results.jsonl") == recs
    for r in recs:
        assert records.validate(r) == [], r
    # capacity came from the log line (the fake engine objects had none)
    assert recs[1]["metrics"]["kv_cache_tokens"] == 140000 and recs[1]["metrics"]["source"] == "log"
    assert recs[1]["vs_auto"]["kv_cache_tokens_ratio"] == 3.5
    assert recs[2]["reason"] == "fp8 needs AVX-512" and recs[2]["log"] is None
    assert (tmp_path / "logs" / "capacity-int4_kivi.log").read_text().startswith("fake worker capacity")
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 3
    assert "140,000 KV tokens" in out[1] and "x3.50 vs auto" in out[1]
    assert "REFUSED: fp8 needs AVX-512" in out[2]


def test_crash_fail_and_timeout(tmp_path, capsys):
    behaviour = {"FAKE_BEHAVIOUR": {"auto": "crash", "fp8": "fail", "int4_kivi": "hang", "nvfp4": "enginefail"}}
    runs = [runner.Run("quality", kv, behaviour) for kv in ("auto", "fp8", "int4_kivi", "nvfp4")]
    recs = _execute(tmp_path, runs, timeout=3)
    assert [r["status"] for r in recs] == ["failed"] * 4
    assert "exited with code 3" in recs[0]["reason"] and "Traceback: boom" in recs[0]["reason"]
    assert recs[1]["reason"] == "RuntimeError: engine said no"
    assert recs[2]["reason"] == "timed out after 3 s"
    assert recs[3]["reason"].startswith("NotImplementedError: not on this CPU (root cause, from the log; raised as: "
                                        "RuntimeError: Engine core initialization failed.")
    assert all(records.validate(r) == [] for r in recs)


def test_quality_comparisons_against_first_auto(tmp_path):
    runs = [runner.Run("quality", "auto", {}), runner.Run("quality", "fp8", {}),
            runner.Run("quality", "auto", {}, repeat=2)]
    recs = _execute(tmp_path, runs)
    assert [r["id"] for r in recs] == ["quality-auto", "quality-fp8", "quality-auto-r2"]
    assert recs[1]["vs_auto"]["greedy"]["identical_sequences"] == 1
    assert recs[2]["vs_auto"]["top1_agreement"] == 1.0
