"""Callbacks: user code the training loop calls at fixed points.

Two kinds of hook objects are taken, side by side:

- :class:`UDPOCallback` subclasses: each hook receives the trainer (``config``, ``run_dir``, ``policy``,
  ``task``, ``main``, ...). Every process calls the hooks: guard side effects (writing files, printing)
  with ``trainer.main``. A hook stops the run at the end of the iteration (with a checkpoint) by setting
  ``trainer.should_training_stop = True``.
- ``transformers.TrainerCallback`` objects (wandb's, MLflow's, ``EarlyStoppingCallback``, your own), called
  as transformers' Trainer calls them (:mod:`udpo.training.transformers_callbacks`).

A plain function ``(trainer, iteration) -> dict`` is an *eval callback* instead: it runs at every held-out
evaluation and its dict is logged beside it.

Before issue 51 :class:`UDPOCallback` was called ``TrainerCallback``, the name of transformers' class with
other hooks; it was renamed, not aliased (no release had the old name).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from udpo.training.trainer import Trainer

#: eval callback: (trainer, iteration) -> metrics to log beside the Standard-MAD evaluation
EvalCallback = Callable[["Trainer", int], dict[str, Any]]


class UDPOCallback:
    """Hooks of the training loop; the defaults do nothing."""

    def on_train_begin(self, trainer: Trainer) -> None:
        """At the start of ``train``: before calibration and the first evaluation, or after resuming."""

    def on_iteration_end(self, trainer: Trainer, iteration: int, metrics: dict[str, Any]) -> None:
        """After iteration ``iteration``'s update and sync, with the metrics it logged."""

    def on_evaluate(self, trainer: Trainer, iteration: int, summary: dict[str, Any]) -> None:
        """After a held-out evaluation, with its summary (accuracy, U metrics, wrong_majority, ...)."""

    def on_save(self, trainer: Trainer, iteration: int, checkpoint: Path) -> None:
        """After checkpoint ``iteration`` was written to ``checkpoint``."""

    def on_train_end(self, trainer: Trainer, result: dict[str, Any]) -> None:
        """After the last iteration, with what ``train`` returns."""


def split_callbacks(callbacks: Sequence[Any]) -> tuple[list[UDPOCallback], list[EvalCallback]]:
    """(hook objects, eval callbacks) of a mixed list; ``transformers.TrainerCallback`` objects become one
    hook object that calls them (in their order). Anything else is a TypeError naming it."""
    hooks: list[UDPOCallback] = []
    evals: list[EvalCallback] = []
    transformers_callbacks: list[Any] = []
    # a transformers callback was built from an imported transformers: no need to import it here
    hf = sys.modules.get("transformers.trainer_callback")
    hf_class = hf.TrainerCallback if hf is not None else None
    for c in callbacks:
        if isinstance(c, UDPOCallback):
            hooks.append(c)
        elif hf_class is not None and isinstance(c, hf_class):
            transformers_callbacks.append(c)
        elif isinstance(c, type) and (issubclass(c, UDPOCallback) or (hf_class and issubclass(c, hf_class))):
            raise TypeError(f"callbacks: pass an instance of {c.__name__}, not the class")
        elif callable(c):
            evals.append(cast(EvalCallback, c))  # a function, or an object with __call__
        else:
            raise TypeError(
                f"callbacks: {c!r:.80} is neither a UDPOCallback, a transformers.TrainerCallback nor a "
                f"function (trainer, iteration)"
            )
    if transformers_callbacks:
        from udpo.training.transformers_callbacks import TransformersCallbacks

        hooks.append(TransformersCallbacks(transformers_callbacks))
    return hooks, evals
