"""The end-to-end tests' own bound helpers (tests/e2e_harness.py) against hand-computed cases."""

import e2e_harness
import pytest
from e2e_harness import NOISE_Z, allowed_misses, quality_vs_bf16


@pytest.fixture(autouse=True)
def _no_report_lines():
    """These cases are made up: keep them out of the measured numbers the session prints."""
    n = len(e2e_harness.REPORT)
    yield
    del e2e_harness.REPORT[n:]


def test_allowed_misses_is_the_binomial_tail():
    # 4 tries missing with p = 0.05: P(>1) = 1 - .95^4 - 4 * .05 * .95^3 = 0.0140; P(>2) = 4.8e-4
    assert allowed_misses(4, 0.05) == 2
    assert allowed_misses(4, 0.05, alpha=0.02) == 1
    assert allowed_misses(4, 0.0) == 0
    assert allowed_misses(4, 1.0) == 4


def test_quality_bounds_are_the_targets_loosened_by_the_runs_own_error():
    import math

    ref = {"text_logprobs": [math.log(0.5)] * 256, "text_top1": [1] * 256}
    same = quality_vs_bf16(ref, ref, 0.5, 0.96, "identical")
    assert same["ppl_delta_pct"] == 0.0 and same["ppl_delta_se_pct"] == 0.0 and same["ppl_ok"]
    assert same["top1"] == 1.0 and same["top1_bound"] == 0.96 and same["top1_ok"]
    # a cache worse by 0.015 / 0.025 nats in alternate blocks: +2.0%, SE 0.13%: far over the bound
    lp = [math.log(0.5) - (0.015 if (i // 128) % 2 else 0.025) for i in range(16 * 128)]
    worse = {"text_logprobs": lp, "text_top1": [1] * (15 * 128) + [2] * 128}
    ref16 = {"text_logprobs": [math.log(0.5)] * (16 * 128), "text_top1": [1] * (16 * 128)}
    q = quality_vs_bf16(worse, ref16, 0.5, 0.96, "worse")
    assert q["ppl_delta_pct"] == pytest.approx(100 * math.expm1(0.02))
    assert q["ppl_delta_bound_pct"] == pytest.approx(0.5 + NOISE_Z * q["ppl_delta_se_pct"])
    assert q["ppl_delta_bound_pct"] < 1.0
    assert not q["ppl_ok"]
    # top-1: 15 of 16 blocks agree: 0.9375, segment SE 0.25 / 4 = 0.0625: within its (wide) bound
    assert q["top1"] == 0.9375 and q["top1_se"] == pytest.approx(0.0625) and q["top1_ok"]
