"""A task made of a user's own records: MATH, MMLU or an in-house set without writing a Task subclass.

Each split is a list of dicts, a ``datasets.Dataset``, or the path of a JSONL file; a record holds the
question (``question_field``, default "question"), the gold answer (``answer_field``, default "answer"),
optionally an id (``id_field``) and, for multiple choice, its options (``options_field``).

``answer_format`` decides the instruction, the parser and how gold answers are normalized, so that a
parsed answer and its gold compare equal. Left unset, it is inferred from the records of every split
(:func:`infer_answer_format`): ``choice`` when records carry options, ``number`` when every gold answer is a
number, ``text`` otherwise.

- ``number``: gold through :func:`~udpo.env.tasks.parsing.normalize_number` ("1,000" -> "1000"); replies
  parsed by :func:`~udpo.env.tasks.parsing.parse_number_answer` (last boxed number, else last number);
- ``choice``: the question shows its options lettered (A), (B), ...; gold given as the letter, the
  option's 0-based index or the option's text; replies parsed by :func:`~udpo.env.tasks.parsing.parse_choice`;
- ``text``: gold through :func:`~udpo.env.tasks.parsing.normalize_text` (case, spaces, surrounding
  punctuation and markdown, a leading article do not count); replies parsed by
  :func:`~udpo.env.tasks.parsing.parse_text_answer` (last ``\\boxed{}``, else "the answer is ...", else a
  bold phrase or a short last line).

``parse`` (a callable ``(text, question) -> answer or None``) replaces the format's parser and
``instruction`` its instruction; gold answers are still normalized by the format.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .base import Answer, Question, Task
from .data import DataError, iter_jsonl
from .formats import ChoiceTask, NumericTask, choice_text
from .parsing import LETTERS, normalize_number, normalize_text, parse_text_answer

ANSWER_FORMATS = ("number", "choice", "text")
Records = Iterable[Mapping[str, Any]] | str | os.PathLike
Parser = Callable[[str, Question], Answer]
#: where a record came from ("file.jsonl:3", "task t, split train, record 0") and the record
Row = tuple[str, Any]

#: how to choose the format, for the errors of a gold answer that does not fit the one in use
_FORMAT_HINT = (
    "pass answer_format= ('number', 'choice' or 'text') to DatasetTask (task_options: {answer_format: ...} "
    "in a recipe), or leave it unset to infer it from the gold answers"
)


def infer_answer_format(
    records: Iterable[Any], answer_field: str = "answer", options_field: str = "options"
) -> str:
    """The answer format of ``records``: ``choice`` when any record carries options, ``number`` when every
    gold answer is a number (``normalize_number`` reads it), ``text`` otherwise. Records that are not
    dicts or have no answer are left to the record checks, which name them."""
    records = [r for r in records if isinstance(r, Mapping)]
    if any(r.get(options_field) is not None for r in records):
        return "choice"
    answers = [r[answer_field] for r in records if r.get(answer_field) is not None]
    return "number" if all(_number(a) is not None for a in answers) else "text"


def _number(raw: Any) -> str | None:
    """The canonical number of a gold answer, or None when it is not one."""
    if isinstance(raw, str | int | float) and not isinstance(raw, bool):
        return normalize_number(str(raw))
    return None


class DatasetTask(Task):
    """Questions from records, one collection per split.

    name: the task's name in configs and run folders. splits: ``{split: records}``; ``train`` and
    ``test`` are shorthands for ``splits={"train": ..., "test": ...}``. answer_format: number, choice or
    text (module docstring); None infers it from the records. instruction: the sentence that tells agents how to answer (default: the
    format's). parse: ``(text, question) -> answer`` replacing the format's parser. profile: the agents'
    default system prompt. question_field, answer_field, options_field, id_field: the record keys.

    A DatasetTask without records is a template (the answer format, parser and fields) that
    :meth:`with_splits` fills, as ``udpo.UDPOTrainer`` does with its ``train_dataset`` and ``eval_dataset``;
    its ``answer_format`` is None until then unless given.
    """

    def __init__(
        self,
        name: str = "dataset",
        *,
        train: Records | None = None,
        test: Records | None = None,
        splits: Mapping[str, Records] | None = None,
        answer_format: str | None = None,
        instruction: str | None = None,
        parse: Parser | None = None,
        profile: str | None = None,
        question_field: str = "question",
        answer_field: str = "answer",
        options_field: str = "options",
        id_field: str = "id",
    ):
        if answer_format is not None and answer_format not in ANSWER_FORMATS:
            raise ValueError(
                f"answer_format must be one of {', '.join(ANSWER_FORMATS)} or None (inferred from the "
                f"records), got {answer_format!r}"
            )
        if parse is not None and not callable(parse):
            raise TypeError(f"parse must be a callable (text, question) -> answer, got {parse!r:.80}")
        given = dict(splits or {})
        for split, records in (("train", train), ("test", test)):
            if records is not None:
                if split in given:
                    raise ValueError(f"split {split!r} given twice (as {split}= and in splits=)")
                given[split] = records
        self.name, self._instruction, self._parse, self._profile = name, instruction, parse, profile
        #: the format asked for (None: inferred from the records); ``answer_format`` is the one in use
        self._format = self.answer_format = answer_format
        self.fields = {
            "question": question_field,
            "answer": answer_field,
            "options": options_field,
            "id": id_field,
        }
        self.splits: tuple[str, ...] = ()
        self._questions: dict[str, list[Question]] = {}
        if given:
            self._fill(given)

    def with_splits(self, **splits: Records | None) -> DatasetTask:
        """A copy of this task holding ``splits`` (``None`` values are skipped) instead of its records;
        an answer format that was inferred is inferred again from them."""
        given = {split: records for split, records in splits.items() if records is not None}
        if not given:
            raise ValueError(f"task {self.name}: no records given")
        task = copy.copy(self)
        task._fill(given)
        return task

    def _fill(self, given: Mapping[str, Records]) -> None:
        """Hold ``given`` as the splits, the answer format inferred from all of them when not asked for."""
        rows = {split: self._rows(split, records) for split, records in given.items()}
        if self._format is None:
            records = (record for split_rows in rows.values() for _, record in split_rows)
            self.answer_format = infer_answer_format(records, self.fields["answer"], self.fields["options"])
        self.splits = tuple(given)
        self._questions = {split: self._read(split, split_rows) for split, split_rows in rows.items()}

    @property
    def default_profile(self) -> str:  # type: ignore[override]
        """The ``profile`` given, else the format's (multiple choice has its own)."""
        if self._profile is not None:
            return self._profile
        return ChoiceTask.default_profile if self.answer_format == "choice" else Task.default_profile

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
        if self._answer_format() == "number":
            return NumericTask.format_instruction(self, question)
        if self.answer_format == "choice":
            return ChoiceTask.format_instruction(self, question)  # type: ignore[arg-type]
        return "Reason briefly, then give your final answer, a few words, alone inside \\boxed{}."

    def parse(self, text: str, question: Question) -> Answer:
        if self._parse is not None:
            answer = self._parse(text, question)
            if answer is not None and not isinstance(answer, str):
                raise TypeError(
                    f"task {self.name}: parse returned {type(answer).__name__}, not a string or None"
                )
            return answer
        if self._answer_format() == "number":
            return NumericTask.parse(self, text, question)
        if self.answer_format == "choice":
            return ChoiceTask.parse(self, text, question)  # type: ignore[arg-type]
        return parse_text_answer(text)

    letters = staticmethod(ChoiceTask.letters)

    def _answer_format(self) -> str:
        """The answer format in use; a ValueError for a template that neither was given one nor holds records."""
        if self.answer_format is None:
            raise ValueError(
                f"task {self.name} has no answer format yet: give answer_format= or records to infer it from"
            )
        return self.answer_format

    # --- records -> questions --------------------------------------------------------------------
    def _rows(self, split: str, records: Records) -> list[Row]:
        """Each record of ``split`` with where it came from (a JSONL path is read here)."""
        if isinstance(records, str | os.PathLike):
            return [(f"{records}:{line}", r) for line, r in iter_jsonl(records)]
        if isinstance(records, Mapping):
            raise DataError(f"task {self.name}, split {split}: give a list of records, not one dict")
        return [(f"task {self.name}, split {split}, record {i}", r) for i, r in enumerate(records)]

    def _read(self, split: str, rows: list[Row]) -> list[Question]:
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
                raise DataError(
                    f"{where}: {f['options']!r} must be a list of at least two option strings, as "
                    f"answer_format 'choice' needs; {_FORMAT_HINT}"
                )
            options = tuple(options)
            text = choice_text(text, options, where)
        gold = self._gold(record[f["answer"]], options, where)
        return Question(id=qid, text=text, gold=gold, options=options, meta={"split": split})

    def _gold(self, raw: Any, options: tuple[str, ...] | None, where: str) -> str:
        if self.answer_format == "number":
            gold = _number(raw)
            if gold is None:
                raise DataError(
                    f"{where}: answer {raw!r:.60} is not a number, as answer_format 'number' needs; {_FORMAT_HINT}"
                )
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
        if not any(c.isalnum() for c in gold):
            raise DataError(f"{where}: answer {raw!r:.60} has no letter or digit: no reply could state it")
        return gold
