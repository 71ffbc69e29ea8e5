"""The two answer formats our tasks use: a number in ``\\boxed{}`` and one option letter ``(X)``."""

from __future__ import annotations

from collections.abc import Sequence

from .base import Answer, Question, Task
from .data import DataError
from .parsing import LETTERS, Reading, read_choice, read_number_answer


class NumericTask(Task):
    """Open questions whose answer is a number (gsm8k, arithmetic, user data of numbers); parse rule in
    ``read_number_answer``, which refuses a reply restating the question's own operation."""

    def format_instruction(self, question: Question) -> str:
        return "Reason step by step, then give the final answer as a number alone inside \\boxed{}, without units."

    def parse(self, text: str, question: Question) -> Answer:
        return self.read(text, question).answer

    def read(self, text: str, question: Question) -> Reading:
        return read_number_answer(text, question.text)


class ChoiceTask(Task):
    """Multiple-choice questions answered by one option letter; parse rule in ``read_choice``."""

    default_profile = (
        "You answer multiple-choice questions with care and discuss them with other agents. "
        "Prefer the option you can justify over the one that merely sounds familiar."
    )

    def format_instruction(self, question: Question) -> str:
        letters = ", ".join(self.letters(question))
        return (
            "Pick exactly one option and end your reply with a line of the form Answer: (letter), "
            f"using the letter of your choice ({letters})."
        )

    def parse(self, text: str, question: Question) -> Answer:
        return self.read(text, question).answer

    def read(self, text: str, question: Question) -> Reading:
        return read_choice(text, self.letters(question))

    @staticmethod
    def letters(question: Question) -> str:
        """The letters offered by ``question``: A, B, ... one per option."""
        return LETTERS[: len(question.options or ())]


def choice_text(question: str, options: Sequence[str], where: str) -> str:
    """A question followed by its options, one per line: ``(A) first``, ``(B) second``, ...

    Raises DataError naming ``where`` (the file and line, or the dataset row) past 26 options: the
    letters run out.
    """
    if len(options) > len(LETTERS):
        raise DataError(
            f"{where}: {len(options)} options, at most {len(LETTERS)} can be lettered A-Z: {question[:60]!r}"
        )
    lines = [f"({letter}) {option}" for letter, option in zip(LETTERS, options, strict=False)]
    return question.strip() + "\n\n" + "\n".join(lines)
