"""bf16 against bf16: how far another implementation of the same model moves the quality figures.

`s4kv bench quality`'s noise floor is a second `auto` engine of the same code, which is bit-identical
(100% top-1 on CPU and on the H200): it says nothing about how much of a cache's top-1 loss is
merely arithmetic. This compares the `auto` record of run B (e.g. bf16 through another attention
backend, `tools/gpu/run-on-device.sh bench-quality-floor`) with the `auto` record of run A (the
reference the caches were scored against), with the bench's own figures and errors: perplexity
delta, teacher-forced top-1 agreement, identical greedy continuations. It also scores every other
dtype of A against B's bf16, and A's caches against A's bf16 restricted to the positions where the
two bf16 implementations agree (what is left when the reference's near-ties are set aside).

    python tools/quality_floor.py A/results.jsonl B/results.jsonl
"""

from __future__ import annotations

import argparse
import sys

from quality_paired import greedy, identical, records  # tools/ is the script's directory

from s4kv.bench import metrics


def against(rec: dict, ref: dict) -> dict:
    """rec's quality figures against ref (same text and prompts), with batch-means errors."""
    d_ppl, se_ppl = metrics.ppl_delta_with_error(rec["raw"]["text_logprobs"], ref["raw"]["text_logprobs"])
    top, se_top = metrics.top1_agreement_with_error(rec["raw"]["text_top1"], ref["raw"]["text_top1"])
    return {"ppl_pct": d_ppl, "ppl_se_pct": se_ppl, "top1": top, "top1_se": se_top, "greedy": greedy(rec, ref)}


def top1_where_references_agree(rec: dict, ref: dict, other_ref: dict) -> tuple[float, int]:
    """rec's top-1 agreement with ref over the positions where ref and other_ref pick the same token."""
    keep = [i for i, (a, b) in enumerate(zip(ref["raw"]["text_top1"], other_ref["raw"]["text_top1"])) if a == b]
    top = rec["raw"]["text_top1"]
    hits = sum(top[i] == ref["raw"]["text_top1"][i] for i in keep)
    return (hits / len(keep) if keep else float("nan")), len(keep)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", help="the run whose bf16 (`auto`) is the reference")
    ap.add_argument("b", help="the run whose `auto` record is the other implementation")
    args = ap.parse_args()
    ra, rb = records(args.a), records(args.b)
    ref, other = ra["quality-auto"], rb["quality-auto"]
    if ref["raw"]["text_top1"] and len(ref["raw"]["text_top1"]) != len(other["raw"]["text_top1"]):
        print("the two runs scored different texts", file=sys.stderr)
        return 2
    print("| record | against | Δ perplexity ± SE | top-1 ± SE | identical greedy | top-1 where the two bf16 agree |")
    print("|---|---|---|---|---|---|")
    # A's caches (its bf16 repeat, `quality-auto-r2`, is bit-identical to its bf16: left out)
    caches = {k: r for k, r in ra.items() if not k.startswith("quality-auto")}
    rows = [("B: quality-auto", other, "A's bf16")]
    rows += [(f"A: {k}", r, "A's bf16") for k, r in caches.items()]
    rows += [(f"A: {k}", r, "B's bf16") for k, r in caches.items()]
    for name, rec, which in rows:
        base = ref if which == "A's bf16" else other
        f = against(rec, base)
        agree, n = top1_where_references_agree(rec, base, other if base is ref else ref)
        print(f"| {name} | {which} | {f['ppl_pct']:+.3f}% ± {f['ppl_se_pct']:.3f} | {f['top1']:.4f} ± {f['top1_se']:.4f} "
              f"| {identical(f['greedy'])} | {agree:.4f} ({n} positions) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
