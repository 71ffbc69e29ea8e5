"""The held-out evaluation of a training run: Standard-MAD debates of the held-out questions with the
current adapters, when they are due, and what they leave in the run folder.

The evaluation runs before training (``eval_at_start``), every ``eval_steps`` iterations and at the run's
last iteration (:meth:`HeldOutEvaluation.due`). Its debates, and the eval callbacks after them, draw from
the evaluation's own generators (``Rollouts.eval_rng``): every evaluation draws the same numbers, and
training's draws stay as they were. The main process writes the evaluation's debates and their summary to
its folder in the run folder (:meth:`udpo.env.run_folder.RunFolder.evaluation`), replacing what a run that
died after that point left there.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

from udpo.env.jsonl import write_json
from udpo.env.run_folder import RunFolder
from udpo.env.summary import summarize
from udpo.env.tasks.base import Question
from udpo.env.trajectory import Trajectory, TrajectoryWriter
from udpo.training.callbacks import EvalCallback

#: debate(questions, meta) -> their debates, every process getting all of them (``Trainer.debate``)
Debate = Callable[[Sequence[Question], dict[str, Any]], list[Trajectory]]


class HeldOutEvaluation:
    """The evaluation of a run on ``questions`` (none: no evaluation), ``every`` that many iterations of
    ``total`` (0: at the end only); ``callbacks`` run after each (their results join the summary under their
    names); ``folder`` receives the files, written by the ``main`` process."""

    def __init__(
        self,
        questions: Sequence[Question],
        callbacks: Sequence[EvalCallback],
        every: int,
        total: int,
        folder: RunFolder,
        main: bool,
    ):
        self.questions, self.callbacks = list(questions), list(callbacks)
        self.every, self.total = every, total
        self.folder, self.main = folder, main

    def due(self, k: int) -> bool:
        """Whether iteration ``k`` ends with an evaluation: every ``every`` iterations and at the end."""
        every = self.every
        return bool(self.questions) and k > 0 and (bool(every and k % every == 0) or k >= self.total)

    def run(
        self,
        iteration: int,
        debate: Debate,
        generators: AbstractContextManager[Any],
        call: Callable[[EvalCallback], dict[str, Any]],
    ) -> dict[str, Any]:
        """Evaluate the team ``debate`` debates with at ``iteration`` (see the module docstring), inside
        ``generators`` (the evaluation's own: ``Rollouts.eval_rng()``); ``call`` runs one eval callback
        (the trainer calls it with itself and the iteration). Returns the summary, with each callback's
        result under its function's name."""
        with generators:
            trajectories = debate(self.questions, {"phase": "eval", "iteration": iteration})
            summary = summarize(trajectories)
            if self.main:
                out = self.folder.evaluation(iteration)
                shutil.rmtree(out.root, ignore_errors=True)  # left by a run that died after this point
                with TrajectoryWriter(out.trajectories) as writer:
                    writer.write(trajectories)
                write_json(out.summary, {**summary, "iteration": iteration})
            for callback in self.callbacks:  # on the evaluation's generators too
                summary[callback.__name__] = call(callback)
        return summary
