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
