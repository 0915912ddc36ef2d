"""PNG plots of the records (matplotlib, Agg): capacity bars, decode tok/s versus context (one line per
KV dtype), and the quality table as an image. Each ``*_figure`` returns the Figure (None when there is
nothing to plot); ``write_plots`` saves them and returns {name: file name}."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

from matplotlib import pyplot as plt
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from s4kv.bench import records, report

FILES = {"capacity": "capacity.png", "speed": "decode_vs_context.png", "quality": "quality.png"}


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
    fig, ax = plt.subplots(figsize=(9.0, 0.55 + 0.3 * (len(cells) + 1)))
    ax.axis("off")
    table = ax.table(cellText=cells, colLabels=QUALITY_COLUMNS, loc="center", cellLoc="center")
    table.auto_set_font_size(False)
    table.set_fontsize(8)
    table.scale(1.0, 1.7)
    for (row, _col), cell in table.get_celld().items():
        if row == 0:
            cell.set_facecolor("#dde6f0")
            cell.set_text_props(weight="bold")
    r = next(r for r in recs if r["measurement"] == "quality" and r["status"] == "ok")
    m = r["metrics"]
    ax.set_title(f"Quality vs auto: ppl of {m.get('text_tokens')} tokens (chunked prefill {m.get('chunk')}), "
                 f"greedy {m.get('num_prompts')}×{m.get('new_tokens')} tokens\n{_title(recs)}", fontsize=9)
    fig.tight_layout()
    return fig


def write_plots(recs: list[dict], out: Path) -> dict[str, str]:
    """Save the plots that have data; {name: file name relative to out}."""
    written = {}
    for name, make in (("capacity", capacity_figure), ("speed", speed_figure), ("quality", quality_figure)):
        fig = make(recs)
        if fig is None:
            continue
        fig.savefig(Path(out) / FILES[name], dpi=130, bbox_inches="tight")
        plt.close(fig)
        written[name] = FILES[name]
    return written
