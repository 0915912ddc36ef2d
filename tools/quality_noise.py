"""The noise floor of the quality measurement, from committed `s4kv bench quality` records.

    python tools/quality_noise.py docs/results/*/results.jsonl docs/results/*/*/results.jsonl

For every run with an `auto` record and a lossy dtype: the perplexity delta and top-1 agreement
against `auto`, each with its standard error (s4kv.bench.metrics, batch means over 128-token
segments), as a markdown table (docs/quality-noise.md is its output).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from s4kv.bench import metrics


def quality_records(path: Path) -> dict[str, dict]:
    out = {}
    for line in path.read_text().splitlines():
        r = json.loads(line)
        if r.get("measurement") == "quality" and r.get("status") == "ok" and r.get("repeat", 1) == 1:
            out[r["kv_cache_dtype"]] = r
    return out


def main(paths: list[str]) -> int:
    print("| run | device | KV dtype | Δ perplexity | SE | top-1 agreement | SE |")
    print("|---|---|---|---|---|---|---|")
    for p in sorted(paths):
        recs = quality_records(Path(p))
        ref = recs.get("auto")
        if ref is None:
            continue
        for kv, r in recs.items():
            if kv == "auto":
                continue
            lp, rlp = r["raw"]["text_logprobs"], ref["raw"]["text_logprobs"]
            delta, dse = metrics.ppl_delta_with_error(lp, rlp)
            top1, tse = metrics.top1_agreement_with_error(r["raw"]["text_top1"], ref["raw"]["text_top1"])
            run = Path(p).resolve().parent
            run = run.relative_to(ROOT / "docs" / "results") if (ROOT / "docs" / "results") in run.parents else run
            print(f"| {run} | {r['env'].get('device', '?')} | `{kv}` | {delta:+.3f}% | {dse:.3f}% | "
                  f"{top1:.4f} | {tse:.4f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
