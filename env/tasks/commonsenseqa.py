"""CommonsenseQA (Talmor et al. 2019): five-option commonsense questions, letters A-E.

Source: ``commonsenseqa/dev_rand_split.jsonl`` of the shared/data layout (1221 lines
``{"id", "question", "question_concept", "choices": {"label", "text"}, "answerKey"}``), or the
``validation`` split of the Hub dataset ``tau/commonsense_qa`` (same fields). The official test
split has no answers, so only the dev set is used. Gold: ``answerKey``.
"""

from __future__ import annotations

import os

from .base import Question
from .data import (
    DataError,
    HubDataset,
    get_field,
    get_text,
    half_of,
    iter_jsonl,
    load_hub,
    resolve_source,
    strings,
    take,
)
from .formats import ChoiceTask, choice_text
from .parsing import LETTERS


class CommonsenseQA(ChoiceTask):
    """Splits: ``dev`` (all 1221 questions), and ``train`` / ``test``, a fixed 50/50 partition of
    dev by a hash of the question id (independent of the seed and of the source)."""

    name = "commonsenseqa"
    splits = ("dev", "train", "test")

    def load(
        self,
        split: str = "test",
        data_path: str | os.PathLike | None = None,
        limit: int | None = None,
        seed: int = 0,
    ) -> list[Question]:
        self.check_split(split)
        source = resolve_source(data_path, "commonsenseqa", "dev_rand_split.jsonl")
        if isinstance(source, HubDataset):
            rows = [(f"{source.name} row {i}", r) for i, r in enumerate(load_hub(source, "validation"))]
        else:
            rows = [(f"{source}:{line}", r) for line, r in iter_jsonl(source)]
        questions = [_question(where, r) for where, r in rows]
        seen: dict[str, str] = {}
        for (where, _), q in zip(rows, questions, strict=True):
            if q.id in seen:
                raise DataError(f"{where}: id {q.id!r} already used at {seen[q.id]}")
            seen[q.id] = where
        return take([q for q in questions if split == "dev" or half_of(q.id) == split], limit)


def _question(where: str, record: dict) -> Question:
    choices = get_field(record, "choices", where, dict)
    inside = f"{where}: in 'choices'"
    labels = [
        x.strip().upper() for x in strings(get_field(choices, "label", inside, list), f"{inside}, 'label'")
    ]
    texts = [x.strip() for x in strings(get_field(choices, "text", inside, list), f"{inside}, 'text'")]
    if not all(texts):
        raise DataError(f"{inside}: an empty choice text")
    if len(labels) != len(texts) or labels != list(LETTERS[: len(labels)]) or len(labels) < 2:
        raise DataError(f"{where}: choices should be labelled A, B, C, ... one per text, got {labels}")
    gold = get_field(record, "answerKey", where).strip().upper()
    if gold not in labels:
        raise DataError(f"{where}: answerKey {gold!r} is not one of the choice labels {labels}")
    return Question(
        id=str(get_field(record, "id", where)),
        text=choice_text(get_text(record, "question", where), texts, where),
        gold=gold,
        options=tuple(texts),
        meta={"concept": record.get("question_concept")},
    )
