"""Majority vote over one round of answers (docs/metrics.md, "The answer matrix")."""

from __future__ import annotations

from collections.abc import Hashable, Sequence


def majority_vote(answers: Sequence[Hashable | None]) -> Hashable | None:
    """The most frequent non-None answer.

    Ties go to the tied answer whose first occurrence (scanning agents 0..N-1) is earliest;
    if every answer is None (or there are none) the vote is None.
    """
    counts: dict[Hashable, int] = {}
    for a in answers:
        if a is not None:
            counts[a] = counts.get(a, 0) + 1  # dicts keep first-occurrence order
    if not counts:
        return None
    best = max(counts.values())
    return next(a for a, c in counts.items() if c == best)
