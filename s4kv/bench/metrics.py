"""The numbers of `s4kv bench`, as plain functions of plain lists (no vLLM, no torch).

Definitions (they are what `results.md` reports):

* perplexity: ``exp(-mean(logprob))`` over the scored positions, i.e. the log-probabilities vLLM
  returns for the actual next token at positions 1..N-1 of the first N tokens of the text
  (position 0 has no context and no logprob).
* teacher-forced top-1 agreement of X with `auto`: the fraction of scored positions where the
  rank-1 token under X equals the rank-1 token under `auto` (same text, same positions).
* free-running greedy, per prompt, X against `auto` (same prompt, same number of new tokens):
  - identical: the two sequences are equal;
  - token agreement: the fraction of positions i with ``x[i] == ref[i]`` (positionally, over the
    whole generation, so tokens that coincide again after a divergence count);
  - prefix agreement: the length of the common prefix divided by the generation length;
  - first divergence: the first position i with ``x[i] != ref[i]``, ``None`` when identical.
  Aggregates: number of identical sequences, mean token agreement, mean prefix agreement, the
  list of first divergences and their median, where an identical sequence counts as its length
  (it did not diverge within the generated tokens).
* ratios: value(X) / value(auto); ppl delta: 100 * (ppl(X) - ppl(auto)) / ppl(auto).
* standard errors of the perplexity delta and of top-1 agreement: the paired per-position
  differences (X's negative log-likelihood minus auto's; X's top-1 equal to auto's or not) are
  averaged over contiguous segments of SEGMENT positions, and the error is the spread of those
  segment means over the square root of their number (batch means). Positions inside one KV
  block share that block's quantization noise, so single positions are not independent; whole
  segments nearly are. It is the noise floor of one run: a different machine or TP layout rounds
  the model differently, which redraws the quantization noise, and across such runs the delta of
  int4_kivi moved by about this much (docs/quality-noise.md).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def perplexity(logprobs: Sequence[float]) -> float:
    """exp of the mean negative log-likelihood of the scored positions."""
    if not logprobs:
        raise ValueError("perplexity of zero scored positions")
    return math.exp(-sum(logprobs) / len(logprobs))


def ppl_delta_pct(ppl: float, ref_ppl: float) -> float:
    """Relative perplexity change vs the reference, in percent."""
    return 100.0 * (ppl - ref_ppl) / ref_ppl


SEGMENT = 128  # positions per segment of the batch-means standard error: one KV block


def batch_means(values: Sequence[float], segment: int = SEGMENT) -> tuple[float, float]:
    """(mean, standard error of the mean) of a series whose neighbours are correlated: the mean over
    all values, the error from the means of contiguous segments of `segment` values (a trailing
    partial segment only enters the mean)."""
    n = len(values)
    k = n // segment
    if k < 2:
        raise ValueError(f"a standard error needs >= 2 segments of {segment} values, got {n} values")
    means = [statistics.fmean(values[i * segment:(i + 1) * segment]) for i in range(k)]
    return statistics.fmean(values), statistics.stdev(means) / math.sqrt(k)


def ppl_delta_with_error(logprobs: Sequence[float], ref_logprobs: Sequence[float],
                         segment: int = SEGMENT) -> tuple[float, float]:
    """(perplexity delta vs the reference in percent, its standard error in percent), from the paired
    per-position log-probabilities of the same text. The delta equals ppl_delta_pct of the two
    perplexities: ppl(X) / ppl(ref) = exp(mean(nll_X - nll_ref))."""
    if len(logprobs) != len(ref_logprobs):
        raise ValueError(f"logprob lists differ in length: {len(logprobs)} vs {len(ref_logprobs)}")
    diff = [b - a for a, b in zip(logprobs, ref_logprobs)]  # nll(X) - nll(ref)
    _, se = batch_means(diff, segment)
    mean = statistics.fmean(diff)
    return 100.0 * math.expm1(mean), 100.0 * math.exp(mean) * se


def top1_agreement_with_error(top1: Sequence[int], ref_top1: Sequence[int],
                              segment: int = SEGMENT) -> tuple[float, float]:
    """(top-1 agreement, its standard error) over the same positions."""
    agreement = top1_agreement(top1, ref_top1)
    _, se = batch_means([float(a == b) for a, b in zip(top1, ref_top1)], segment)
    return agreement, se


def top1_agreement_difference_with_error(top1: Sequence[int], base_top1: Sequence[int], ref_top1: Sequence[int],
                                         segment: int = SEGMENT) -> tuple[float, float]:
    """(top-1 agreement with the reference of X minus that of a base, its paired standard error):
    the same positions, so the error is that of the difference, smaller than either's."""
    return batch_means([float(t == r) - float(b == r) for t, b, r in zip(top1, base_top1, ref_top1)], segment)


def ratio(value: float | None, ref: float | None) -> float | None:
    """value / ref, None when either is missing or ref is 0."""
    if value is None or ref is None or ref == 0:
        return None
    return value / ref


def top1_agreement(top1: Sequence[int], ref_top1: Sequence[int]) -> float:
    """Fraction of positions whose rank-1 token equals the reference's."""
    if len(top1) != len(ref_top1):
        raise ValueError(f"top-1 lists differ in length: {len(top1)} vs {len(ref_top1)}")
    if not top1:
        raise ValueError("top-1 agreement of zero positions")
    return sum(a == b for a, b in zip(top1, ref_top1)) / len(top1)


def first_divergence(seq: Sequence[int], ref: Sequence[int]) -> int | None:
    """First position where the two sequences differ; None when identical.

    Sequences of different lengths diverge at the shorter length (if the common part agrees)."""
    for i, (a, b) in enumerate(zip(seq, ref)):
        if a != b:
            return i
    if len(seq) != len(ref):
        return min(len(seq), len(ref))
    return None


def compare_greedy(seqs: Sequence[Sequence[int]], refs: Sequence[Sequence[int]]) -> dict:
    """Token-by-token comparison of greedy generations with the reference's (same prompts, in order)."""
    if len(seqs) != len(refs):
        raise ValueError(f"{len(seqs)} generations vs {len(refs)} reference generations")
    if not seqs:
        raise ValueError("no generations to compare")
    identical = 0
    token_agreements: list[float] = []
    prefix_agreements: list[float] = []
    firsts: list[int | None] = []
    firsts_or_len: list[int] = []
    for seq, ref in zip(seqs, refs):
        n = max(len(seq), len(ref))
        fd = first_divergence(seq, ref)
        firsts.append(fd)
        if fd is None:
            identical += 1
        firsts_or_len.append(n if fd is None else fd)
        token_agreements.append(sum(a == b for a, b in zip(seq, ref)) / n if n else 1.0)
        prefix_agreements.append((n if fd is None else fd) / n if n else 1.0)
    return {
        "num_sequences": len(seqs),
        "identical_sequences": identical,
        "token_agreement": statistics.fmean(token_agreements),
        "prefix_agreement": statistics.fmean(prefix_agreements),
        "first_divergence": firsts,
        "median_first_divergence": statistics.median(firsts_or_len),
        "per_sequence_token_agreement": token_agreements,
    }


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def decode_throughput(batch: int, new_tokens: int, t_prefill: float, t_total: float) -> float | None:
    """Decode tok/s with decode isolated as (prompt + N+1 tokens) - (prompt + 1 token): the two
    runs share the prefill and the first token, so the difference is N decode steps of `batch`
    sequences."""
    dt = t_total - t_prefill
    if dt <= 0:
        return None
    return batch * new_tokens / dt


def prefill_throughput(batch: int, context: int, t_prefill: float) -> float | None:
    """Prefill tok/s: batch * context prompt tokens in the time of generate(max_tokens=1)."""
    if t_prefill <= 0:
        return None
    return batch * context / t_prefill


def saturated_batch(num_blocks: int, block_size: int, context: int, new_tokens: int) -> int:
    """How many sequences of context + new_tokens the KV cache holds at once (whole blocks each)."""
    per_seq = -(-(context + new_tokens) // block_size)
    return num_blocks // per_seq


# ---------------------------------------------------------------------------------------------
# serving (s4kv bench serve): the SLO and the highest load that meets it

SLO_METRICS = ("ttft", "tpot", "e2el")  # what vLLM's --goodput accepts, in milliseconds


def slo_misses(point: dict, slo: dict[str, float]) -> list[str]:
    """Why a measured point does not meet the SLO (empty when it does). The SLO holds targets for
    the p99 of each metric in slo (e.g. {"ttft": 2000, "tpot": 50}, milliseconds); a point meets it
    when every p99 is at or below its target and every request completed."""
    misses = []
    if point.get("failed") or point.get("completed") != point.get("num_prompts"):
        misses.append(f"{point.get('failed') or 0} failed, {point.get('completed')} of "
                      f"{point.get('num_prompts')} completed")
    for name, target in slo.items():
        p99 = point.get(f"p99_{name}_ms")
        if p99 is None:
            misses.append(f"no p99 {name}")
        elif p99 > target:
            misses.append(f"p99 {name.upper()} {p99:,.1f} ms > {target:,g} ms")
    return misses


def max_load_at_slo(points: list[dict], key: str, slo: dict[str, float]) -> tuple[float | None, float | None]:
    """(highest load, lowest load above it) of a sweep: the highest value of `key` (offered request
    rate, or client concurrency) such that the point at it and every point at a lower value meet
    the SLO, and the first swept value that does not (None when none is swept). (None, lowest value)
    when even the lowest point misses. A point that misses caps the sweep even if a higher one
    meets the SLO again: that is noise or a measurement too short, not a sustainable load."""
    best = None
    for p in sorted((p for p in points if p.get(key) is not None), key=lambda p: p[key]):
        if slo_misses(p, slo):
            return best, p[key]
        best = p[key]
    return best, None
