"""A task made of a user's own records: MATH, MMLU or an in-house set without writing a Task subclass.

Each split is a list of dicts, a ``datasets.Dataset``, or the path of a JSONL file; a record holds the
question (``question_field``, default "question"), the gold answer (``answer_field``, default "answer"),
optionally an id (``id_field``) and, for multiple choice, its options (``options_field``).

``answer_format`` decides the instruction, the parser and how gold answers are normalized, so that a
parsed answer and its gold compare equal. Left unset, it is inferred from the records of every split
(:func:`infer_answer_format`): ``choice`` when records carry options, ``number`` when every gold answer is a
number, ``text`` when not even half of them are; a set where most gold answers are numbers but some are not
("5 apples" among numbers) is refused, naming the record. The format inferred, why, and a sample gold are
printed once. A gold answer that ends a worked solution with ``#### <answer>`` (GSM8K's layout) is read as
what follows the last ``####``, whatever the format.

- ``number``: gold through :func:`~udpo.env.tasks.parsing.normalize_number` ("1,000" -> "1000"); replies
  parsed by :func:`~udpo.env.tasks.parsing.read_number_answer` (last boxed number, else last number; a
  restatement of the question's own operation is no answer);
- ``choice``: the question shows its options lettered (A), (B), ...; gold given as the letter, the
  option's 0-based index or the option's text; replies parsed by :func:`~udpo.env.tasks.parsing.read_choice`;
- ``text``: gold through :func:`~udpo.env.tasks.parsing.normalize_text` (case, spaces, surrounding
  punctuation and markdown, a leading article do not count); replies parsed by
  :func:`~udpo.env.tasks.parsing.parse_text_answer` (last ``\\boxed{}``, else "the answer is ...", else a
  bold phrase or a short last line).

``parse`` (a callable ``(text, question) -> answer or None``) replaces the format's parser and
``instruction`` its instruction; gold answers are still normalized by the format.

Every field of a record travels with its question (``Question.meta["columns"]``) into the debate's
trajectory (``Trajectory.meta["columns"]``), where reward functions read it: the fields must therefore be
JSON values (text, numbers, lists, dicts). A question may be TRL's conversational form, a list of
``{"role", "content"}`` messages: its last user message is the question.
"""

from __future__ import annotations

import copy
import json
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .base import Answer, Question, Task
from .data import DataError, iter_jsonl
from .formats import ChoiceTask, NumericTask, choice_text
from .parsing import FORM_CUSTOM, LETTERS, Reading, normalize_number, normalize_text, read_text_answer

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


#: GSM8K's gold answers end a worked solution with "#### <answer>"
FINAL_ANSWER_MARK = "####"
#: the columns other libraries use for the question and the answer, named in the errors of a record
#: that lacks ``question_field`` or ``answer_field`` (TRL's datasets say "prompt", chat sets "messages")
_FIELD_HINTS = {
    "question": ("prompt", "messages", "problem", "query"),
    "answer": ("solution", "ground_truth"),
}


@dataclass(frozen=True)
class FormatChoice:
    """An inferred answer format and how it was decided: ``reason`` in words, ``sample`` a row whose gold
    answer shows it."""

    format: str
    reason: str
    sample: Row | None


def final_answer(raw: Any) -> Any:
    """What follows the last ``####`` of a worked solution (GSM8K: "...= 72 clips.\n#### 72" -> "72");
    any other gold answer as it is."""
    if isinstance(raw, str) and FINAL_ANSWER_MARK in raw:
        final = raw.rpartition(FINAL_ANSWER_MARK)[2].strip()
        if final:
            return final
    return raw


def infer_answer_format(
    records: Iterable[Any], answer_field: str = "answer", options_field: str = "options"
) -> str:
    """The answer format of ``records`` (:func:`choose_answer_format`, each record named by its index)."""
    rows = [(f"record {i}", r) for i, r in enumerate(records)]
    return choose_answer_format(rows, answer_field, options_field).format


def choose_answer_format(rows: list[Row], answer_field: str, options_field: str) -> FormatChoice:
    """``choice`` when any record carries options; ``number`` when every gold answer is a number
    (``normalize_number`` reads it, after :func:`final_answer`); ``text`` when not even half of them are.
    Between the two (most gold answers numbers, some not: "5 apples" among numbers) a DataError names the
    first record that is not a number and the two ways out. Records that are not dicts or have no answer
    are left to the record checks, which name them."""
    rows = [(where, r) for where, r in rows if isinstance(r, Mapping)]
    with_options = [(where, r) for where, r in rows if r.get(options_field) is not None]
    if with_options:
        return FormatChoice("choice", f"records carry {options_field!r}", with_options[0])
    answered = [(where, r) for where, r in rows if r.get(answer_field) is not None]
    others = [(where, r) for where, r in answered if _number(final_answer(r[answer_field])) is None]
    n_numbers = len(answered) - len(others)
    if not others:
        marks = sum(
            isinstance(r[answer_field], str) and FINAL_ANSWER_MARK in r[answer_field] for _, r in answered
        )
        why = f"all {len(answered)} gold answers are numbers"
        if marks:
            why += f" ({marks} of them worked solutions ending '{FINAL_ANSWER_MARK} <number>', read as the number)"
        return FormatChoice("number", why, answered[0] if answered else None)
    where, record = others[0]
    if n_numbers > len(others):
        raise DataError(
            f"{where}: answer {record[answer_field]!r:.60} is not a number, though {n_numbers} of the "
            f"{len(answered)} gold answers are (not a number: {len(others)}). Either write it as a number alone, or "
            f"pass answer_format='text' to DatasetTask (task_options: {{answer_format: text}} in a recipe) to "
            f"compare every answer as text"
        )
    why = f"{len(others)} of {len(answered)} gold answers are not numbers (e.g. {where})"
    return FormatChoice("text", why, (where, record))


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
        """Hold ``given`` as the splits, the answer format inferred from all of them when not asked for
        (and said once: :meth:`_announce`)."""
        rows = {split: self._rows(split, records) for split, records in given.items()}
        choice = None
        if self._format is None:
            every = [row for split_rows in rows.values() for row in split_rows]
            choice = choose_answer_format(every, self.fields["answer"], self.fields["options"])
            self.answer_format = choice.format
        self.splits = tuple(given)
        self._questions = {split: self._read(split, split_rows) for split, split_rows in rows.items()}
        if choice is not None:
            self._announce(choice)

    def _announce(self, choice: FormatChoice) -> None:
        """Print the inferred format, why, and a sample gold answer as read (standard error; under a
        multi-process launch on the first process only)."""
        if os.environ.get("RANK", "0") != "0" or choice.sample is None:
            return
        where, record = choice.sample
        raw = record[self.fields["answer"]]
        gold = self._question("sample", 0, where, record).gold
        print(
            f"task {self.name}: answer format {choice.format!r}, inferred: {choice.reason}. Sample gold: "
            f"{where}: {_brief(raw)} read as {gold!r}. answer_format= chooses the format.",
            file=sys.stderr,
        )

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
        return self.read(text, question).answer

    def read(self, text: str, question: Question) -> Reading:
        if self._parse is not None:
            answer = self._parse(text, question)
            if answer is not None and not isinstance(answer, str):
                raise TypeError(
                    f"task {self.name}: parse returned {type(answer).__name__}, not a string or None"
                )
            return Reading.of(answer, FORM_CUSTOM)
        if self._answer_format() == "number":
            return NumericTask.read(self, text, question)
        if self.answer_format == "choice":
            return ChoiceTask.read(self, text, question)  # type: ignore[arg-type]
        return read_text_answer(text)

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
            names = ", ".join(repr(str(k)) for k in records)
            if records and all(_collection(v) for v in records.values()):  # e.g. a datasets.DatasetDict
                first = next(iter(records))
                raise DataError(
                    f"task {self.name}, split {split}: got a dict of splits ({names}), e.g. a DatasetDict: "
                    f"give one split, as train_dataset=data[{first!r}] (and eval_dataset= another), or "
                    f"all of them as DatasetTask(splits=data)"
                )
            raise DataError(
                f"task {self.name}, split {split}: give a list of records, not one dict (keys: {names})"
            )
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
        for role, key in (("question", f["question"]), ("answer", f["answer"])):
            if record.get(key) is None:
                raise DataError(
                    f"{where}: no {key!r} field (fields: {', '.join(map(str, record)) or 'none'})"
                    + _field_hint(role, record)
                )
        text = _question_text(record[f["question"]])
        if not isinstance(text, str) or not text.strip():
            raise DataError(
                f"{where}: {f['question']!r} must be a non-empty string or a conversation with a user message"
            )
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
        gold = self._gold(final_answer(record[f["answer"]]), options, where)
        columns = dict(record)
        try:
            json.dumps(columns)
        except (TypeError, ValueError):
            bad = next(k for k, v in columns.items() if not _json_value(v))
            raise DataError(
                f"{where}: field {bad!r} holds a {type(columns[bad]).__name__}, which a trajectory cannot "
                f"store (reward functions read every field from it): drop the field (a datasets.Dataset: "
                f".remove_columns([{bad!r}])) or make it text"
            ) from None
        return Question(
            id=qid, text=text, gold=gold, options=options, meta={"split": split, "columns": columns}
        )

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


def _collection(value: Any) -> bool:
    """Whether ``value`` is a collection of records (a list, a ``datasets.Dataset``), not one value."""
    return isinstance(value, Iterable) and not isinstance(value, str | bytes | Mapping)


def _question_text(value: Any) -> Any:
    """A question as text: a conversation (TRL's conversational prompt, a list of ``{"role", "content"}``
    messages) gives its last user message; anything else is returned as it is, for the checks."""
    if isinstance(value, list) and all(isinstance(m, Mapping) for m in value):
        asked = [m.get("content") for m in value if m.get("role") == "user"]
        return asked[-1] if asked else None
    return value


def _field_hint(role: str, record: Mapping[str, Any]) -> str:
    """How to point a DatasetTask at a field another library names ("prompt" -> question_field=)."""
    found = [name for name in _FIELD_HINTS[role] if name in record]
    return f"; to read {found[0]!r} as the {role}, pass {role}_field={found[0]!r}" if found else ""


def _brief(raw: Any, width: int = 32) -> str:
    """``repr(raw)``, its middle cut out when long (a worked solution's end is where its answer is)."""
    text = repr(raw)
    return text if len(text) <= 2 * width + 5 else f"{text[:width]} ... {text[-width:]}"


def _json_value(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True
