"""s4kv.bench.metrics against hand-computed cases."""

import math

import pytest

from s4kv.bench import metrics


def test_perplexity():
    assert metrics.perplexity([math.log(0.5)] * 4) == pytest.approx(2.0)
    # exp(-(ln 0.25 + ln 1) / 2) = exp(ln 2) = 2
    assert metrics.perplexity([math.log(0.25), 0.0]) == pytest.approx(2.0)
    assert metrics.perplexity([0.0, 0.0]) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        metrics.perplexity([])


def test_ppl_delta_and_ratio():
    assert metrics.ppl_delta_pct(2.2, 2.0) == pytest.approx(10.0)
    assert metrics.ppl_delta_pct(1.9, 2.0) == pytest.approx(-5.0)
    assert metrics.ratio(300, 100) == 3.0
    assert metrics.ratio(None, 100) is None
    assert metrics.ratio(1, 0) is None


def test_top1_agreement():
    assert metrics.top1_agreement([1, 2, 3, 4], [1, 2, 0, 4]) == 0.75
    assert metrics.top1_agreement([7], [7]) == 1.0
    with pytest.raises(ValueError):
        metrics.top1_agreement([1, 2], [1])


def test_batch_means_standard_error():
    # segments of 2: means 1, 3, 5 -> stdev 2 -> SE 2 / sqrt(3); the trailing value enters the mean only
    mean, se = metrics.batch_means([0, 2, 2, 4, 4, 6, 100], segment=2)
    assert mean == pytest.approx(118 / 7)
    assert se == pytest.approx(2 / math.sqrt(3))
    assert metrics.batch_means([1.0] * 8, segment=4) == (1.0, 0.0)
    with pytest.raises(ValueError):
        metrics.batch_means([1.0] * 7, segment=4)  # one segment: no spread to measure


def test_paired_perplexity_delta_and_its_error():
    ref = [math.log(0.5)] * 4
    # X loses ln 2 nats on segment 1 and nothing on segment 2: mean diff ln2 / 2, ppl ratio sqrt(2)
    x = [math.log(0.25)] * 2 + [math.log(0.5)] * 2
    delta, se = metrics.ppl_delta_with_error(x, ref, segment=2)
    assert delta == pytest.approx(100 * (math.sqrt(2) - 1))
    assert delta == pytest.approx(metrics.ppl_delta_pct(metrics.perplexity(x), metrics.perplexity(ref)))
    # segment means ln2 and 0: stdev ln2 / sqrt(2), SE ln2 / 2, scaled by the ratio (d/dm of e^m)
    assert se == pytest.approx(100 * math.sqrt(2) * math.log(2) / 2)
    assert metrics.ppl_delta_with_error(ref, ref, segment=2) == (0.0, 0.0)
    with pytest.raises(ValueError):
        metrics.ppl_delta_with_error(x, ref[:3], segment=2)


def test_top1_agreement_and_its_error():
    # segments [agree, agree], [agree, miss]: means 1, 0.5 -> SE 0.25
    agreement, se = metrics.top1_agreement_with_error([1, 2, 3, 4], [1, 2, 3, 0], segment=2)
    assert agreement == 0.75 and se == pytest.approx(0.25)


def test_top1_agreement_difference_is_paired():
    # X agrees where the base does not and vice versa: per-position differences [+1, 0], [0, -1]
    # -> means 0.5, -0.5 -> mean 0, SE 0.5
    d, se = metrics.top1_agreement_difference_with_error([1, 2, 3, 0], [0, 2, 3, 4], [1, 2, 3, 4], segment=2)
    assert d == 0 and se == pytest.approx(0.5)


def test_first_divergence():
    assert metrics.first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert metrics.first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert metrics.first_divergence([9, 2, 3], [1, 2, 3]) == 0
    assert metrics.first_divergence([1, 2], [1, 2, 3]) == 2


def test_compare_greedy_hand_computed():
    seqs = [[1, 2, 3, 4], [1, 2, 3, 4], [5, 6, 7, 8]]
    refs = [[1, 2, 3, 4], [1, 9, 3, 4], [0, 6, 7, 0]]
    g = metrics.compare_greedy(seqs, refs)
    assert g["num_sequences"] == 3
    assert g["identical_sequences"] == 1
    # positional agreement: 4/4, 3/4, 2/4
    assert g["token_agreement"] == pytest.approx(0.75)
    # common prefix / length: 4/4, 1/4, 0/4
    assert g["prefix_agreement"] == pytest.approx(5 / 12)
    assert g["first_divergence"] == [None, 1, 0]
    # identical counts as its length (4): median of 4, 1, 0
    assert g["median_first_divergence"] == 1
    assert g["per_sequence_token_agreement"] == [1.0, 0.75, 0.5]


def test_compare_greedy_all_identical_median_is_length():
    g = metrics.compare_greedy([[1, 2, 3]] * 2, [[1, 2, 3]] * 2)
    assert g["identical_sequences"] == 2
    assert g["median_first_divergence"] == 3
    assert g["token_agreement"] == 1.0


def test_throughputs():
    # 8 sequences x 128 decode tokens in 10 - 2 = 8 s
    assert metrics.decode_throughput(8, 128, 2.0, 10.0) == pytest.approx(128.0)
    assert metrics.decode_throughput(8, 128, 2.0, 2.0) is None
    assert metrics.prefill_throughput(8, 1024, 2.0) == pytest.approx(4096.0)


def test_saturated_batch():
    # ceil((1000 + 129) / 16) = 71 blocks per sequence; 1000 // 71 = 14
    assert metrics.saturated_batch(1000, 16, 1000, 129) == 14
    assert metrics.saturated_batch(10, 16, 1000, 129) == 0
    assert metrics.saturated_batch(64, 16, 1008, 16) == 1
