"""Per-question metrics of a training run's held-out evaluations, what learning studies and
``udpo compare`` measure: correctness, U_intra, U_inter, U_sys, the share of unparsed answers and the
consensus-on-wrong guard (a majority, or every agent, ending on a wrong answer)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from udpo.env.run_folder import RunFolder
from udpo.env.trajectory import Trajectory, read_trajectories
from udpo.rewards import uncertainty, wrong_consensus

#: metric name -> its value for one evaluated question (:func:`per_question`: udpo compare, learning studies)
PER_QUESTION_METRICS: dict[str, Callable[[Trajectory], float]] = {
    "accuracy": lambda t: float(t.correct),
    "u_intra": lambda t: uncertainty(t.answers, key=t.question_id).u_intra,
    "u_inter": lambda t: uncertainty(t.answers, key=t.question_id).u_inter,
    "u_sys": lambda t: uncertainty(t.answers, key=t.question_id).u_sys,
    "unparsed_rate": lambda t: float(np.mean([a is None for row in t.answers for a in row])),
    "wrong_majority": lambda t: wrong_consensus(t.answers, t.correct).majority,
    "wrong_unanimous": lambda t: wrong_consensus(t.answers, t.correct).unanimous,
}


def question_metrics(debates: Sequence[Trajectory]) -> dict[str, dict[str, float]]:
    """question id -> metric -> value, for the debates of one evaluation."""
    return {t.question_id: {m: f(t) for m, f in PER_QUESTION_METRICS.items()} for t in debates}


def per_question(run: Path, iteration: int) -> dict[str, dict[str, float]]:
    """:func:`question_metrics` of the debates of ``run``'s evaluation at ``iteration``."""
    return question_metrics(read_trajectories(RunFolder(Path(run)).evaluation(iteration).trajectories))


def problems(debates: Sequence[Trajectory]) -> dict[str, str]:
    """question id -> the problem's text (questions that repeat a problem share it: the unit an analysis
    resamples)."""
    return {t.question_id: t.question for t in debates}


def eval_iterations(run: Path) -> list[int]:
    """The iterations with an evaluation folder, ascending."""
    return [k for k, _ in RunFolder(Path(run)).evaluated()]
