"""Answers cut by max_tokens (udpo.study.cut): counts, accuracies and the split of an accuracy change into
the shift from cut to finished answers and the gain within each kind, against hand-computed cases; and the
study tables' arm-against-arm comparison."""

from __future__ import annotations

import pytest

from udpo.env.trajectory import Trajectory, Turn
from udpo.study.cut import cut_summary, length_decomposition


def debate(gold: str, answers: list[tuple[str | None, str]]) -> Trajectory:
    """One agent's turns, round by round: (answer, finish reason)."""
    turns = [[Turn(0, r, [], f"it is {a}", a, finish_reason=f) for r, (a, f) in enumerate(answers)]]
    last = answers[-1][0]
    return Trajectory("q", "question", gold, [[a for a, _ in answers]], last, last == gold, turns=turns)


def test_counts_every_answer_and_each_kinds_accuracy():
    debates = [
        debate("4", [("4", "stop"), ("5", "length")]),
        debate("7", [(None, "length"), ("7", "stop")]),
    ]
    s = cut_summary(debates)
    assert (s.answers, s.cut, s.right_finished, s.right_cut) == (4, 2, 2, 0)
    assert s.cut_share == 0.5 and s.accuracy_finished == 1.0 and s.accuracy_cut == 0.0 and s.accuracy == 0.5
    assert s.to_dict()["words_per_answer"] == 3.0
    assert cut_summary(debates, rounds=[1]).cut == 1 and cut_summary(debates, rounds=[0]).answers == 2
    empty = cut_summary([])
    assert empty.accuracy is None and empty.cut_share == 0.0


def test_the_change_splits_into_composition_and_within():
    def summary(finished: int, right_finished: int, cut: int, right_cut: int):
        answers = [("1", "stop")] * right_finished + [("0", "stop")] * (finished - right_finished)
        answers += [("1", "length")] * right_cut + [("0", "length")] * (cut - right_cut)
        return cut_summary([debate("1", [a]) for a in answers])

    # before: 10 finished answers (7 right) and 40 cut (8 right); after: 40 finished (32), 10 cut (3)
    before, after = summary(10, 7, 40, 8), summary(40, 32, 10, 3)
    # by hand: f0 = 0.2, a_fin0 = 0.7, a_cut0 = 0.2; f1 = 0.8, a_fin1 = 0.8, a_cut1 = 0.3
    # change = (32 + 3) / 50 - (7 + 8) / 50 = 0.4; composition = 0.6 x 0.5 = 0.3;
    # within = 0.8 x 0.1 + 0.2 x 0.1 = 0.1
    d = length_decomposition(before, after)
    assert d == pytest.approx({"change": 0.4, "composition": 0.3, "within": 0.1})
    assert length_decomposition(summary(10, 7, 0, 0), after) is None  # no cut answer before
