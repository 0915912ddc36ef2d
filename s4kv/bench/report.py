"""results.md: tables of the records, with ratios to `auto`."""

from __future__ import annotations

import json
from pathlib import Path

from s4kv.bench import prom, records


def _f(x, fmt: str = "{:,.0f}", none: str = "–") -> str:
    return none if x is None else fmt.format(x)


def _pct(x, digits: int = 2) -> str:
    return "–" if x is None else f"{100 * x:.{digits}f}%"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _ok(recs: list[dict], kind: str) -> list[dict]:
    return [r for r in recs if r["measurement"] == kind and r["status"] == "ok"]


def capacity_table(recs: list[dict]) -> str | None:
    ok = _ok(recs, "capacity")
    if not ok:
        return None
    rows = []
    for r in ok:
        m, vs = r["metrics"], r.get("vs_auto") or {}
        rows.append([
            f"`{records.label(r)}`", _f(m.get("kv_cache_tokens")), _f(vs.get("kv_cache_tokens_ratio"), "{:.2f}×"),
            f"{_f(m.get('num_blocks'))} × {_f(m.get('block_size'))}",
            _f(m.get("max_concurrency"), "{:.2f}"), _f(m.get("max_model_len")),
            _f(m.get("bytes_per_token"), "{:,.0f}")])
    return _table(["KV dtype", "KV tokens", "× auto", "blocks × block size", "max concurrency",
                   "at max_model_len", "KV bytes/token"], rows)


def _speed_note(p: dict) -> str:
    notes = [p["error"]] if p.get("error") else []
    if p.get("capped_by_max_num_seqs"):
        notes.append("capped by max_num_seqs")
    if p.get("jit_compiles_while_timing"):
        notes.append("not steady: Triton compiled " + ", ".join(p["jit_compiles_while_timing"]) + " while timed")
    return "; ".join(notes)


def speed_table(recs: list[dict]) -> str | None:
    ok = _ok(recs, "speed")
    if not ok:
        return None
    rows = []
    for r in ok:
        ratios = {(p["mode"], p["context"], p.get("batch")): p for p in (r.get("vs_auto") or {}).get("points", [])}
        for p in r["metrics"].get("points", []):
            q = ratios.get((p["mode"], p["context"], p.get("batch"))) or {}
            rows.append([
                f"`{records.label(r)}`", p["mode"], _f(p["context"]), _f(p.get("batch")),
                _f(p.get("prefill_tok_s")), _f(q.get("prefill_ratio"), "{:.2f}×"),
                _f(p.get("decode_tok_s")), _f(q.get("decode_ratio"), "{:.2f}×"),
                _speed_note(p)])
    return _table(["KV dtype", "mode", "context", "batch", "prefill tok/s", "× auto", "decode tok/s",
                   "× auto", "note"], rows)


def _ms(x) -> str:
    return "–" if x is None else (f"{x:,.0f}" if x >= 100 else f"{x:,.1f}")


def _best(m: dict, vs: dict, load: str, unit: str, is_auto: bool) -> str:
    """"**2** req/s (2.00× auto); misses at 4": a summary's highest load within the SLO."""
    v, over = m.get(f"max_{load}_at_slo"), m.get(f"first_{load}_over_slo")
    if v is None and over is None:
        return "–"
    ratio = None if is_auto else vs.get(f"max_{load}_at_slo_ratio")
    text = "none" if v is None else f"**{v:g}** {unit}" + (f" ({ratio:.2f}× auto)" if ratio else "")
    return text + (f"; misses at {over:g}" if over is not None else "; met at every point")


def serve_summary_table(recs: list[dict]) -> str | None:
    ok = _ok(recs, "serve")
    if not ok:
        return None
    rows = []
    for r in ok:
        m, vs = r["metrics"], r.get("vs_auto") or {}
        auto = r["kv_cache_dtype"] == "auto"
        rows.append([f"`{records.label(r)}`", _best(m, vs, "rate", "req/s", auto),
                     _best(m, vs, "concurrency", "clients", auto),
                     _f(m.get("request_throughput_at_max_rate"), "{:.2f}"),
                     _f(m.get("output_throughput_at_max_rate")), _f(m.get("kv_pool_tokens")),
                     _f(vs.get("kv_pool_tokens_ratio"), "{:.2f}×"), _f(m.get("log_kv_cache_tokens")),
                     _f((r.get("engine") or {}).get("startup_s"), "{:.0f} s")])
    return _table(["KV dtype", "max rate at SLO", "max concurrency at SLO", "req/s there", "out tok/s there",
                   "KV pool tokens", "× auto", "vLLM-reported KV tokens", "server start"], rows)


def serve_points_table(recs: list[dict]) -> str | None:
    pts = _ok(recs, "serve_point")
    if not pts:
        return None
    rows = []
    for r in pts:
        m = r["metrics"]
        load = f"{m['rate']:g} req/s" if m.get("rate") is not None else f"{m['concurrency']} clients"
        lat = ["/".join(_ms(m.get(f"p{p}_{name}_ms")) for p in (50, 90, 99)) for name in ("ttft", "tpot", "itl")]
        kv = m.get("kv_cache_usage_max")
        rows.append([f"`{records.label(r)}`", load, f"{m.get('completed')}/{m.get('num_prompts')}",
                     _f(m.get("request_throughput"), "{:.2f}"), _f(m.get("output_throughput")), *lat,
                     _pct(m.get("goodput_fraction"), 0), "–" if kv is None else f"{100 * kv:.0f}%",
                     _f(m.get("num_requests_running_max")), _f(m.get("num_requests_waiting_max")),
                     _f(m.get("num_preemptions")),
                     "yes" if m.get("slo_met") else "no: " + "; ".join(m.get("slo_misses") or [])])
    return _table(["KV dtype", "load", "completed", "req/s", "out tok/s", "TTFT p50/p90/p99 ms",
                   "TPOT p50/p90/p99 ms", "ITL p50/p90/p99 ms", "goodput", "KV use peak", "running peak",
                   "waiting peak", "preemptions", "SLO met"], rows)


def serve_section(recs: list[dict], plots: dict[str, str]) -> list[str]:
    summary, points = serve_summary_table(recs), serve_points_table(recs)
    if not summary and not points:
        return []
    r = next((r for r in recs if r["measurement"] in ("serve", "serve_point") and r["status"] == "ok"), None)
    if r is None:
        return []
    p = r["params"]
    slo = ", ".join(f"{k.upper()} ≤ {v:,g} ms" for k, v in (p.get("slo_ms") or {}).items())
    mem = (f"{p['kv_cache_bytes'] / (1 << 30):g} GiB of KV cache for every dtype" if p.get("kv_cache_bytes")
           else f"gpu_memory_utilization {p.get('gpu_memory_utilization') or 'default'}")
    parts = ["", "## Serving (vllm bench serve)", "",
             (f"`vllm serve` started by the deploy launcher (`s4kv-serve`) for each dtype, max_model_len "
              f"{p.get('max_model_len')}, {mem}, extra server arguments `{' '.join(p.get('serve_extra_args') or [])}`; "
              f"`vllm bench serve` with random prompts of {p['input_len']:,} tokens and {p['output_len']:,} new "
              f"tokens each (ignore_eos), {p.get('num_warmups')} warm-up requests per point. Rate points: Poisson "
              "arrivals at the offered rate, no client limit; concurrency points: that many clients, each sending "
              f"its next request when the last one finished. **SLO: p99 {slo}**, and every request completed. "
              "*Max rate at SLO*: the highest swept rate that meets it with every lower swept rate meeting it "
              "too. Goodput: the share of requests within every target (vLLM's `--goodput`). KV use: "
              f"`vllm:kv_cache_usage_perc` sampled from /metrics every {p.get('metrics_interval_s', prom.INTERVAL_S):g} s (peak); running/waiting: the "
              "scheduler's queues at their peak. KV pool: blocks × block size from `vllm:cache_config_info`; "
              "vLLM-reported: its startup line, which counts max_model_len requests (an int4_kivi request also "
              "holds its exact tail's pages, so at a short max_model_len that figure is below the pool).")]
    if summary:
        parts += ["", summary]
    for name, alt in (("serve_max", "highest load within the SLO"), ("serve_rate", "latency vs request rate"),
                      ("serve_concurrency", "latency vs concurrency")):
        if name in plots:
            parts += ["", f"![{alt}]({plots[name]})"]
    if points:
        parts += ["", "Every point (latencies in ms):", "", points]
    return parts


def quality_rows(recs: list[dict]) -> list[dict]:
    """One dict per ok quality record (also what the quality plot shows)."""
    out = []
    for r in _ok(recs, "quality"):
        m, vs = r["metrics"], r.get("vs_auto") or {}
        g = vs.get("greedy") or {}
        out.append({
            "label": records.label(r),
            "perplexity": m.get("perplexity"),
            "ppl_delta_pct": vs.get("perplexity_delta_pct"),
            "ppl_delta_se_pct": vs.get("perplexity_delta_se_pct"),
            "top1_agreement": vs.get("top1_agreement"),
            "top1_agreement_se": vs.get("top1_agreement_se"),
            "identical": g.get("identical_sequences"),
            "num_sequences": g.get("num_sequences"),
            "token_agreement": g.get("token_agreement"),
            "prefix_agreement": g.get("prefix_agreement"),
            "median_first_divergence": g.get("median_first_divergence"),
            "first_divergence": g.get("first_divergence"),
        })
    return out


def _with_error(text: str, se: float | None, fmt: str) -> str:
    """"+0.34% ± 0.27": a number with its standard error (none for the reference itself)."""
    return text if not se else f"{text} ± {fmt.format(se)}"


def quality_table(recs: list[dict]) -> str | None:
    qrows = quality_rows(recs)
    if not qrows:
        return None
    rows = []
    for q in qrows:
        fd = q["first_divergence"]
        rows.append([
            f"`{q['label']}`", _f(q["perplexity"], "{:.4f}"),
            _with_error(_f(q["ppl_delta_pct"], "{:+.2f}%"), q["ppl_delta_se_pct"], "{:.2f}%"),
            _with_error(_pct(q["top1_agreement"]), q["top1_agreement_se"], "{:.2%}"),
            "–" if q["identical"] is None else f"{q['identical']}/{q['num_sequences']}",
            _pct(q["token_agreement"], 1), _pct(q["prefix_agreement"], 1),
            _f(q["median_first_divergence"], "{:g}"),
            "–" if fd is None else " ".join("=" if x is None else str(x) for x in fd)])
    return _table(["KV dtype", "perplexity", "Δ ppl vs auto (± SE)", "top-1 agreement (± SE)", "identical greedy",
                   "token agreement", "prefix agreement", "median first div.", "first divergence per prompt"],
                  rows)


def not_ok_table(recs: list[dict]) -> str | None:
    """Refused and failed runs, one row per (status, reason)."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in recs:
        if r["status"] != "ok":
            groups.setdefault((r["status"], r["reason"] or ""), []).append(r)
    if not groups:
        return None
    rows = []
    for (status, reason), rs in groups.items():
        kinds = list(dict.fromkeys(r["measurement"] for r in rs))
        labels = list(dict.fromkeys(records.label(r) for r in rs))
        if len(rs) == len(kinds) * len(labels):  # every combination: say it compactly
            what, dtypes = ", ".join(kinds), ", ".join(f"`{x}`" for x in labels)
        else:
            what, dtypes = "; ".join(f"{r['measurement']} `{records.label(r)}`" for r in rs), ""
        rows.append([what, dtypes, status, reason.replace("\n", " ").replace("|", "\\|")[:1200]])
    return _table(["measurement", "KV dtype", "status", "reason"], rows)


def _first(recs: list[dict], kind: str) -> dict | None:
    return next((r for r in recs if r["measurement"] == kind and r["status"] == "ok"), None)


def _windows_text(m: dict) -> str:
    """'the first 2048 tokens', or '3 consecutive windows of 2048 tokens (each ...)'."""
    w = m.get("text_windows") or 1
    return (f"the first {m.get('text_tokens')} tokens" if w == 1 else
            f"{w} consecutive windows of {m.get('text_tokens')} tokens (each its own request from position 0)")


def markdown(recs: list[dict], plots: dict[str, str] | None = None) -> str:
    if not recs:
        return "# s4kv bench\n\nNo records.\n"
    first = recs[0]
    env = next((r["env"] for r in recs if r.get("env", {}).get("vllm")), first.get("env", {}))
    model = first["model"]
    parts = [
        "# s4kv bench",
        "",
        f"- command: `{first['command']}`",
        f"- started: {first['started']}",
        f"- model: `{model.get('name')}`" + (f" ({model.get('path')})" if model.get("path") != model.get("name")
                                            else "") + (" — dummy weights" if model.get("dummy") else ""),
        (f"- machine: {env.get('device')} ({env.get('platform')}); vLLM {env.get('vllm')}"
        f" ({env.get('vllm_dist')}), torch {env.get('torch')}, s4kv {env.get('s4kv')}, "
        f"Python {env.get('python')}"),
    ]
    configs = {json.dumps(r["env"]["kernel_config"]) for r in recs if r.get("env", {}).get("kernel_config")}
    for config in sorted(configs):
        parts.append(f"- **kernel launch options** (`S4KV_KERNEL_CONFIG`, replacing the defaults): `{config}`")
    overridden = [r for r in recs if r["status"] == "ok" and (r.get("preflight") or {}).get("status") == "refused"]
    if overridden:
        names = sorted({records.label(r) for r in overridden})
        parts.append(f"- **run with --no-preflight**: {', '.join(f'`{n}`' for n in names)} "
                     "would have been refused on this platform; their numbers are what the engine did anyway "
                     "(see the reasons under *Not supported here*).")
    plots = plots or {}
    cap = capacity_table(recs)
    if cap:
        r = _first(recs, "capacity")
        p = r["params"]
        mem = (f"{p['kv_cache_bytes'] / (1 << 30):g} GiB of KV cache for every dtype" if p.get("kv_cache_bytes")
               else f"gpu_memory_utilization {p.get('gpu_memory_utilization')}")
        parts += ["", "## Capacity", "",
                  (f"Engine-reported KV cache capacity at equal memory ({mem}), max_model_len "
                  f"{p.get('max_model_len')}. Max concurrency = KV tokens / max_model_len."), "", cap]
        if "capacity" in plots:
            parts += ["", f"![capacity]({plots['capacity']})"]
    spd = speed_table(recs)
    if spd:
        r = _first(recs, "speed")
        p = r["params"]
        eager = (r.get("engine") or {}).get("engine_args", {}).get("enforce_eager")
        mode = "enforce_eager" if eager else ("CUDA graphs" if r["env"].get("platform") == "cuda"
                                               else "vLLM's default compilation")
        parts += ["", "## Speed", "",
                  (f"Random prompts of exactly `context` tokens, {p.get('new_tokens')} decode tokens, median of "
                  f"{p.get('repeats')} repeats after a warm-up; prefix caching off, engine defaults otherwise "
                  f"({mode}). prefill tok/s = batch·context / t(max_tokens=1); decode tok/s = batch·N / "
                  "(t(max_tokens=N+1) − t(max_tokens=1)). `saturated`: as many sequences as the KV cache holds "
                  "at that context."), "", spd]
        if "speed" in plots:
            parts += ["", f"![decode tok/s]({plots['speed']})"]
    qual = quality_table(recs)
    if qual:
        r = _first(recs, "quality")
        p, m = r["params"], r["metrics"]
        greedy = (f"; free-running greedy on {m.get('num_prompts')} prompts of "
                  f"{min(m.get('prompt_tokens') or [0])}–{max(m.get('prompt_tokens') or [0])} tokens "
                  f"(`{Path(p['prompts']).name}`), {m.get('new_tokens')} new tokens each, compared token by "
                  "token with `auto`" if m.get("num_prompts") else "")
        parts += ["", "## Quality", "",
                  (f"Perplexity of {_windows_text(m)} of `{Path(p['text']).name}` "
                  f"({m.get('scored_positions')} scored positions) through vLLM prompt logprobs with chunked "
                  f"prefill of {p.get('chunk')} tokens (later chunks read earlier ones from the KV cache); "
                  f"teacher-forced top-1 agreement with `auto` at every scored position{greedy}. "
                  + "".join(_floor_sentence(r) for r in _ok(recs, "quality") if r.get("repeat", 1) > 1)
                  + "First divergence: `=` means identical over all new tokens; the median counts those as "
                  "the generation length."), "", qual]
        if "quality" in plots:
            parts += ["", f"![quality]({plots['quality']})"]
    parts += serve_section(recs, plots)
    bad = not_ok_table(recs)
    if bad:
        parts += ["", "## Not measured", "", bad]
    if overridden:
        rows = [[f"`{kv}`", (reason or "").replace("|", "\\|")] for kv, reason in
                sorted({(r["kv_cache_dtype"], r["preflight"].get("reason")) for r in overridden})]
        parts += ["", "## Not supported here", "", _table(["KV dtype", "preflight"], rows)]
    parts += ["", "Raw records: `results.jsonl` (one per measurement; per-position data under `raw`"
              + ("; vLLM's result JSON of every serving point under `bench/`" if _ok(recs, "serve_point") else "")
              + ")."]
    return "\n".join(parts) + "\n"


def _floor_sentence(rec: dict) -> str:
    """What the second `auto` quality run measures."""
    if (rec.get("params") or {}).get("floor_engine_args"):
        return (f"`{records.label(rec)}` is a second `auto` engine with those engine arguments (another "
                "attention kernel): it rounds differently from the reference, as every cache does, so its "
                "top-1 and greedy agreement are the floor of those figures, and its perplexity the noise of "
                "arithmetic alone. ")
    return "`auto (repeat)` is a second, independent `auto` engine: the noise floor. "


def write_markdown(recs: list[dict], out: Path, plots: dict[str, str] | None = None) -> Path:
    path = Path(out) / "results.md"
    path.write_text(markdown(recs, plots))
    return path
