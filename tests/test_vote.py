"""Majority vote (docs/metrics.md, "The answer matrix"): plurality of non-None answers, ties to the earliest
first occurrence."""

from __future__ import annotations

import pytest

from udpo.rewards import majority_vote


@pytest.mark.parametrize(
    ("answers", "expected"),
    [
        (["a", "b", "a"], "a"),
        (["b", "a", "a"], "a"),
        (["a"], "a"),
        # ties: the tied answer seen first (scanning agents 0..N-1) wins
        (["b", "a"], "b"),
        (["a", "b", "b", "a"], "a"),
        (["c", "b", "a", "b", "a"], "b"),
        # None abstains, even when it is the most frequent value
        ([None, None, "a"], "a"),
        ([None, "b", None, "a", "a"], "a"),
        ([None, "b", "a"], "b"),
        # nobody answered
        ([None, None], None),
        ([], None),
        # any hashable answers, compared with ==
        ([3, 2.0, 2, 3.0, 2], 2.0),
    ],
)
def test_majority_vote(answers, expected):
    assert majority_vote(answers) == expected


def test_majority_vote_accepts_tuples_and_generators():
    assert majority_vote(("x", "y", "y")) == "y"
    assert majority_vote(a for a in ["x", "y", "x"]) == "x"
