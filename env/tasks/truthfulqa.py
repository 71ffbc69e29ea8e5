"""TruthfulQA (Lin et al. 2022) as single-answer multiple choice (MC1).

Source: ``truthfulqa/TruthfulQA.csv`` of the shared/data layout (817 rows), or the Hub dataset
``truthfulqa/truthful_qa`` (config ``generation``, the same columns as the CSV; rows of the
``multiple_choice`` config, with ``mc1_targets``, are read too). Options are the best answer plus
the incorrect answers (the CSV separates them with ``; ``; blanks and repeats are dropped), so a
question has 2 to 13 options. They are shuffled with a generator seeded by (seed, question), so the
order is the same on every run with the same seed and the correct letter is spread over A..M.
"""

from __future__ import annotations

import os
import random

from .base import Question
from .data import (
    DataError,
    HubDataset,
    get_field,
    half_of,
    iter_csv,
    load_hub,
    resolve_source,
    strings,
    take,
)
from .formats import ChoiceTask, choice_text
from .parsing import LETTERS

HUB_NAME = "truthfulqa/truthful_qa"


class TruthfulQA(ChoiceTask):
    """Splits: ``all`` (every row), and ``train`` / ``test``, a fixed 50/50 partition by a hash of
    the question text (independent of the seed and of the source)."""

    name = "truthfulqa"
    splits = ("all", "train", "test")

    def load(
        self,
        split: str = "test",
        data_path: str | os.PathLike | None = None,
        limit: int | None = None,
        seed: int = 0,
    ) -> list[Question]:
        self.check_split(split)
        source = resolve_source(data_path, "truthfulqa", "TruthfulQA.csv", {HUB_NAME: "generation"})
        if isinstance(source, HubDataset):
            rows = [(f"{source.name} row {i}", r) for i, r in enumerate(load_hub(source, "validation"))]
            items = [(where, _from_hub(where, r)) for where, r in rows]
        else:
            columns = ("Question", "Best Answer", "Incorrect Answers")
            rows = [(f"{source}:{line}", r) for line, r in iter_csv(source, columns)]
            items = [(where, _from_csv(where, r)) for where, r in rows]
        questions = [self._question(i, where, *item, seed) for i, (where, item) in enumerate(items)]
        return take([q for q in questions if split == "all" or half_of(q.meta["question"]) == split], limit)

    def _question(
        self, index: int, where: str, question: str, best: str, wrong: list[str], seed: int
    ) -> Question:
        options = [best, *wrong]
        order = list(range(len(options)))
        random.Random(f"truthfulqa:{seed}:{question}").shuffle(order)
        shuffled = tuple(options[k] for k in order)
        return Question(
            id=f"truthfulqa-{index}",
            text=choice_text(question, shuffled, where),
            gold=LETTERS[order.index(0)],
            options=shuffled,
            meta={"question": question},
        )


def _from_csv(where: str, row: dict[str, str]) -> tuple[str, str, list[str]]:
    return _checked(where, row["Question"], row["Best Answer"], row["Incorrect Answers"].split("; "))


def _from_hub(where: str, row: dict) -> tuple[str, str, list[str]]:
    question = get_field(row, "question", where)
    if "mc1_targets" in row:  # the multiple_choice config: one label 1 among the choices
        targets = get_field(row, "mc1_targets", where, dict)
        pairs = list(zip(targets.get("choices", []), targets.get("labels", []), strict=False))
        best = [c for c, label in pairs if label == 1]
        if len(best) != 1:
            raise DataError(f"{where}: mc1_targets should mark exactly one choice, found {len(best)}")
        wrong = strings([c for c, label in pairs if label != 1], f"{where}: 'mc1_targets'")
        return _checked(where, question, *strings(best, f"{where}: 'mc1_targets'"), wrong)
    wrong = strings(get_field(row, "incorrect_answers", where, list), f"{where}: 'incorrect_answers'")
    return _checked(where, question, get_field(row, "best_answer", where), wrong)


def _checked(where: str, question: str, best: str, wrong: list[str]) -> tuple[str, str, list[str]]:
    """Strip spaces and stray trailing ``;``, drop blank and repeated incorrect answers (and any
    equal to the best one); at least one must remain."""
    question, best = question.strip(), best.strip()
    if not question or not best:
        raise DataError(f"{where}: empty question or best answer")
    kept: list[str] = []
    for answer in (a.strip().rstrip(";").strip() for a in wrong):
        if answer and answer != best and answer not in kept:
            kept.append(answer)
    if not kept:
        raise DataError(f"{where}: no incorrect answers, so no multiple-choice question")
    return question, best, kept
