"""PNG plots of the records (matplotlib, Agg): capacity bars, decode tok/s versus context (one line per
KV dtype), the quality table as an image, and for `s4kv bench serve` p99 TTFT/TPOT versus load with the
SLO drawn and the highest load within the SLO per dtype. Each ``*_figure`` returns the Figure (None when there is
nothing to plot); ``write_plots`` saves them and returns {name: file name}."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

from matplotlib import pyplot as plt
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from s4kv.bench import records, report

FILES = {"capacity": "capacity.png", "speed": "decode_vs_context.png", "quality": "quality.png",
         "serve_rate": "serve_latency_vs_rate.png", "serve_concurrency": "serve_latency_vs_concurrency.png",
         "serve_max": "serve_max_at_slo.png"}


def _title(recs: list[dict]) -> str:
    r = recs[0]
    env = r.get("env") or {}
    return f"{r['model'].get('name')} · {env.get('device', '')}"


def capacity_figure(recs: list[dict]) -> Figure | None:
    ok = [r for r in recs if r["measurement"] == "capacity" and r["status"] == "ok"
          and r["metrics"].get("kv_cache_tokens")]
    if not ok:
        return None
    labels = [records.label(r) for r in ok]
    values = [r["metrics"]["kv_cache_tokens"] for r in ok]
    fig, ax = plt.subplots(figsize=(max(4.8, 1.6 + 1.3 * len(ok)), 4.2))
    bars = ax.bar(labels, values, color=["#888888" if lab == "auto" else "#2a7ab9" for lab in labels])
    bars.set_label("KV tokens")
    for bar, r in zip(bars, ok):
        ratio = (r.get("vs_auto") or {}).get("kv_cache_tokens_ratio")
        text = f"{bar.get_height():,.0f}" + (f"\n{ratio:.2f}× auto" if ratio else "")
        ax.annotate(text, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom",
                    fontsize=8, xytext=(0, 2), textcoords="offset points")
    ax.set_ylabel("KV cache capacity (tokens)")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:,.0f}"))
    ax.set_ylim(0, max(values) * 1.22)
    p = ok[0]["params"]
    mem = (f"{p['kv_cache_bytes'] / (1 << 30):g} GiB KV" if p.get("kv_cache_bytes")
           else f"gpu_memory_utilization {p.get('gpu_memory_utilization')}")
    ax.set_title(f"KV capacity at equal memory ({mem})\n{_title(recs)}", fontsize=9)
    ax.tick_params(axis="x", labelrotation=20, labelsize=8)
    fig.tight_layout()
    return fig


def speed_figure(recs: list[dict]) -> Figure | None:
    ok = [r for r in recs if r["measurement"] == "speed" and r["status"] == "ok"]
    if not any(p.get("decode_tok_s") for r in ok for p in r["metrics"].get("points", [])):
        return None
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    contexts = set()
    for i, r in enumerate(ok):
        for mode, style, marker in (("fixed", "-", "o"), ("saturated", "--", "s")):
            pts = sorted((p for p in r["metrics"].get("points", [])
                          if p["mode"] == mode and p.get("decode_tok_s")), key=lambda p: p["context"])
            if not pts:
                continue
            name = records.label(r) + (" (saturated)" if mode == "saturated" else "")
            contexts.update(p["context"] for p in pts)
            ax.plot([p["context"] for p in pts], [p["decode_tok_s"] for p in pts], style, marker=marker,
                    color=colors[i % len(colors)], label=name)
            for p in pts:
                ax.annotate(f"B={p['batch']}", (p["context"], p["decode_tok_s"]), fontsize=6,
                            xytext=(3, 3), textcoords="offset points")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(contexts), [f"{c:,}" for c in sorted(contexts)])
    ax.minorticks_off()
    ax.set_xlabel("context (tokens)")
    ax.set_ylabel("decode tok/s")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:,.0f}"))
    ax.set_title(f"Decode throughput vs context\n{_title(recs)}", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


QUALITY_COLUMNS = ["KV dtype", "perplexity", "Δ ppl", "top-1 agr.", "identical greedy", "token agr.",
                   "median 1st div."]


def quality_cells(recs: list[dict]) -> list[list[str]]:
    cells = []
    for q in report.quality_rows(recs):
        cells.append([
            q["label"],
            "–" if q["perplexity"] is None else f"{q['perplexity']:.4f}",
            "–" if q["ppl_delta_pct"] is None else f"{q['ppl_delta_pct']:+.2f}%",
            "–" if q["top1_agreement"] is None else f"{100 * q['top1_agreement']:.2f}%",
            "–" if q["identical"] is None else f"{q['identical']}/{q['num_sequences']}",
            "–" if q["token_agreement"] is None else f"{100 * q['token_agreement']:.1f}%",
            "–" if q["median_first_divergence"] is None else f"{q['median_first_divergence']:g}",
        ])
    return cells


def quality_figure(recs: list[dict]) -> Figure | None:
    cells = quality_cells(recs)
    if not cells:
        return None
    # the dtype column as wide as its longest label (a floor engine's label names its arguments)
    first = min(0.4, max(1 / len(QUALITY_COLUMNS), 0.0075 * max(len(c[0]) for c in cells)))
    widths = [first] + [(1 - first) / (len(QUALITY_COLUMNS) - 1)] * (len(QUALITY_COLUMNS) - 1)
    fig, ax = plt.subplots(figsize=(9.0 * max(1.0, first * len(QUALITY_COLUMNS) / 2), 0.55 + 0.3 * (len(cells) + 1)))
    ax.axis("off")
    table = ax.table(cellText=cells, colLabels=QUALITY_COLUMNS, colWidths=widths, loc="center", cellLoc="center")
    table.auto_set_font_size(False)
    table.set_fontsize(8)
    table.scale(1.0, 1.7)
    for (row, _col), cell in table.get_celld().items():
        if row == 0:
            cell.set_facecolor("#dde6f0")
            cell.set_text_props(weight="bold")
    r = next(r for r in recs if r["measurement"] == "quality" and r["status"] == "ok")
    m = r["metrics"]
    ax.set_title(f"Quality vs auto: ppl of {m.get('text_windows') or 1}×{m.get('text_tokens')} tokens "
                 f"(chunked prefill {m.get('chunk')}), "
                 f"greedy {m.get('num_prompts')}×{m.get('new_tokens')} tokens\n{_title(recs)}", fontsize=9)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------------------------- serving

SERVE_LATENCIES = (("ttft", "p99 TTFT (ms)"), ("tpot", "p99 TPOT (ms)"))
LOADS = {"rate": ("offered request rate (req/s, Poisson)", "rate"),
         "concurrency": ("concurrent clients (closed loop)", "concurrency")}


def _dtype_colors(recs: list[dict]) -> dict[str, str]:
    """One color per dtype, the same in every serve plot (auto gray, the others from the cycle)."""
    cycle = [c for c in plt.rcParams["axes.prop_cycle"].by_key()["color"] if c != "#7f7f7f"]
    kvs = list(dict.fromkeys(r["kv_cache_dtype"] for r in recs if r["measurement"] in ("serve", "serve_point")))
    others = [k for k in kvs if k != "auto"]
    return {"auto": "#7f7f7f", **{k: cycle[i % len(cycle)] for i, k in enumerate(others)}}


def _serve_workload(rec: dict) -> str:
    p = rec["params"]
    return f"{p['input_len']:,} in / {p['output_len']:,} out tokens"


def _slo_text(slo: dict) -> str:
    return ", ".join(f"{k.upper()} ≤ {v:,g} ms" for k, v in slo.items())


def serve_points(recs: list[dict], load: str) -> dict[str, list[dict]]:
    """{dtype: ok point metrics of this load kind, sorted by load}: what the latency plot draws."""
    out: dict[str, list[dict]] = {}
    for r in recs:
        if r["measurement"] == "serve_point" and r["status"] == "ok" and r["metrics"].get(load) is not None:
            out.setdefault(r["kv_cache_dtype"], []).append(r["metrics"])
    return {k: sorted(v, key=lambda m: m[load]) for k, v in out.items()}


def serve_latency_figure(recs: list[dict], load: str = "rate") -> Figure | None:
    """p99 TTFT and p99 TPOT against the load, one line per dtype, the SLO as a dashed line; a point
    that misses the SLO is drawn hollow. No labels on the points: the legend and the axes say it all."""
    series = serve_points(recs, load)
    if not series:
        return None
    first = next(r for r in recs if r["measurement"] == "serve_point" and r["status"] == "ok")
    slo = first["params"].get("slo_ms") or {}
    colors = _dtype_colors(recs)
    xlabel, _ = LOADS[load]
    fig, axes = plt.subplots(1, 2, figsize=(10.0, 4.2))
    loads = sorted({m[load] for pts in series.values() for m in pts})
    for ax, (name, ylabel) in zip(axes, SERVE_LATENCIES):
        values = []
        for kv, pts in series.items():
            xs = [m[load] for m in pts]
            ys = [m.get(f"p99_{name}_ms") for m in pts]
            values += [y for y in ys if y]
            ax.plot(xs, ys, "-", color=colors[kv], label=kv, zorder=2)
            met = [m.get("slo_met") for m in pts]
            ax.scatter([x for x, ok in zip(xs, met) if ok], [y for y, ok in zip(ys, met) if ok], color=colors[kv],
                       s=28, zorder=3)
            ax.scatter([x for x, ok in zip(xs, met) if not ok], [y for y, ok in zip(ys, met) if not ok],
                       facecolors="white", edgecolors=colors[kv], s=28, zorder=3)
        if name in slo:
            ax.axhline(slo[name], color="#c0392b", linestyle="--", linewidth=1.2, zorder=1,
                       label=f"SLO: p99 {name.upper()} ≤ {slo[name]:,g} ms")
            values.append(slo[name])
        if values and max(values) / max(min(values), 1e-9) > 30:
            ax.set_yscale("log")
        else:
            ax.set_ylim(bottom=0)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:,.0f}" if v >= 10 else f"{v:g}"))
        if len(loads) > 2 and loads[-1] / loads[0] >= 8:
            ax.set_xscale("log", base=2)
        ax.set_xticks(loads, [f"{x:g}" for x in loads])
        ax.minorticks_off()
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="best")
    fig.suptitle(f"Latency vs load ({_serve_workload(first)}; hollow: SLO missed)\n{_title(recs)}", fontsize=9)
    fig.tight_layout()
    return fig


def serve_max_figure(recs: list[dict]) -> Figure | None:
    """The highest rate (and concurrency) within the SLO per dtype, as bars with their value and ratio
    to auto; a dtype that misses the SLO at every swept load gets an empty bar saying so."""
    summaries = [r for r in recs if r["measurement"] == "serve" and r["status"] == "ok"]
    if not summaries:
        return None
    panels = [(k, f"highest {'request rate (req/s)' if k == 'rate' else 'concurrency (clients)'} within the SLO")
              for k in ("rate", "concurrency")
              if any(r["metrics"].get(f"max_{k}_at_slo") is not None or r["metrics"].get(f"first_{k}_over_slo")
                     is not None for r in summaries)]
    if not panels:
        return None
    colors = _dtype_colors(recs)
    fig, axes = plt.subplots(1, len(panels), figsize=(max(4.8, 1.6 + 1.3 * len(summaries)) * len(panels), 4.2),
                             squeeze=False)
    for ax, (load, ylabel) in zip(axes[0], panels):
        labels = [r["kv_cache_dtype"] for r in summaries]
        values = [r["metrics"].get(f"max_{load}_at_slo") or 0 for r in summaries]
        bars = ax.bar(labels, values, color=[colors[k] for k in labels])
        top = max(values) or 1.0
        for bar, r in zip(bars, summaries):
            m, vs = r["metrics"], r.get("vs_auto") or {}
            v = m.get(f"max_{load}_at_slo")
            if v is None:
                over = m.get(f"first_{load}_over_slo")
                text = "none" + (f"\n(misses at {over:g})" if over is not None else "")
            else:
                ratio = vs.get(f"max_{load}_at_slo_ratio")
                text = f"{v:g} {'req/s' if load == 'rate' else 'clients'}" + (
                    f"\n{ratio:.2f}× auto" if ratio and r["kv_cache_dtype"] != "auto" else "")
            ax.annotate(text, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom",
                        fontsize=8, xytext=(0, 2), textcoords="offset points")
        ax.set_ylim(0, top * 1.3)
        ax.set_ylabel(ylabel, fontsize=9)
        ax.tick_params(axis="x", labelrotation=20, labelsize=8)
    first = summaries[0]
    fig.suptitle(f"Highest load within the SLO (p99 {_slo_text(first['metrics'].get('slo_ms') or {})}; "
                 f"{_serve_workload(first)})\n{_title(recs)}", fontsize=9)
    fig.tight_layout()
    return fig


def write_plots(recs: list[dict], out: Path) -> dict[str, str]:
    """Save the plots that have data; {name: file name relative to out}."""
    written = {}
    for name, make in (("capacity", capacity_figure), ("speed", speed_figure), ("quality", quality_figure),
                       ("serve_rate", lambda r: serve_latency_figure(r, "rate")),
                       ("serve_concurrency", lambda r: serve_latency_figure(r, "concurrency")),
                       ("serve_max", serve_max_figure)):
        fig = make(recs)
        if fig is None:
            continue
        fig.savefig(Path(out) / FILES[name], dpi=130, bbox_inches="tight")
        plt.close(fig)
        written[name] = FILES[name]
    return written
