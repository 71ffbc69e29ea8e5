"""Callbacks: user code the training loop calls at fixed points, in the spirit of transformers' and TRL's.

Subclass :class:`TrainerCallback` and override any hook; each receives the trainer (``config``,
``run_dir``, ``policy``, ``task``, ``main``, ...). Every process calls the hooks: guard side effects
(writing files, printing) with ``trainer.main``. A plain function ``(trainer, iteration) -> dict`` is an
*eval callback* instead: it runs at every held-out evaluation and its dict is logged beside it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from udpo.training.trainer import Trainer

#: eval callback: (trainer, iteration) -> metrics to log beside the Standard-MAD evaluation
EvalCallback = Callable[["Trainer", int], dict[str, Any]]


class TrainerCallback:
    """Hooks of the training loop; the defaults do nothing."""

    def on_train_begin(self, trainer: Trainer) -> None:
        """Before the first iteration (after calibration and the first evaluation, or after resuming)."""

    def on_iteration_end(self, trainer: Trainer, iteration: int, metrics: dict[str, Any]) -> None:
        """After iteration ``iteration``'s update and sync, with the metrics it logged."""

    def on_evaluate(self, trainer: Trainer, iteration: int, summary: dict[str, Any]) -> None:
        """After a held-out evaluation, with its summary (accuracy, U metrics, wrong_majority, ...)."""

    def on_save(self, trainer: Trainer, iteration: int, checkpoint: Path) -> None:
        """After checkpoint ``iteration`` was written to ``checkpoint``."""

    def on_train_end(self, trainer: Trainer, result: dict[str, Any]) -> None:
        """After the last iteration, with what ``train`` returns."""


def split_callbacks(
    callbacks: Sequence[TrainerCallback | EvalCallback],
) -> tuple[list[TrainerCallback], list[EvalCallback]]:
    """(hook objects, eval callbacks) of a mixed list; anything else is a TypeError naming it."""
    hooks: list[TrainerCallback] = []
    evals: list[EvalCallback] = []
    for c in callbacks:
        if isinstance(c, TrainerCallback):
            hooks.append(c)
        elif isinstance(c, type) and issubclass(c, TrainerCallback):
            raise TypeError(f"callbacks: pass an instance of {c.__name__}, not the class")
        elif callable(c):
            evals.append(cast(EvalCallback, c))  # a function, or an object with __call__
        else:
            raise TypeError(
                f"callbacks: {c!r:.80} is neither a TrainerCallback nor a function (trainer, iteration)"
            )
    return hooks, evals
