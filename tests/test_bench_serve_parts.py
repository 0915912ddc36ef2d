"""The parts of `s4kv bench serve` that need no server: the SLO rule, /metrics parsing, the `vllm bench
serve` command line (parsed by vLLM's own parser), the serve.env (read by the real launcher), the server
settings per platform, progress, and the tables and plots drawn from records."""

import argparse
import json
import os
import subprocess
import sys

import pytest
from serve_harness import needs_vllm

from s4kv.bench import metrics, online, plots, prom, records, report, serve_cli, testing
from s4kv.bench import server as servers

SLO = {"ttft": 2000.0, "tpot": 50.0}


def _pt(rate, ttft, tpot, n=10, completed=None, failed=0):
    return {"rate": rate, "concurrency": None, "num_prompts": n, "completed": n if completed is None else completed,
            "failed": failed, "p99_ttft_ms": ttft, "p99_tpot_ms": tpot}


def test_slo_misses():
    assert metrics.slo_misses(_pt(1, 2000, 50), SLO) == []  # at the target is within it
    assert metrics.slo_misses(_pt(1, 2000.5, 10), SLO) == ["p99 TTFT 2,000.5 ms > 2,000 ms"]
    assert metrics.slo_misses(_pt(1, 10, 10, completed=9, failed=1), SLO) == ["1 failed, 9 of 10 completed"]
    assert metrics.slo_misses({**_pt(1, 10, 10), "p99_tpot_ms": None}, SLO) == ["no p99 tpot"]


def test_max_load_at_slo_stops_at_the_first_miss():
    pts = [_pt(4, 100, 60), _pt(1, 100, 10), _pt(2, 100, 20), _pt(8, 100, 40)]  # 4 misses, 8 meets again
    assert metrics.max_load_at_slo(pts, "rate", SLO) == (2, 4)
    assert metrics.max_load_at_slo(pts[1:3], "rate", SLO) == (2, None)  # met everywhere
    assert metrics.max_load_at_slo([_pt(1, 5000, 10)], "rate", SLO) == (None, 1)  # not even the lowest
    assert metrics.max_load_at_slo(pts, "concurrency", SLO) == (None, None)  # no concurrency points
    # a point whose benchmark failed (no numbers) caps the sweep like a miss
    assert metrics.max_load_at_slo([_pt(1, 10, 10), {"rate": 2, "failed": 1}], "rate", SLO) == (1, 2)


METRICS_TEXT = """\
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="smollm2"} 0.25
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="smollm2"} 3.0
vllm:num_requests_waiting{engine="0",model_name="smollm2"} 1.0
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{engine="0",model_name="smollm2"} 7.0
vllm:cache_config_info{block_size="128",cache_dtype="int4_kivi",engine="0",num_gpu_blocks="1350"} 1.0
vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf",model_name="smollm2"} 5.0
"""


def test_prom_parse_and_cache_config():
    s = prom.parse(METRICS_TEXT)
    assert prom.total(s, prom.KV_USAGE) == 0.25 and prom.total(s, prom.RUNNING) == 3.0
    assert prom.total(s, "vllm:absent") is None
    assert s["vllm:e2e_request_latency_seconds_bucket"][0][0]["le"] == "+Inf"
    assert prom.cache_config(s) == {"num_gpu_blocks": 1350, "block_size": 128, "cache_dtype": "int4_kivi"}


def test_prom_summary_of_a_point():
    before = prom.parse(METRICS_TEXT)
    idle = prom.parse(METRICS_TEXT.replace("} 3.0", "} 0.0").replace("} 0.25", "} 0.0"))
    busy = prom.parse(METRICS_TEXT.replace("} 0.25", "} 0.75").replace("} 7.0", "} 9.0"))
    out = prom.summarize(before, [idle, busy, prom.parse(METRICS_TEXT)], before, errors=1)
    assert out["kv_cache_usage_max"] == 0.75
    assert out["kv_cache_usage_mean_busy"] == pytest.approx(0.5)  # the idle sample is left out of the mean
    assert out["num_requests_running_max"] == 3.0 and out["num_requests_waiting_max"] == 1.0
    assert out["num_preemptions"] == 0.0 and out["metrics_samples"] == 3 and out["metrics_errors"] == 1


def test_point_id_and_prompt_count():
    assert online.Point(rate=0.5).id == "rate0.5" and online.Point(concurrency=8).id == "conc8"
    with pytest.raises(ValueError):
        online.Point(rate=1, concurrency=2)
    assert online.num_prompts_for(online.Point(rate=2), None, 60) == 120
    assert online.num_prompts_for(online.Point(rate=0.05), None, 60) == 8
    assert online.num_prompts_for(online.Point(concurrency=16), None, 60) == 64
    assert online.num_prompts_for(online.Point(concurrency=16), 10, 60) == 10


@needs_vllm
@pytest.mark.parametrize("point", [online.Point(rate=2.5), online.Point(concurrency=4)])
def test_bench_command_is_what_vllms_parser_reads(tmp_path, point):
    from vllm.entrypoints.cli.benchmark.serve import BenchmarkServingSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    argv = online.bench_command(url="http://127.0.0.1:9", model="/m", point=point, input_len=4096, output_len=512,
                                num_prompts=40, num_warmups=2, seed=3, slo=SLO, result_dir=tmp_path,
                                result_file="x.json", extra=["--burstiness", "0.5"])
    assert argv[:5] == [sys.executable, "-m", "vllm.entrypoints.cli.main", "bench", "serve"]
    parser = FlexibleArgumentParser()
    BenchmarkServingSubcommand.add_cli_args(parser)
    a = parser.parse_args(argv[5:])
    assert (a.dataset_name, a.input_len, a.output_len, a.num_prompts, a.seed) == ("random", 4096, 512, 40, 3)
    assert a.request_rate == (2.5 if point.rate else float("inf"))
    assert a.max_concurrency == point.concurrency
    assert a.goodput == ["ttft:2000", "tpot:50"] and a.metric_percentiles == "50,90,99"
    assert a.percentile_metrics == "ttft,tpot,itl,e2el" and a.temperature == 0.0 and a.burstiness == 0.5
    assert a.save_result and a.result_dir == str(tmp_path) and a.result_filename == "x.json"


def test_point_metrics_from_vllms_result():
    result = {"num_prompts": 4, "completed": 4, "failed": 0, "duration": 2.0, "request_throughput": 2.0,
              "output_throughput": 64.0, "request_goodput": 1.5, "total_input_tokens": 128,
              "total_output_tokens": 128, "p50_ttft_ms": 10.0, "p90_ttft_ms": 20.0, "p99_ttft_ms": 30.0,
              "p99_tpot_ms": 5.0, "errors": ["", "boom"]}
    m = online.point_metrics(result, online.Point(rate=2))
    assert (m["rate"], m["concurrency"], m["request_throughput"], m["p90_ttft_ms"]) == (2, None, 2.0, 20.0)
    assert m["goodput_fraction"] == 0.75 and m["p99_itl_ms"] is None and m["first_error"] == "boom"


@needs_vllm
def test_serve_env_as_the_launcher_reads_it(tmp_path):
    env_file = tmp_path / "serve.env"
    env_file.write_text(servers.serve_env(model="/models/m", kv_cache_dtype="auto", port=8123, max_model_len=4608,
                                          gpu_memory_utilization=None, venv=sys.prefix,
                                          extra_args=["--no-enable-prefix-caching", "--kv-cache-memory-bytes",
                                                      "4294967296"]))
    env_file.chmod(0o600)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("S4KV_")}, "S4KV_SERVE_ENV": str(env_file),
           "S4KV_DRY_RUN": "1"}
    out = subprocess.run([str(servers.find_launcher())], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == [
        f"{sys.prefix}/bin/vllm", "serve", "/models/m", "--kv-cache-dtype", "auto", "--host", "127.0.0.1",
        "--port", "8123", "--max-model-len", "4608", "--no-enable-prefix-caching", "--kv-cache-memory-bytes",
        "4294967296"]
    with pytest.raises(SystemExit, match="splits its extra arguments on blanks"):
        servers.serve_env(model="m", kv_cache_dtype="auto", port=1, max_model_len=None, gpu_memory_utilization=None,
                          venv="/v", extra_args=["--chat-template", "a b"])


def test_find_launcher(tmp_path):
    assert servers.find_launcher() == servers.CHECKOUT_LAUNCHER
    with pytest.raises(SystemExit, match="--launcher"):
        servers.find_launcher(str(tmp_path / "nope"))


def _args(*extra):
    return serve_cli.build_parser().parse_args(["--model", "m", "--input-len", "4096", "--output-len", "512",
                                                "--rates", "4,1,2,2", *extra])


def test_server_settings_per_platform():
    model = {"name": "m", "path": "/m", "dummy": False}
    cpu = serve_cli.server_args(_args(), platform="cpu", model=model, tokenizer=None)
    assert cpu["extra_args"] == ["--no-enable-prefix-caching", "--kv-cache-memory-bytes", str(1 << 30),
                                 "--enforce-eager"]
    assert cpu["max_model_len"] == 4608 and cpu["kv_cache_bytes"] == 1 << 30
    gpu = serve_cli.server_args(_args("--gpu-memory-utilization", "0.8", "--serve-arg=--max-num-seqs 64"),
                                platform="cuda", model={**model, "dummy": True}, tokenizer="/tok")
    assert gpu["extra_args"] == ["--load-format", "dummy", "--tokenizer", "/tok", "--no-enable-prefix-caching",
                                 "--max-num-seqs", "64"]
    assert gpu["kv_cache_bytes"] is None and gpu["gpu_memory_utilization"] == 0.8
    fixed = serve_cli.server_args(_args("--kv-cache-gib", "4", "--prefix-caching", "--serve-arg=--no-enforce-eager"),
                                  platform="cpu", model=model, tokenizer=None)
    assert fixed["extra_args"] == ["--kv-cache-memory-bytes", str(4 << 30), "--no-enforce-eager"]


def test_load_points_and_rates():
    a = _args("--concurrency", "8,2")
    assert [p.id for p in serve_cli.load_points(a)] == ["rate1", "rate2", "rate4", "conc2", "conc8"]
    assert serve_cli.slo_of(_args("--slo-e2el-ms", "9000")) == {"ttft": 2000.0, "tpot": 50.0, "e2el": 9000.0}
    with pytest.raises(SystemExit, match="--rates and/or --concurrency"):
        serve_cli.load_points(serve_cli.build_parser().parse_args(["--model", "m", "--input-len", "1",
                                                                   "--output-len", "1"]))
    for bad in ("inf", "0"):
        with pytest.raises(argparse.ArgumentTypeError):
            serve_cli._floats(bad)


def test_progress_estimates_what_is_left():
    p = serve_cli.Progress(total_points=6, total_servers=2)
    assert p.remaining() is None
    p.startup_s.append(60.0)
    p.point_s += [30.0, 50.0]
    assert p.remaining() == 4 * 40.0 + 1 * 60.0
    assert p.line("x").startswith("[2/6] x  elapsed 0m00s, remaining ~3m40s")


@pytest.fixture
def serve_recs():
    return testing.serve_records()


def test_serve_records_are_valid_and_compared(serve_recs):
    by_id = {r["id"]: r for r in serve_recs}
    for r in serve_recs:
        assert records.validate(r) == [], r["id"]
    assert by_id["serve-auto"]["metrics"]["max_rate_at_slo"] == 1
    assert by_id["serve-int4_kivi"]["metrics"]["max_rate_at_slo"] == 4
    assert by_id["serve-int4_kivi"]["vs_auto"]["max_rate_at_slo_ratio"] == 4.0
    assert by_id["serve-int4_kivi"]["vs_auto"]["kv_pool_tokens_ratio"] == 3.5
    # a point is compared with auto's point of the same load
    assert by_id["serve-int4_kivi-rate2"]["vs_auto"]["p99_tpot_ms_ratio"] == pytest.approx(32 / 70)


def test_serve_latency_plot_draws_the_measured_p99(serve_recs):
    fig = plots.serve_latency_figure(serve_recs, "rate")
    ttft_ax, tpot_ax = fig.axes
    for ax, i, target in ((ttft_ax, 0, 2000.0), (tpot_ax, 1, 50.0)):
        lines = {ln.get_label(): ln for ln in ax.get_lines()}
        for kv, lat in testing.SERVE_LATENCY.items():
            assert list(lines[kv].get_xdata()) == sorted(lat)
            assert list(lines[kv].get_ydata()) == [lat[r][i] for r in sorted(lat)]
        slo_line = next(ln for label, ln in lines.items() if label.startswith("SLO"))
        assert set(slo_line.get_ydata()) == {target}
    assert plots.serve_latency_figure(serve_recs, "concurrency") is None  # no concurrency points


def test_serve_max_plot_bars(serve_recs):
    ax = plots.serve_max_figure(serve_recs).axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["auto", "int4_kivi"]  # fp8 was refused
    assert [p.get_height() for p in ax.patches] == [1, 4]
    assert "4 req/s\n4.00× auto" in [t.get_text() for t in ax.texts]


def test_serve_markdown_and_files(serve_recs, tmp_path):
    written = plots.write_plots(serve_recs, tmp_path)
    assert written == {"serve_rate": "serve_latency_vs_rate.png", "serve_max": "serve_max_at_slo.png"}
    md = report.markdown(serve_recs, written)
    assert "## Serving (vllm bench serve)" in md and "**SLO: p99 TTFT ≤ 2,000 ms, TPOT ≤ 50 ms**" in md
    assert "| `int4_kivi` | **4** req/s (4.00× auto); misses at 8 |" in md
    assert "| `auto` | **1** req/s; misses at 2 |" in md
    assert "| `auto` | 2 req/s | 120/120 |" in md and "no: p99 TPOT 70.0 ms > 50 ms" in md
    assert "| serve | `fp8` | refused | fp8 needs AVX-512 |" in md
    assert "![highest load within the SLO](serve_max_at_slo.png)" in md


# run_points' own failure handling, with a stand-in for the benchmark client (a real client needs a
# server; tests/test_bench_serve.py runs it): the first point done, then the client dies or hangs.
FAKE_CLIENT = r'''
import json, sys, time
from pathlib import Path
plan = json.loads(Path(sys.argv[1]).read_text())
first = plan["points"][0]
Path(first["result"]).write_text(json.dumps({"completed": 1}))
Path(first["done"]).write_text(json.dumps({"status": "ok", "reason": None, "kv": {"kv_cache_usage_max": 0.5},
                                           "started": "t", "duration_s": 1.0}))
print("point 2 starts", flush=True)
time.sleep(60) if sys.argv[2] == "hang" else sys.exit(3)
'''


@pytest.mark.parametrize("behaviour", ["crash", "hang"])
def test_run_points_when_the_client_fails(tmp_path, monkeypatch, behaviour):
    plan = [{"id": f"p{i}", "command": ["py", "-m", "vllm", "bench", "serve", "--x", str(i)],
             "log": tmp_path / f"p{i}.log", "result": tmp_path / f"p{i}.json"} for i in range(3)]
    # the stand-in takes its behaviour as the argument after the plan
    monkeypatch.setattr(online, "client_command",
                        lambda: [sys.executable, "-c", FAKE_CLIENT.replace("sys.argv[2]", repr(behaviour))])
    out = list(online.run_points(plan, metrics_url="http://x", plan_path=tmp_path / "plan.json",
                                 client_log=tmp_path / "client.log", timeout=3, metrics_interval=0.2))
    assert [r["status"] for r in out] == ["ok", "failed", "failed"]
    assert out[0]["result"] == {"completed": 1} and out[0]["kv"] == {"kv_cache_usage_max": 0.5}
    want = "timed out after 3 s" if behaviour == "hang" else "the benchmark client exited 3"
    assert all(want in r["reason"] for r in out[1:])
    sent = json.loads((tmp_path / "plan.json").read_text())
    assert sent["metrics_interval"] == 0.2  # the client samples /metrics at the sweep's interval
    assert [p["argv"] for p in sent["points"]] == [["bench", "serve", "--x", str(i)] for i in range(3)]
    assert not (tmp_path / "p0.done.json").exists()  # read into the record, then removed


def test_serving_venv_without_scripts_gets_shims(tmp_path):
    assert servers.serving_venv(sys.prefix, tmp_path / "shim") == sys.prefix  # the test venv has both
    venv = servers.serving_venv(str(tmp_path / "bare"), tmp_path / "shim")
    assert venv == str(tmp_path / "shim")
    out = subprocess.run([f"{venv}/bin/s4kv"], capture_output=True, text=True, check=True)
    assert "usage: s4kv" in out.stdout
    assert f'"{sys.executable}" -m vllm.entrypoints.cli.main "$@"' in (tmp_path / "shim/bin/vllm").read_text()
