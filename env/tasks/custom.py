"""A task made of a user's own records: MATH, MMLU or an in-house set without writing a Task subclass.

Each split is a list of dicts, a ``datasets.Dataset``, or the path of a JSONL file; a record holds the
question (``question_field``, default "question"), the gold answer (``answer_field``, default "answer"),
optionally an id (``id_field``) and, for multiple choice, its options (``options_field``).

``answer_format`` decides the instruction, the parser and how gold answers are normalized, so that a
parsed answer and its gold compare equal:

- ``number``: gold through :func:`~udpo.env.tasks.parsing.normalize_number` ("1,000" -> "1000"); replies
  parsed by :func:`~udpo.env.tasks.parsing.parse_number_answer` (last boxed number, else last number);
- ``choice``: the question shows its options lettered (A), (B), ...; gold given as the letter, the
  option's 0-based index or the option's text; replies parsed by :func:`~udpo.env.tasks.parsing.parse_choice`;
- ``text``: gold and the last ``\\boxed{}`` of a reply compared after :func:`normalize_text` (case, spaces
  and a final period do not count).

``parse`` (a callable ``(text, question) -> answer or None``) replaces the format's parser and
``instruction`` its instruction; gold answers are still normalized by the format.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .base import Answer, Question, Task
from .data import DataError, iter_jsonl
from .formats import ChoiceTask, NumericTask, choice_text
from .parsing import LETTERS, boxed_contents, normalize_number

ANSWER_FORMATS = ("number", "choice", "text")
Records = Iterable[Mapping[str, Any]] | str | os.PathLike
Parser = Callable[[str, Question], Answer]

_SPACES = re.compile(r"\s+")


def normalize_text(text: str) -> str:
    """Case-folded, spaces collapsed, outer spaces and a final period dropped."""
    return _SPACES.sub(" ", text).strip().rstrip(".").strip().casefold()


class DatasetTask(Task):
    """Questions from records, one collection per split.

    name: the task's name in configs and run folders. splits: ``{split: records}``; ``train`` and
    ``test`` are shorthands for ``splits={"train": ..., "test": ...}``. answer_format: number, choice or
    text (module docstring). instruction: the sentence that tells agents how to answer (default: the
    format's). parse: ``(text, question) -> answer`` replacing the format's parser. profile: the agents'
    default system prompt. question_field, answer_field, options_field, id_field: the record keys.

    A DatasetTask without records is a template (the answer format, parser and fields) that
    :meth:`with_splits` fills, as ``udpo.UDPOTrainer`` does with its ``train_dataset`` and ``eval_dataset``.
    """

    def __init__(
        self,
        name: str = "dataset",
        *,
        train: Records | None = None,
        test: Records | None = None,
        splits: Mapping[str, Records] | None = None,
        answer_format: str = "number",
        instruction: str | None = None,
        parse: Parser | None = None,
        profile: str | None = None,
        question_field: str = "question",
        answer_field: str = "answer",
        options_field: str = "options",
        id_field: str = "id",
    ):
        if answer_format not in ANSWER_FORMATS:
            raise ValueError(
                f"answer_format must be one of {', '.join(ANSWER_FORMATS)}, got {answer_format!r}"
            )
        if parse is not None and not callable(parse):
            raise TypeError(f"parse must be a callable (text, question) -> answer, got {parse!r:.80}")
        given = dict(splits or {})
        for split, records in (("train", train), ("test", test)):
            if records is not None:
                if split in given:
                    raise ValueError(f"split {split!r} given twice (as {split}= and in splits=)")
                given[split] = records
        self.name, self.answer_format, self._instruction, self._parse = (
            name,
            answer_format,
            instruction,
            parse,
        )
        self.fields = {
            "question": question_field,
            "answer": answer_field,
            "options": options_field,
            "id": id_field,
        }
        if profile is not None:
            self.default_profile = profile
        elif answer_format == "choice":
            self.default_profile = ChoiceTask.default_profile
        self.splits = tuple(given)
        self._questions = {split: self._read(split, records) for split, records in given.items()}

    def with_splits(self, **splits: Records | None) -> DatasetTask:
        """A copy of this task holding ``splits`` (``None`` values are skipped) as its records."""
        if self._questions:
            raise ValueError(
                f"task {self.name} already holds records ({', '.join(self.splits)}); give the data once, "
                f"to the task or to the trainer"
            )
        given = {split: records for split, records in splits.items() if records is not None}
        if not given:
            raise ValueError(f"task {self.name}: no records given")
        task = copy.copy(self)
        task.splits = tuple(given)
        task._questions = {split: task._read(split, records) for split, records in given.items()}
        return task

    # --- Task ------------------------------------------------------------------------------------
    def load(
        self, split: str = "test", data_path: str | None = None, limit: int | None = None, seed: int = 0
    ) -> list[Question]:
        """The split's questions in record order (the first ``limit``); ``data_path`` and ``seed`` are not
        used: the records were given."""
        if not self._questions:
            raise ValueError(
                f"task {self.name} holds no records yet: give them with with_splits(train=..., test=...)"
            )
        self.check_split(split)
        questions = self._questions[split]
        return questions if limit is None else questions[:limit]

    def format_instruction(self, question: Question) -> str:
        if self._instruction is not None:
            return self._instruction
        if self.answer_format == "number":
            return NumericTask.format_instruction(self, question)
        if self.answer_format == "choice":
            return ChoiceTask.format_instruction(self, question)  # type: ignore[arg-type]
        return "Reason briefly, then give your final answer alone inside \\boxed{}."

    def parse(self, text: str, question: Question) -> Answer:
        if self._parse is not None:
            answer = self._parse(text, question)
            if answer is not None and not isinstance(answer, str):
                raise TypeError(
                    f"task {self.name}: parse returned {type(answer).__name__}, not a string or None"
                )
            return answer
        if self.answer_format == "number":
            return NumericTask.parse(self, text, question)
        if self.answer_format == "choice":
            return ChoiceTask.parse(self, text, question)  # type: ignore[arg-type]
        boxes = boxed_contents(text)
        return normalize_text(boxes[-1]) if boxes and normalize_text(boxes[-1]) else None

    letters = staticmethod(ChoiceTask.letters)

    # --- records -> questions --------------------------------------------------------------------
    def _read(self, split: str, records: Records) -> list[Question]:
        if isinstance(records, str | os.PathLike):
            rows = [(f"{records}:{line}", r) for line, r in iter_jsonl(records)]
        else:
            if isinstance(records, Mapping):
                raise DataError(f"task {self.name}, split {split}: give a list of records, not one dict")
            rows = [(f"task {self.name}, split {split}, record {i}", r) for i, r in enumerate(records)]
        questions, seen = [], {}
        for i, (where, record) in enumerate(rows):
            q = self._question(split, i, where, record)
            if q.id in seen:
                raise DataError(f"{where}: id {q.id!r} already used by {seen[q.id]}")
            seen[q.id] = where
            questions.append(q)
        if not questions:
            raise DataError(f"task {self.name}: split {split!r} has no records")
        return questions

    def _question(self, split: str, index: int, where: str, record: Any) -> Question:
        if not isinstance(record, Mapping):
            raise DataError(f"{where}: a record must be a dict, got {type(record).__name__}")
        f = self.fields
        for key in (f["question"], f["answer"]):
            if record.get(key) is None:
                raise DataError(
                    f"{where}: no {key!r} field (fields: {', '.join(map(str, record)) or 'none'})"
                )
        text = record[f["question"]]
        if not isinstance(text, str) or not text.strip():
            raise DataError(f"{where}: {f['question']!r} must be a non-empty string")
        qid = str(record[f["id"]]) if record.get(f["id"]) is not None else f"{self.name}-{split}-{index}"
        options = None
        if self.answer_format == "choice":
            options = record.get(f["options"])
            if (
                not isinstance(options, list | tuple)
                or len(options) < 2
                or not all(isinstance(o, str) for o in options)
            ):
                raise DataError(f"{where}: {f['options']!r} must be a list of at least two option strings")
            options = tuple(options)
            text = choice_text(text, options, where)
        gold = self._gold(record[f["answer"]], options, where)
        return Question(id=qid, text=text, gold=gold, options=options, meta={"split": split})

    def _gold(self, raw: Any, options: tuple[str, ...] | None, where: str) -> str:
        if self.answer_format == "number":
            gold = (
                normalize_number(str(raw))
                if isinstance(raw, str | int | float) and not isinstance(raw, bool)
                else None
            )
            if gold is None:
                raise DataError(f"{where}: answer {raw!r:.60} is not a number (answer_format 'number')")
            return gold
        if self.answer_format == "choice":
            assert options is not None
            letters = LETTERS[: len(options)]
            if isinstance(raw, int) and not isinstance(raw, bool) and 0 <= raw < len(options):
                return letters[raw]
            if (
                isinstance(raw, str)
                and raw.strip().strip("()").upper() in letters
                and len(raw.strip().strip("()")) == 1
            ):
                return raw.strip().strip("()").upper()
            if isinstance(raw, str) and raw in options:
                return letters[options.index(raw)]
            raise DataError(
                f"{where}: answer {raw!r:.60} is not a letter, index or text of its {len(options)} options"
            )
        gold = normalize_text(str(raw))
        if not gold:
            raise DataError(f"{where}: the answer is empty")
        return gold
