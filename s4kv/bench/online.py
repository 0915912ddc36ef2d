"""The load points of `s4kv bench serve`: vLLM's own online benchmark (`vllm bench serve`) against a
running server, at one offered request rate (Poisson arrivals) or one client concurrency (closed
loop: C clients, each sending its next request when the last one finished), with /metrics sampled
while it runs (s4kv.bench.serve_client runs them). vLLM's tool does the load and the latency
statistics; this module builds its command line, runs a server's points and reads its
`--save-result` JSON.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

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


def client_command() -> list[str]:
    return [sys.executable, "-m", "s4kv.bench.serve_client"]


def run_points(plan: list[dict], *, metrics_url: str, plan_path: Path, client_log: Path,
               timeout: float | None, metrics_interval: float) -> Iterator[dict]:
    """Run one server's points (plan: {id, command (the `vllm bench serve` argv), log, result}) in one
    client process (s4kv.bench.serve_client) and yield, in order, each point's {status, reason, result
    (vLLM's JSON), kv (from /metrics), started, duration_s} as soon as it is done. A point that takes
    longer than `timeout` seconds ends the client; it and the points after it are failed."""
    points = [{"id": p["id"], "argv": p["command"][3:], "log": str(p["log"]), "result": str(p["result"]),
               "done": str(plan_path.with_name(f"{p['id']}.done.json"))} for p in plan]
    for p in points:
        Path(p["done"]).unlink(missing_ok=True)
    plan_path.write_text(json.dumps({"metrics_url": metrics_url, "metrics_interval": metrics_interval,
                                     "points": points}, indent=1))
    with open(client_log, "w") as log:
        proc = subprocess.Popen(client_command() + [str(plan_path)], stdout=log, stderr=subprocess.STDOUT)
    try:
        for i, p in enumerate(points):
            done, t0, stopped = Path(p["done"]), time.monotonic(), None
            while not done.is_file():
                if proc.poll() is not None and not done.is_file():
                    stopped = f"the benchmark client exited {proc.returncode} before this point finished"
                    break
                if timeout is not None and time.monotonic() - t0 > timeout:
                    proc.kill()
                    stopped = f"vllm bench serve timed out after {timeout:.0f} s"
                    break
                time.sleep(0.5)
            if stopped:
                tail = "\n".join(Path(p["log"]).read_text(errors="replace").splitlines()[-15:]) \
                    if Path(p["log"]).is_file() else ""
                for q in points[i:]:
                    yield {"status": "failed", "reason": stopped + (f"; log tail:\n{tail}" if q is p and tail else ""),
                           "kv": {}, "duration_s": round(time.monotonic() - t0, 2) if q is p else 0.0}
                return
            res = json.loads(done.read_text())
            done.unlink()  # what it said goes into the point's record
            if res["status"] == "ok":
                res["result"] = json.loads(Path(p["result"]).read_text())
            else:
                tail = "\n".join(Path(p["log"]).read_text(errors="replace").splitlines()[-15:])
                res["reason"] = f"{res['reason']}; log tail:\n{tail}"
            yield res
    finally:
        if proc.poll() is None:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def num_prompts_for(point: Point, requested: int | None, seconds: float | None) -> int:
    """--num-prompts when given; else enough requests for about `seconds` of arrivals at the point's
    rate (at least 2 per client of a concurrency point), never fewer than 8."""
    if requested:
        return requested
    if point.rate is not None:
        return max(8, math.ceil(point.rate * (seconds or 60)))
    return max(8, 4 * point.concurrency)
