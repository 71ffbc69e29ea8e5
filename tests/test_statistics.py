"""Diagnostic statistics (docs/metrics.md, "``udpo diagnose``"): Cohen's d, Welch t-test, Pearson r, selective
prediction, bins."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from udpo.rewards.statistics import (
    U_SYS_BINS,
    bin_index,
    bin_label,
    cohens_d,
    failure_vs_success,
    pearson,
    selective_prediction,
    stratified_gains,
)
from udpo.study.intervals import paired_bootstrap


def test_cohens_d_by_hand():
    # means 0.6 vs 0.2; squared deviations 0.02 + 0.02 over n - 2 = 2
    assert cohens_d([0.5, 0.7], [0.1, 0.3]) == pytest.approx(0.4 / math.sqrt(0.02))
    # a class of one adds no variance: pooled sd sqrt(0.02 / 1)
    assert cohens_d([0.9], [0.1, 0.3]) == pytest.approx(0.7 / math.sqrt(0.02))
    assert cohens_d([0.1, 0.3], [0.5, 0.7]) < 0


# 1/3 and the next float up: equal in exact arithmetic for a metric reached by two different sums
THIRD, THIRD_UP = 1 / 3, float(np.nextafter(1 / 3, 1))


@pytest.mark.parametrize(
    ("fail", "success"),
    [
        ([], [0.1, 0.2]),
        ([0.1], []),
        ([0.5], [0.1]),
        ([0.5, 0.5], [0.2, 0.2]),
        ([0.1] * 3, [0.1] * 2),  # float means of equal values are an ulp off: still no variance
        ([THIRD, THIRD_UP], [THIRD_UP, THIRD, THIRD]),  # rounding noise is no variance
    ],
)
def test_cohens_d_undefined(fail, success):
    assert math.isnan(cohens_d(fail, success))


def test_failure_vs_success_welch_by_hand():
    values = [0.9, 0.7, 0.8, 0.1, 0.3, 0.2, 0.4]
    correct = [False, False, False, True, True, True, True]
    res = failure_vs_success(values, correct)
    fail, success = np.array(values[:3]), np.array(values[3:])
    se = math.sqrt(fail.var(ddof=1) / 3 + success.var(ddof=1) / 4)
    assert res.t_statistic == pytest.approx((fail.mean() - success.mean()) / se)
    assert (res.n_fail, res.n_success) == (3, 4)
    assert res.mean_fail == pytest.approx(0.8) and res.mean_success == pytest.approx(0.25)
    a, b = fail.var(ddof=1) / 3, success.var(ddof=1) / 4
    df = (a + b) ** 2 / (a**2 / 2 + b**2 / 3)  # Welch-Satterthwaite
    assert res.p_value == pytest.approx(2 * stats.t.sf(abs(res.t_statistic), df))
    assert res.cohens_d == pytest.approx(cohens_d(fail, success))


def test_failure_vs_success_degenerate_cases_give_nan():
    one_fail = failure_vs_success([0.9, 0.1, 0.2], [False, True, True])
    assert math.isnan(one_fail.p_value) and one_fail.n_fail == 1
    constant = failure_vs_success([0.5, 0.5, 0.5, 0.5], [False, False, True, True])
    assert math.isnan(constant.p_value) and math.isnan(constant.cohens_d)
    no_success = failure_vs_success([0.5, 0.4], [False, False])
    assert math.isnan(no_success.mean_success)


@pytest.mark.filterwarnings("error")  # SciPy's precision-loss warning must not reach the console
def test_failure_vs_success_near_constant_groups():
    noise = failure_vs_success([THIRD, THIRD_UP, THIRD, THIRD_UP, THIRD], [False, False, True, True, True])
    assert math.isnan(noise.t_statistic) and math.isnan(noise.p_value) and math.isnan(noise.cohens_d)
    assert noise.mean_fail == pytest.approx(1 / 3)
    # failures all 0.7, successes 0.1, 0.5, 0.6: Welch's t = (0.7 - 0.4) / sqrt(s_s^2 / 3) with
    # s_s^2 = (0.09 + 0.01 + 0.04) / 2 = 0.07, and Welch-Satterthwaite df = n_s - 1 = 2
    res = failure_vs_success([0.7, 0.7, 0.7, 0.1, 0.5, 0.6], [False, False, False, True, True, True])
    t = 0.3 / math.sqrt(0.07 / 3)
    assert res.t_statistic == pytest.approx(t)
    assert res.p_value == pytest.approx(2 * stats.t.sf(t, 2))
    assert res.cohens_d == pytest.approx(0.3 / math.sqrt(0.14 / 4))  # pooled: only successes vary


def test_pearson_by_hand():
    r, p = pearson([1, 2, 3, 4], [2, 4, 6, 8])
    assert r == pytest.approx(1.0) and p == pytest.approx(0.0, abs=1e-12)
    x, y = np.array([1.0, 2, 3, 4, 5]), np.array([1.0, 0, 1, 0, 0])
    expected = ((x - x.mean()) * (y - y.mean())).sum() / math.sqrt(
        ((x - x.mean()) ** 2).sum() * ((y - y.mean()) ** 2).sum()
    )
    assert pearson(x, y)[0] == pytest.approx(expected)
    assert all(math.isnan(v) for v in pearson([1, 1, 1], [0, 1, 0]))  # constant input
    assert all(math.isnan(v) for v in pearson([THIRD, THIRD_UP, THIRD, THIRD_UP], [0, 0, 1, 1]))  # noise
    assert all(math.isnan(v) for v in pearson([1, 2], [0, 1]))  # too few points


def test_selective_prediction_by_hand():
    curve = selective_prediction(
        [0.4, 0.1, 0.3, 0.2], [False, True, False, True], coverages=[25, 50, 75, 100]
    )
    assert [c["n_kept"] for c in curve] == [1, 2, 3, 4]
    assert [c["accuracy"] for c in curve] == pytest.approx([1.0, 1.0, 2 / 3, 0.5])


def test_selective_prediction_ties_count_at_their_mean_accuracy():
    # three debates tied at 0: keep 2 of them -> expected accuracy 2/3 whatever the file order
    curve = selective_prediction([0.0, 0.0, 0.0, 1.0], [True, False, True, False], coverages=[50, 100])
    assert curve[0]["accuracy"] == pytest.approx(2 / 3)
    assert curve[1]["accuracy"] == pytest.approx(0.5)
    assert [c["k"] for c in selective_prediction([0.2], [True])] == list(range(10, 101, 10))


def test_selective_prediction_bad_input():
    with pytest.raises(ValueError, match="at least one debate"):
        selective_prediction([], [])
    with pytest.raises(ValueError, match="2 values but 1 correctness"):
        selective_prediction([0.1, 0.2], [True])
    with pytest.raises(ValueError, match="contains NaN at index 1"):
        selective_prediction([0.1, float("nan")], [True, False])
    with pytest.raises(ValueError, match="booleans or 0/1"):
        selective_prediction([0.1], [0.5])
    with pytest.raises(ValueError, match="coverage k"):
        selective_prediction([0.1], [True], coverages=[0])


def test_bins():
    assert bin_index([0.0, 0.19, 0.2, 0.5, 0.79999, 0.8, 1.0]).tolist() == [0, 0, 1, 2, 3, 4, 4]
    assert [bin_label(j) for j in range(5)] == [
        "[0, 0.2)",
        "[0.2, 0.4)",
        "[0.4, 0.6)",
        "[0.6, 0.8)",
        "[0.8, 1]",
    ]
    assert U_SYS_BINS == (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
    with pytest.raises(ValueError, match="outside"):
        bin_index([1.2])


def test_stratified_gains_by_hand():
    u = [0.1, 0.15, 0.9, 0.85, 0.5]
    base = [1, 0, 0, 0, 1]
    method = [1, 1, 1, 0, 0.5]  # a per-question mean over several debates is allowed
    rows = stratified_gains(u, base, method)
    assert [r["n_questions"] for r in rows] == [2, 0, 1, 0, 2]
    assert rows[0]["gain"] == pytest.approx(0.5)
    assert rows[2]["gain"] == pytest.approx(-0.5)
    assert rows[4]["baseline_accuracy"] == 0.0 and rows[4]["accuracy"] == 0.5
    assert math.isnan(rows[1]["gain"])
    with pytest.raises(ValueError, match="differ in length"):
        stratified_gains([0.1], [1, 0], [1])


def test_paired_bootstrap_of_a_constant_change_is_that_change():
    change = paired_bootstrap([0.2, 0.5, 0.1], [0.3, 0.6, 0.2])
    assert (change.delta, change.low, change.high) == pytest.approx((0.1, 0.1, 0.1))
    assert (change.before, change.after, change.n_questions, change.n_seeds) == pytest.approx(
        (0.8 / 3, 1.1 / 3, 3, 1)
    )


def test_paired_bootstrap_of_two_questions_by_hand():
    # per-question changes 0 and 1: a resample of 2 questions has mean 0 (p 1/4), 1/2 (p 1/2) or 1 (p 1/4),
    # so the 95% interval is [0, 1] and the 40% interval (30th..70th percentile) is [1/2, 1/2]
    wide = paired_bootstrap([0, 0], [0, 1])
    narrow = paired_bootstrap([0, 0], [0, 1], level=0.4)
    assert (wide.delta, wide.low, wide.high) == (0.5, 0.0, 1.0)
    assert (narrow.low, narrow.high) == (0.5, 0.5)


def test_paired_bootstrap_resamples_questions_across_seeds():
    # seed 0 gains 1 on question 0, seed 1 loses 1 on it: the seeds' mean change per question is 0
    change = paired_bootstrap([[0, 0, 0], [1, 0, 0]], [[1, 0, 0], [0, 0, 0]])
    assert (change.delta, change.low, change.high, change.n_seeds) == (0.0, 0.0, 0.0, 2)
    rng = np.random.default_rng(1)
    b, a = rng.random((2, 50)), rng.random((2, 50))
    random = paired_bootstrap(b, a, seed=3)
    assert random.low <= random.delta <= random.high
    assert random == paired_bootstrap(b, a, seed=3)  # reproducible
    with pytest.raises(ValueError, match="same"):
        paired_bootstrap([[0, 1]], [[0, 1, 2]])


def test_paired_bootstrap_of_seeds_with_their_own_questions_by_hand():
    # seed 0 gains 1 on both its questions, seed 1 nothing on its one: every resample averages 1 and 0
    fixed = paired_bootstrap([[0, 0], [1]], [[1, 1], [1]], shared_questions=False)
    assert (fixed.delta, fixed.low, fixed.high, fixed.n_questions, fixed.n_seeds) == (0.5, 0.5, 0.5, 3, 2)
    assert (fixed.before, fixed.after) == (0.5, 1.0)  # the mean of the seeds' means
    # seed 0's changes 0 and 1 resample to 0, 1/2, 1 (p 1/4, 1/2, 1/4); seed 1 always 0: halves of those
    varied = paired_bootstrap([[0, 0], [0, 0, 0]], [[0, 1], [0, 0, 0]], shared_questions=False)
    assert (varied.delta, varied.low, varied.high) == (0.25, 0.0, 0.5)
    with pytest.raises(ValueError, match="same number of questions"):
        paired_bootstrap([[0, 0], [1]], [[1, 1], [1]])
    with pytest.raises(ValueError, match="same questions per seed"):
        paired_bootstrap([], [])
