"""What a task is: questions with gold answers, a prompt, and a parser from model text to answer.

Answers are normalized strings (numbers in canonical decimal form, option letters upper-case) or
``None`` when nothing could be parsed, so equality, hashing and JSON all agree. ``Task.read`` gives the
answer with the form it was read in (a :class:`~udpo.env.tasks.parsing.Reading`); ``Task.parse`` is its answer.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any

from .parsing import FORM_CUSTOM, Reading

Answer = str | None


@dataclass(frozen=True)
class Question:
    """One item of a task.

    id: stable identifier (unique within the task and split). text: the question as shown to agents
    (for multiple choice, including the lettered options). gold: normalized gold answer.
    options: multiple-choice option texts in letter order (None for open answers).
    """

    id: str
    text: str
    gold: Answer
    options: tuple[str, ...] | None = None
    meta: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)


class Task(abc.ABC):
    """A benchmark: loading, prompting and parsing. Subclasses set ``name``."""

    name: str = "task"
    #: the split names ``load`` accepts
    splits: tuple[str, ...] = ("test",)
    #: what one agent's profile (system prompt) says by default for this task
    default_profile: str = "You are a careful problem solver taking part in a discussion with other solvers."

    @abc.abstractmethod
    def load(
        self, split: str = "test", data_path: str | None = None, limit: int | None = None, seed: int = 0
    ) -> list[Question]:
        """Questions of ``split`` from ``data_path`` (a file, a folder in the shared/data layout,
        or a Hub name), or from the default location when None. ``limit`` keeps the first K."""

    @abc.abstractmethod
    def format_instruction(self, question: Question) -> str:
        """The sentence telling the agent how to state its final answer (e.g. in \\boxed{})."""

    @abc.abstractmethod
    def parse(self, text: str, question: Question) -> Answer:
        """The normalized answer stated in ``text``, or None (the built-in tasks: ``read(...).answer``)."""

    def read(self, text: str, question: Question) -> Reading:
        """The answer stated in ``text`` and the form it was read in (``parsing.FORMS``). The built-in
        tasks read here and ``parse`` returns the answer; a task that only defines ``parse`` reads in form
        ``custom`` (``none`` without an answer)."""
        return Reading.of(self.parse(text, question), FORM_CUSTOM)

    def check_split(self, split: str) -> None:
        """Raise a ValueError naming the choices when ``split`` is not one of ``splits``."""
        if split not in self.splits:
            raise ValueError(
                f"unknown split {split!r} for task {self.name}; choose one of {', '.join(self.splits)}"
            )

    def prompt(self, question: Question) -> str:
        """The user message of round 0."""
        return f"{question.text}\n\n{self.format_instruction(question)}"

    def debate_request(self, question: Question) -> str:
        """What a round t >= 1 message asks for, after the responses it shows (Standard MAD and the
        protocols built on it): weigh them, then answer in the task's format."""
        return (
            "Weigh their reasoning against your own: keep your answer if you still believe it, "
            f"change it if they showed you a mistake. {self.format_instruction(question)}"
        )

    def is_correct(self, prediction: Answer, question: Question) -> bool:
        """A None prediction is always wrong."""
        return prediction is not None and prediction == question.gold
