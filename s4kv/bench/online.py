"""One point of `s4kv bench serve`: vLLM's own online benchmark (`vllm bench serve`) against a
running server, at one offered request rate (Poisson arrivals) or one client concurrency (closed
loop: C clients, each sending its next request when the last one finished), with /metrics sampled
while it runs. vLLM's tool does the load and the latency statistics; this module only builds its
command line and reads its `--save-result` JSON.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from s4kv.bench import prom

PERCENTILES = (50, 90, 99)
LATENCIES = ("ttft", "tpot", "itl", "e2el")


@dataclass(frozen=True)
class Point:
    """One load level: `rate` requests/s with no client limit, or `concurrency` clients at rate inf."""

    rate: float | None = None
    concurrency: int | None = None

    def __post_init__(self) -> None:
        if (self.rate is None) == (self.concurrency is None):
            raise ValueError("a point has a request rate or a concurrency, not both")

    @property
    def id(self) -> str:
        return f"rate{self.rate:g}" if self.rate is not None else f"conc{self.concurrency}"

    def describe(self) -> str:
        return f"rate {self.rate:g} req/s" if self.rate is not None else f"concurrency {self.concurrency}"


def goodput_args(slo: dict[str, float]) -> list[str]:
    """vLLM's --goodput KEY:VALUE pairs (milliseconds) for the SLO."""
    return [f"{k}:{v:g}" for k, v in slo.items()]


def bench_command(*, url: str, model: str, point: Point, input_len: int, output_len: int, num_prompts: int,
                  num_warmups: int, seed: int, slo: dict[str, float], result_dir: Path, result_file: str,
                  extra: list[str] = ()) -> list[str]:
    """The `vllm bench serve` argv of one point: random prompts of exactly input_len tokens and
    exactly output_len new tokens (the random dataset implies ignore_eos), greedy, p50/p90/p99 of
    TTFT/TPOT/ITL/E2EL, goodput under the SLO, the result JSON saved with per-request data."""
    argv = [sys.executable, "-m", "vllm.entrypoints.cli.main", "bench", "serve",
            "--backend", "vllm", "--base-url", url, "--endpoint", "/v1/completions", "--model", model,
            "--dataset-name", "random", "--input-len", str(input_len), "--output-len", str(output_len),
            "--random-range-ratio", "0", "--num-prompts", str(num_prompts), "--num-warmups", str(num_warmups),
            "--seed", str(seed), "--temperature", "0",
            "--request-rate", "inf" if point.rate is None else f"{point.rate:g}"]
    if point.concurrency is not None:
        argv += ["--max-concurrency", str(point.concurrency)]
    argv += ["--percentile-metrics", ",".join(LATENCIES),
             "--metric-percentiles", ",".join(map(str, PERCENTILES)),
             "--disable-tqdm", "--save-result", "--save-detailed",
             "--result-dir", str(result_dir), "--result-filename", result_file]
    if slo:
        argv += ["--goodput", *goodput_args(slo)]
    return argv + list(extra)


def point_metrics(result: dict, point: Point) -> dict:
    """The numbers of one point from vLLM's result JSON (latencies in ms, as vLLM writes them)."""
    out = {
        "rate": point.rate, "concurrency": point.concurrency,
        "num_prompts": result.get("num_prompts"), "completed": result.get("completed"),
        "failed": result.get("failed"), "duration_s": result.get("duration"),
        "request_throughput": result.get("request_throughput"),
        "output_throughput": result.get("output_throughput"),
        "total_token_throughput": result.get("total_token_throughput"),
        "request_goodput": result.get("request_goodput"),
        "total_input_tokens": result.get("total_input_tokens"),
        "total_output_tokens": result.get("total_output_tokens"),
        "max_concurrent_requests": result.get("max_concurrent_requests"),
    }
    thr, good = out["request_throughput"], out["request_goodput"]
    # the share of requests that met every SLO target (vLLM's goodput is that share per second)
    out["goodput_fraction"] = good / thr if good is not None and thr else None
    for name in LATENCIES:
        out[f"mean_{name}_ms"] = result.get(f"mean_{name}_ms")
        for p in PERCENTILES:
            out[f"p{p}_{name}_ms"] = result.get(f"p{p}_{name}_ms")
    errors = [e for e in result.get("errors") or [] if e]
    if errors:
        out["first_error"] = str(errors[0])[:500]
    return out


def run_point(command: list[str], *, metrics_url: str, log_path: Path, result_path: Path,
              timeout: float | None, sample_interval: float = 0.5) -> dict:
    """Run one `vllm bench serve`; {status, reason, metrics-of-vLLM (raw JSON), kv (from /metrics),
    duration_s}. stdout/stderr go to log_path."""
    t = time.perf_counter()
    sampler = prom.Sampler(metrics_url, sample_interval).start()
    with open(log_path, "w") as log:
        log.write(" ".join(command) + "\n")
        log.flush()
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        try:
            rc, reason = proc.wait(timeout=timeout), None
        except subprocess.TimeoutExpired:
            proc.kill()
            rc, reason = proc.wait(), f"vllm bench serve timed out after {timeout:.0f} s"
    kv = sampler.stop()
    duration = round(time.perf_counter() - t, 2)
    if rc != 0 or not result_path.is_file():
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-15:])
        return {"status": "failed", "reason": reason or f"vllm bench serve exited {rc}; log tail:\n{tail}",
                "kv": kv, "duration_s": duration}
    return {"status": "ok", "reason": None, "result": json.loads(result_path.read_text()), "kv": kv,
            "duration_s": duration}


def num_prompts_for(point: Point, requested: int | None, seconds: float | None) -> int:
    """--num-prompts when given; else enough requests for about `seconds` of arrivals at the point's
    rate (at least 2 per client of a concurrency point), never fewer than 8."""
    if requested:
        return requested
    if point.rate is not None:
        return max(8, math.ceil(point.rate * (seconds or 60)))
    return max(8, 4 * point.concurrency)
