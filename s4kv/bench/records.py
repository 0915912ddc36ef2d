"""The record format of `s4kv bench` (one JSON object per line of results.jsonl) and the
comparisons with `auto` that the runner adds to each record.

A record::

    {"schema": "s4kv.bench/1",
     "id": "quality-fp8", "measurement": "capacity" | "speed" | "quality",
     "kv_cache_dtype": "fp8", "repeat": 1,            # repeat 2 of auto: the noise floor
     "status": "ok" | "refused" | "failed", "reason": null | "why",
     "model": {"name": "smollm2", "path": "/...", "dummy": false},
     "params": {...},                                  # what the worker was asked
     "metrics": {...},                                 # what it measured (see worker.py)
     "vs_auto": {...} | null,                          # comparison with the first `auto` record
     "raw": {...},                                     # per-position data (quality) for recomputation
     "engine": {"engine_args": {...}, "startup_s": 51.2},
     "env": {"vllm": "...", "torch": "...", "s4kv": "...", "device": "...", ...},
     "command": "s4kv bench ...", "started": "2026-11-29T12:00:00+00:00", "duration_s": 63.1,
     "log": "logs/quality-fp8.log"}

`s4kv bench serve` writes one "serve_point" record per (dtype, load point) as it is measured
(id "serve-int4_kivi-rate2", metrics: vLLM's numbers of that point and the server's KV use) and,
after the dtype's server stopped, its "serve" summary record (id "serve-int4_kivi", metrics:
the SLO, max_rate_at_slo, max_concurrency_at_slo, the KV pool).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path

from s4kv.bench import metrics

SCHEMA = "s4kv.bench/1"
MEASUREMENTS = ("capacity", "speed", "quality", "serve", "serve_point")
STATUSES = ("ok", "refused", "failed")
REQUIRED = ("schema", "id", "measurement", "kv_cache_dtype", "repeat", "status", "reason", "model",
            "params", "metrics", "env", "command", "started", "duration_s")


def run_id(measurement: str, kv: str, repeat: int = 1) -> str:
    return f"{measurement}-{kv}" + (f"-r{repeat}" if repeat > 1 else "")


def label(rec: dict) -> str:
    """How a record's dtype is shown in tables and plots."""
    kv = rec["kv_cache_dtype"]
    if rec.get("repeat", 1) == 1:
        return kv
    # a second engine with its own arguments (`--floor-engine-arg`): say which
    floor = (rec.get("params") or {}).get("floor_engine_args")
    return f"{kv} ({', '.join(f'{k}={v}' for k, v in floor.items())})" if floor else f"{kv} (repeat)"


def validate(rec: dict) -> list[str]:
    """Problems with a record (empty when it is well formed)."""
    errors = [f"missing {k}" for k in REQUIRED if k not in rec]
    if rec.get("schema") != SCHEMA:
        errors.append(f"schema {rec.get('schema')!r} != {SCHEMA!r}")
    if rec.get("measurement") not in MEASUREMENTS:
        errors.append(f"measurement {rec.get('measurement')!r}")
    if rec.get("status") not in STATUSES:
        errors.append(f"status {rec.get('status')!r}")
    if rec.get("status") != "ok" and not rec.get("reason"):
        errors.append("a record that is not ok needs a reason")
    for k in ("vllm", "torch", "s4kv", "device"):
        if k not in (rec.get("env") or {}):
            errors.append(f"env lacks {k}")
    return errors


def write_jsonl(path: Path, records: Iterable[dict]) -> None:
    with open(path, "w") as f:
        f.writelines(json.dumps(rec, default=str) + "\n" for rec in records)


def append_jsonl(path: Path, rec: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(rec, default=str) + "\n")


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


# ---------------------------------------------------------------------------------------------
# vLLM log fallback


_NUM = r"([\d,]+)"
_RE_TOKENS = re.compile(r"KV cache size: " + _NUM + r" tokens")
_RE_CONC = re.compile(r"Maximum concurrency for " + _NUM + r" tokens per request: ([\d.]+)x")


def parse_capacity_log(text: str) -> dict:
    """KV capacity from vLLM's startup log, the last occurrence of each line.

    0.32: "CPU KV cache size: 46,592 tokens, Maximum concurrency for 8,192 tokens per request: 5.69x";
    0.24: "GPU KV cache size: N tokens" and "Maximum concurrency for M tokens per request: X.XXx"
    on separate lines. Missing values are None."""
    out: dict = {"kv_cache_tokens": None, "max_concurrency": None, "max_model_len": None}
    toks = _RE_TOKENS.findall(text)
    if toks:
        out["kv_cache_tokens"] = int(toks[-1].replace(",", ""))
    conc = _RE_CONC.findall(text)
    if conc:
        out["max_model_len"] = int(conc[-1][0].replace(",", ""))
        out["max_concurrency"] = float(conc[-1][1])
    return out


_RE_EXC = re.compile(r"\b([A-Z][A-Za-z0-9_]*(?:Error|Exception)): (.+)$")
_GENERIC = ("Engine core initialization failed", "Worker failed with error")


_TIMING = re.compile(r"\[s4kv\.bench\.worker\] timing (\d+)x(\d+)")
_POINT = re.compile(r"\[s4kv\.bench\.worker\] speed \{")
_JIT = re.compile(r"Triton kernel JIT compilation during inference: (\w+)")


def jit_compiles_while_timing(text: str) -> list[list[str]]:
    """Per timed speed point, in order: the kernels vLLM's JIT monitor (vLLM >= 0.24) saw compile
    between the point's `timing` marker (after its warm-up) and its result line. A compile there
    is seconds inside the timed region: the point's figures do not measure steady serving."""
    points, current = [], None
    for line in text.splitlines():
        if _TIMING.search(line):
            current = []
        elif current is not None and (m := _JIT.search(line)):
            current.append(m.group(1))
        elif current is not None and _POINT.search(line):
            points.append(current)
            current = None
    return points


def root_cause(text: str) -> str | None:
    """The first exception line of a vLLM log that is not one of vLLM's wrappers ("Engine core
    initialization failed", "Worker failed with error ...") and not in a WARNING line."""
    for line in text.splitlines():
        if "WARNING" in line:
            continue
        m = _RE_EXC.search(line)
        if m and not m.group(2).startswith(_GENERIC):
            return f"{m.group(1)}: {m.group(2).strip()}"
    return None


# ---------------------------------------------------------------------------------------------
# comparisons with auto


def reference(records: Iterable[dict], measurement: str, point: str | None = None) -> dict | None:
    """The `auto` record (first repeat, ok) a measurement is compared with; for a serve_point, the
    `auto` point of the same load (`point`, its params["point"])."""
    for rec in records:
        if (rec["measurement"] == measurement and rec["kv_cache_dtype"] == "auto"
                and rec.get("repeat", 1) == 1 and rec["status"] == "ok"
                and (point is None or rec["params"].get("point") == point)):
            return rec
    return None


def _paired(values, ref_values) -> bool:
    """Both series present, of one length, long enough for a standard error (two segments)."""
    return bool(values) and bool(ref_values) and len(values) == len(ref_values) >= 2 * metrics.SEGMENT


def compare(rec: dict, ref: dict | None) -> dict | None:
    """The record's numbers relative to `auto` (None when there is nothing to compare)."""
    if ref is None or rec["status"] != "ok" or ref["status"] != "ok":
        return None
    m, r = rec["metrics"], ref["metrics"]
    kind = rec["measurement"]
    if kind == "capacity":
        return {"kv_cache_tokens_ratio": metrics.ratio(m.get("kv_cache_tokens"), r.get("kv_cache_tokens")),
                "max_concurrency_ratio": metrics.ratio(m.get("max_concurrency"), r.get("max_concurrency"))}
    if kind == "speed":
        ref_points = {(p["mode"], p["context"]) if p["mode"] == "saturated" else (p["mode"], p["context"],
                      p["batch"]): p for p in r.get("points", [])}
        out = []
        for p in m.get("points", []):
            key = (p["mode"], p["context"]) if p["mode"] == "saturated" else (p["mode"], p["context"], p["batch"])
            q = ref_points.get(key)
            if q is None:
                continue
            out.append({"mode": p["mode"], "context": p["context"], "batch": p.get("batch"),
                        "decode_ratio": metrics.ratio(p.get("decode_tok_s"), q.get("decode_tok_s")),
                        "prefill_ratio": metrics.ratio(p.get("prefill_tok_s"), q.get("prefill_tok_s")),
                        "batch_ratio": metrics.ratio(p.get("batch"), q.get("batch"))})
        return {"points": out}
    if kind == "quality":
        out: dict = {}
        if m.get("perplexity") is not None and r.get("perplexity") is not None:
            out["perplexity_delta_pct"] = metrics.ppl_delta_pct(m["perplexity"], r["perplexity"])
        raw, rraw = rec.get("raw") or {}, ref.get("raw") or {}
        lp, rlp = raw.get("text_logprobs"), rraw.get("text_logprobs")
        if _paired(lp, rlp) and None not in lp and None not in rlp:
            out["perplexity_delta_se_pct"] = metrics.ppl_delta_with_error(lp, rlp)[1]
        t1, rt1 = raw.get("text_top1"), rraw.get("text_top1")
        if t1 and rt1 and len(t1) == len(rt1):
            out["top1_agreement"] = metrics.top1_agreement(t1, rt1)
            if _paired(t1, rt1):
                out["top1_agreement_se"] = metrics.top1_agreement_with_error(t1, rt1)[1]
        if raw.get("greedy_tokens") and rraw.get("greedy_tokens") and \
                len(raw["greedy_tokens"]) == len(rraw["greedy_tokens"]):
            g = metrics.compare_greedy(raw["greedy_tokens"], rraw["greedy_tokens"])
            g.pop("per_sequence_token_agreement")
            out["greedy"] = g
        return out
    if kind == "serve":
        return {k + "_ratio": metrics.ratio(m.get(k), r.get(k))
                for k in ("max_rate_at_slo", "max_concurrency_at_slo", "kv_pool_tokens")}
    if kind == "serve_point":
        return {k + "_ratio": metrics.ratio(m.get(k), r.get(k))
                for k in ("request_throughput", "output_throughput", "p99_ttft_ms", "p99_tpot_ms")}
    return None
