"""Where a run stands: what a checkpoint saves of the training loop (its ``state.json`` and
``calibration.json``) and gives back on resume (:mod:`udpo.training.checkpointing`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class TrainingState:
    """iteration: the last finished iteration (0 before the first). history: the "before" and "after"
    held-out evaluation summaries. last_evaluation: the iteration of the newest logged evaluation (None:
    none yet; a run stopped between a checkpoint and its evaluation evaluates again on resume).
    calibration: the calibration record the algorithm is built from (None before calibration). replay: a
    checkpoint's replay-buffer state, for the buffer the calibration builds (None otherwise).
    questions_drawn: the training question stream's positions used up to ``iteration``
    (:class:`~udpo.training.data.QuestionSchedule`; more than iteration x questions_per_iteration once dynamic
    sampling drew extra questions).

    :meth:`to_dict` is the state.json part (calibration and replay have files of their own)."""

    iteration: int = 0
    history: dict[str, dict[str, Any]] = field(default_factory=dict)
    last_evaluation: int | None = None
    calibration: dict[str, Any] | None = None
    replay: dict[str, Any] | None = None
    questions_drawn: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "iteration": self.iteration,
            "history": self.history,
            "last_evaluation": self.last_evaluation,
            "questions_drawn": self.questions_drawn,
        }

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> TrainingState:
        """From a checkpoint's state (what :meth:`to_dict` wrote, beside the checkpoint's own keys)."""
        return cls(
            iteration=state["iteration"],
            history=state["history"],
            last_evaluation=state["last_evaluation"],
            questions_drawn=state["questions_drawn"],
        )
