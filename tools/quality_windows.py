"""One `s4kv bench quality` run, window by window: does one window of the text carry the figure?

`s4kv bench quality --text-windows N` scores N consecutive windows of the text, each its own request
from position 0, and reports them pooled. This splits every dtype's per-position data back into its
windows (the record's `window_positions`) and prints each window's perplexity delta and top-1
agreement against `auto`, with their batch-means errors, and the pooled figure last.

    python tools/quality_windows.py RUN/results.jsonl
"""

from __future__ import annotations

import argparse
import sys

from quality_paired import records

from s4kv.bench import metrics


def windows(rec: dict) -> list[tuple[int, int]]:
    """(start, end) of each window in the record's per-position lists."""
    sizes = rec["metrics"].get("window_positions") or [len(rec["raw"]["text_top1"])]
    out, start = [], 0
    for n in sizes:
        out.append((start, start + n))
        start += n
    return out


def rows(rec: dict, ref: dict) -> list[tuple[str, float, float, float, float]]:
    """(window, Δ perplexity %, its SE, top-1 agreement, its SE) per window, then pooled."""
    lp, rlp = rec["raw"]["text_logprobs"], ref["raw"]["text_logprobs"]
    top, rtop = rec["raw"]["text_top1"], ref["raw"]["text_top1"]
    spans = windows(rec)
    if spans != windows(ref):
        raise SystemExit(f"{rec['id']} and {ref['id']} scored different windows")
    out = []
    for i, (a, b) in enumerate(spans + ([(0, len(top))] if len(spans) > 1 else [])):
        d, dse = metrics.ppl_delta_with_error(lp[a:b], rlp[a:b])
        t, tse = metrics.top1_agreement_with_error(top[a:b], rtop[a:b])
        out.append(("all" if i == len(spans) else str(i + 1), d, dse, t, tse))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results")
    args = ap.parse_args()
    recs = records(args.results)
    ref = recs.pop("quality-auto")
    print("| record | window | Δ perplexity vs auto ± SE | top-1 agreement ± SE |\n|---|---|---|---|")
    for rid, rec in recs.items():
        for w, d, dse, t, tse in rows(rec, ref):
            print(f"| {rid} | {w} | {d:+.3f}% ± {dse:.3f} | {t:.4f} ± {tse:.4f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
