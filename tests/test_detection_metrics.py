"""Precision, recall, F1, F2 with "error" positive, on hand-made confusion matrices."""

from __future__ import annotations

import pytest

from udpo.rewards.detection import (
    Confusion,
    confusion,
    detection_scores,
    f_beta,
    mean_scores,
    scores_from_confusion,
)

E, N = "error", "no_error"


def test_scores_of_a_hand_made_confusion_matrix():
    # 10 items: 6 errors (4 found, 2 missed), 4 correct responses (1 false alarm, 3 passed)
    labels = [E] * 6 + [N] * 4
    predictions = [E, E, E, E, N, N] + [E, N, N, N]
    s = detection_scores(predictions, labels)
    assert (s.tp, s.fp, s.fn, s.tn, s.n) == (4, 1, 2, 3, 10)
    # precision 4/5, recall 4/6; F1 = 2PR/(P+R) = 8/11; F2 = 5PR/(4P+R) = 5*(8/15)/(16/5+2/3) = 40/58
    assert s.precision == pytest.approx(0.8)
    assert s.recall == pytest.approx(2 / 3)
    assert s.f1 == pytest.approx(8 / 11)
    assert s.f2 == pytest.approx(20 / 29)
    assert s.accuracy == pytest.approx(0.7)


def test_f2_weighs_recall_more_than_f1():
    high_recall = scores_from_confusion(Confusion(tp=9, fp=6, fn=1, tn=4))  # P = 0.6, R = 0.9
    high_precision = scores_from_confusion(Confusion(tp=6, fp=1, fn=4, tn=9))  # P = 6/7, R = 0.6
    assert high_recall.f2 > high_precision.f2
    assert high_recall.f2 == pytest.approx(5 * 0.6 * 0.9 / (4 * 0.6 + 0.9))  # 0.8182
    assert f_beta(0.6, 0.9, 1.0) == pytest.approx(0.72)


def test_unparsed_verdicts_are_always_wrong():
    c = confusion([None, None, E], [E, N, N])
    assert (c.tp, c.fp, c.fn, c.tn, c.n_unparsed) == (0, 2, 1, 0, 2)


def test_zero_denominators_give_zero():
    never = detection_scores([N, N], [E, N])  # never says "error": precision 0/0
    assert (never.precision, never.recall, never.f1, never.f2) == (0.0, 0.0, 0.0, 0.0)
    assert never.accuracy == 0.5
    assert f_beta(0.0, 0.0, 2.0) == 0.0


def test_mean_is_unweighted_over_tasks():
    a = detection_scores([E, E], [E, E])  # F1 1
    b = detection_scores([N, N, N, E], [E, E, N, N])  # F1 0
    assert mean_scores([a, b])["f1"] == pytest.approx(0.5)


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="2 predictions for 1 labels"):
        confusion([E, N], [E])
    with pytest.raises(ValueError, match="label is None"):
        confusion([E], [None])
    with pytest.raises(ValueError, match="beta"):
        f_beta(0.5, 0.5, 0)
    with pytest.raises(ValueError, match="no groups"):
        mean_scores([])
