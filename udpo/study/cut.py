"""Answers cut by the token cap, and how much of an accuracy change they carry.

A turn is *cut* when the backend stopped it at ``max_tokens`` (``finish_reason == "length"``), *finished*
otherwise. A small model asked to reason first is cut on most answers at a short cap, and a cut answer is
right far less often than a finished one, so training can raise accuracy mostly by teaching the agents to
stop in time. This module measures that, on every answer of every agent in every round:

- :func:`cut_summary`: the share of cut answers, the accuracy of finished and of cut answers (an answer is
  right when its parsed value equals the gold), and the mean words per answer;
- :func:`length_decomposition`: the change of answer accuracy between two evaluations split in two terms
  that add up to it, ``composition = (f1 - f0) (a_fin0 - a_cut0)`` (the shift from cut to finished answers,
  valued at the first evaluation's accuracies) and ``within = f1 (a_fin1 - a_fin0) + (1 - f1) (a_cut1 -
  a_cut0)`` (accuracy gained within each kind), with ``f`` the finished share.

The pre-run check of a study plan (``scripts/study_check.py``) and the study tables (``udpo study
--tables-only``) both use it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import asdict, dataclass

from udpo.env.trajectory import Trajectory

#: the finish reason of a turn stopped by the token cap
CUT = "length"


@dataclass(frozen=True)
class CutSummary:
    """Counts over answers (one per agent and round). ``accuracy_*`` is None for an empty kind."""

    answers: int
    cut: int
    right_finished: int
    right_cut: int
    words: int

    @property
    def finished(self) -> int:
        return self.answers - self.cut

    @property
    def cut_share(self) -> float:
        return self.cut / self.answers if self.answers else 0.0

    @property
    def accuracy(self) -> float | None:
        return (self.right_finished + self.right_cut) / self.answers if self.answers else None

    @property
    def accuracy_finished(self) -> float | None:
        return self.right_finished / self.finished if self.finished else None

    @property
    def accuracy_cut(self) -> float | None:
        return self.right_cut / self.cut if self.cut else None

    def to_dict(self) -> dict[str, float | int | None]:
        return {
            **asdict(self),
            "cut_share": self.cut_share,
            "answer_accuracy": self.accuracy,
            "accuracy_finished": self.accuracy_finished,
            "accuracy_cut": self.accuracy_cut,
            "words_per_answer": self.words / self.answers if self.answers else None,
        }


def cut_summary(debates: Iterable[Trajectory], rounds: Collection[int] | None = None) -> CutSummary:
    """Counts over every turn of ``debates`` (of the given ``rounds`` only, when given); a turn without a
    recorded finish reason counts as finished."""
    answers = cut = right_finished = right_cut = words = 0
    for debate in debates:
        for turns in debate.turns:
            for turn in turns:
                if rounds is not None and turn.round not in rounds:
                    continue
                right = turn.answer is not None and turn.answer == debate.gold
                answers += 1
                words += len(turn.text.split())
                if turn.finish_reason == CUT:
                    cut += 1
                    right_cut += right
                else:
                    right_finished += right
    return CutSummary(answers, cut, right_finished, right_cut, words)


def length_decomposition(before: CutSummary, after: CutSummary) -> dict[str, float] | None:
    """``change`` of answer accuracy from ``before`` to ``after`` = ``composition`` + ``within`` (module
    docstring); None when either evaluation lacks finished or cut answers (an accuracy is then undefined:
    the whole change is within the one kind, and :attr:`CutSummary.accuracy` says it)."""
    kinds = (before.accuracy_finished, before.accuracy_cut, after.accuracy_finished, after.accuracy_cut)
    if any(a is None for a in kinds):
        return None
    a_fin0, a_cut0, a_fin1, a_cut1 = (float(a) for a in kinds)  # type: ignore[arg-type]
    f0, f1 = 1 - before.cut_share, 1 - after.cut_share
    composition = (f1 - f0) * (a_fin0 - a_cut0)
    within = f1 * (a_fin1 - a_fin0) + (1 - f1) * (a_cut1 - a_cut0)
    return {
        "change": float(after.accuracy - before.accuracy),  # type: ignore[operator]
        "composition": composition,
        "within": within,
    }
