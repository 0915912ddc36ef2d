"""Two `s4kv bench quality` runs of one dtype, position by position: is B's quality different from A's?

Each run's records carry per-position log-probabilities and top-1 tokens of the same text, and an
`auto` record. The difference B - A is paired (same positions), so its batch-means error is smaller
than either run's error against bf16. The two runs' `auto` records must agree: the same text and,
on CPU where bf16 is deterministic, the same numbers. Otherwise the comparison is refused.

    python tools/quality_paired.py A/results.jsonl B/results.jsonl [--kv int4_kivi]
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import sys

from s4kv.bench import metrics


def records(path: str) -> dict[str, dict]:
    """A run's quality records by id, from its results.jsonl (or results.jsonl.gz: results folders
    keep large runs compressed, since the working tree travels with every device call)."""
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        return {r["id"]: r for r in map(json.loads, f) if r.get("measurement") == "quality" and r.get("raw")}


def greedy(rec: dict, ref: dict) -> dict | None:
    """rec's greedy continuations against ref's; None for a run without them (`--prompts none`)."""
    if not rec["raw"].get("greedy_tokens") or not ref["raw"].get("greedy_tokens"):
        return None
    return metrics.compare_greedy(rec["raw"]["greedy_tokens"], ref["raw"]["greedy_tokens"])


def identical(g: dict | None) -> str:
    return "–" if g is None else f"{g['identical_sequences']}/{g['num_sequences']}"


def paired(a: dict, b: dict, ref: dict) -> dict:
    """Perplexity of B against A in percent, top-1 agreement with `ref` of B minus A, each with its
    paired batch-means error; and identical greedy continuations (vs ref) of each."""
    la, lb = a["raw"]["text_logprobs"], b["raw"]["text_logprobs"]
    d_ppl, se_ppl = metrics.ppl_delta_with_error(lb, la)
    d_top, se_top = metrics.top1_agreement_difference_with_error(b["raw"]["text_top1"], a["raw"]["text_top1"],
                                                                 ref["raw"]["text_top1"])
    g = {k: greedy(r, ref) for k, r in (("a", a), ("b", b))}
    return {"ppl_b_vs_a_pct": d_ppl, "ppl_se_pct": se_ppl, "top1_b_minus_a": d_top, "top1_se": se_top,
            "greedy_a": g["a"], "greedy_b": g["b"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--kv", default="int4_kivi")
    args = ap.parse_args()
    ra, rb = records(args.a), records(args.b)
    ref_a, ref_b = ra["quality-auto"], rb["quality-auto"]
    if ref_a["raw"]["text_logprobs"] != ref_b["raw"]["text_logprobs"]:
        print("the two runs' auto records differ: not the same text or not a deterministic engine", file=sys.stderr)
        return 2
    r = paired(ra[f"quality-{args.kv}"], rb[f"quality-{args.kv}"], ref_a)
    ga, gb = r["greedy_a"], r["greedy_b"]
    print(f"| {args.kv}: B against A | perplexity {r['ppl_b_vs_a_pct']:+.3f}% ± {r['ppl_se_pct']:.3f} | "
          f"top-1 agreement {r['top1_b_minus_a']:+.4f} ± {r['top1_se']:.4f} | identical greedy "
          f"{identical(ga)} -> {identical(gb)} |")
    return 0 if math.isfinite(r["ppl_b_vs_a_pct"]) else 1


if __name__ == "__main__":
    sys.exit(main())
