"""GSM8K (Cobbe et al. 2021): grade-school math word problems with a numeric answer.

Source: ``gsm8k/train.jsonl`` and ``gsm8k/test.jsonl`` of the shared/data layout (lines
``{"question", "answer"}``), or the Hub dataset ``openai/gsm8k`` (config ``main``). The gold answer
is the number after ``####`` in ``answer``, normalized ("1,600" -> "1600").
"""

from __future__ import annotations

import os

from .base import Question
from .data import DataError, HubDataset, get_field, get_text, iter_jsonl, load_hub, resolve_source, take
from .formats import NumericTask
from .parsing import normalize_number

HUB_NAME = "openai/gsm8k"


class GSM8K(NumericTask):
    """Splits ``train`` (7473) and ``test`` (1319), the dataset's own. A ``data_path`` naming one
    file is read as the requested split."""

    name = "gsm8k"
    splits = ("train", "test")
    default_profile = (
        "You solve math word problems step by step and discuss your solutions with other solvers. "
        "Check each calculation before you commit to an answer."
    )

    def load(
        self,
        split: str = "test",
        data_path: str | os.PathLike | None = None,
        limit: int | None = None,
        seed: int = 0,
    ) -> list[Question]:
        self.check_split(split)
        source = resolve_source(data_path, "gsm8k", f"{split}.jsonl", {HUB_NAME: "main"})
        if isinstance(source, HubDataset):
            rows = [(f"{source.name} [{split}] row {i}", r) for i, r in enumerate(load_hub(source, split))]
        else:
            rows = [(f"{source}:{line}", r) for line, r in iter_jsonl(source)]
        questions = [self._question(split, i, where, r) for i, (where, r) in enumerate(rows)]
        return take(questions, limit)

    def _question(self, split: str, index: int, where: str, record: dict) -> Question:
        solution = get_field(record, "answer", where)
        _, marker, final = solution.rpartition("####")
        gold = normalize_number(final) if marker else None
        if gold is None:
            raise DataError(f"{where}: 'answer' should end with '#### <number>', got ...{solution[-40:]!r}")
        return Question(
            id=f"gsm8k-{split}-{index}",
            text=get_text(record, "question", where),
            gold=gold,
            meta={"solution": solution},
        )
