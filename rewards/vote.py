"""Majority vote over one round of answers (docs/metrics.md, "The answer matrix")."""

from __future__ import annotations

from collections.abc import Hashable, Iterable

from .batch import one_debate


def majority_vote(answers: Iterable[Hashable | None]) -> Hashable | None:
    """The most frequent non-None answer.

    Ties go to the tied answer whose first occurrence (scanning agents 0..N-1) is earliest;
    if every answer is None (or there are none) the vote is None. The vote of
    :mod:`udpo.rewards.batch` (its one implementation) on a debate of one round.
    """
    final = tuple(answers)
    if not final:
        return None
    return one_debate([(a,) for a in final]).predictions[0]
