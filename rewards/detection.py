"""Binary error detection scores (ColMAD, docs/error_detection.md, "Metrics"): precision, recall, F1 and F2,
"error" positive.

With ``tp, fp, fn, tn`` the confusion counts for the positive class:

- ``precision = tp / (tp + fp)``, ``recall = tp / (tp + fn)``;
- ``F_beta = (1 + beta^2) * precision * recall / (beta^2 * precision + recall)``; F1 is beta = 1 and F2
  (beta = 2, which weighs recall more: an error left undetected costs more than a false alarm) is
  what the ColMAD paper reports beside F1.
- A ratio whose denominator is 0 is 0 (scikit-learn's ``zero_division=0``): a detector that never says
  "error" has precision 0, and F_beta is 0 when precision and recall are both 0.

A ``None`` prediction (no verdict could be parsed) is always wrong (docs/metrics.md, "The answer matrix"): on
an item labelled positive it is a false negative, on a negative item a false positive. ``n_unparsed`` counts
them. Labels and predictions are compared with ``==``; the positive label is ``"error"`` by default.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import asdict, dataclass

POSITIVE = "error"


@dataclass(frozen=True)
class Confusion:
    """Counts of one detector on a set of items (positive class = errors)."""

    tp: int
    fp: int
    fn: int
    tn: int
    n_unparsed: int = 0

    @property
    def n(self) -> int:
        return self.tp + self.fp + self.fn + self.tn


@dataclass(frozen=True)
class DetectionScores:
    """Precision, recall, F1, F2 and accuracy of a detector, with the counts behind them."""

    n: int
    tp: int
    fp: int
    fn: int
    tn: int
    n_unparsed: int
    precision: float
    recall: float
    f1: float
    f2: float
    accuracy: float

    def to_dict(self) -> dict:
        return asdict(self)


def confusion(
    predictions: Sequence[Hashable | None], labels: Sequence[Hashable], positive: Hashable = POSITIVE
) -> Confusion:
    """The confusion counts of ``predictions`` against ``labels`` (same length; None is always wrong)."""
    if len(predictions) != len(labels):
        raise ValueError(f"got {len(predictions)} predictions for {len(labels)} labels")
    tp = fp = fn = tn = unparsed = 0
    for pred, gold in zip(predictions, labels, strict=True):
        if gold is None:
            raise ValueError("a label is None; every item needs its gold label")
        unparsed += pred is None
        if gold == positive:
            tp += pred == positive
            fn += pred != positive
        else:
            tn += pred is not None and pred != positive
            fp += pred is None or pred == positive
    return Confusion(tp=tp, fp=fp, fn=fn, tn=tn, n_unparsed=unparsed)


def _ratio(num: float, den: float) -> float:
    return num / den if den else 0.0


def f_beta(precision: float, recall: float, beta: float) -> float:
    """``(1 + beta^2) P R / (beta^2 P + R)``; 0 when P = R = 0."""
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    b2 = beta * beta
    return _ratio((1 + b2) * precision * recall, b2 * precision + recall)


def scores_from_confusion(c: Confusion) -> DetectionScores:
    """Precision, recall, F1, F2 and accuracy from confusion counts (empty: all 0)."""
    precision, recall = _ratio(c.tp, c.tp + c.fp), _ratio(c.tp, c.tp + c.fn)
    return DetectionScores(
        n=c.n,
        tp=c.tp,
        fp=c.fp,
        fn=c.fn,
        tn=c.tn,
        n_unparsed=c.n_unparsed,
        precision=precision,
        recall=recall,
        f1=f_beta(precision, recall, 1.0),
        f2=f_beta(precision, recall, 2.0),
        accuracy=_ratio(c.tp + c.tn, c.n),
    )


def detection_scores(
    predictions: Sequence[Hashable | None], labels: Sequence[Hashable], positive: Hashable = POSITIVE
) -> DetectionScores:
    """Every score of a detector's ``predictions`` against ``labels``."""
    return scores_from_confusion(confusion(predictions, labels, positive))


def mean_scores(per_group: Sequence[DetectionScores]) -> dict[str, float]:
    """The unweighted mean over groups (e.g. tasks) of precision, recall, F1, F2 and accuracy, as the
    ColMAD paper's "Avg." columns average per-task scores."""
    if not per_group:
        raise ValueError("no groups to average")
    keys = ("precision", "recall", "f1", "f2", "accuracy")
    return {k: sum(getattr(s, k) for s in per_group) / len(per_group) for k in keys}
