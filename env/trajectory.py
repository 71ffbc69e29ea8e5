"""The one data type that flows: a debate ``Trajectory``, and its append-only JSONL files.

A trajectory holds the answer matrix ``answers`` (N agents x T+1 rounds of parsed answers, ``None``
when unparsed) and, per agent and round, the ``Turn`` that produced it: the messages the agent saw,
its text, the token ids it was conditioned on and generated, and the log-probs the rollout engine
recorded for them. One debate is one JSON line; files are only ever appended to, one whole line per
write. A trainer's own log-probs of a turn (``Turn.trainer_logprobs``) live in memory only.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

from .jsonl import iter_jsonl, repair_tail
from .tasks.parsing import FORM_UNKNOWN

Answer = Any  # a normalized, JSON-serializable, hashable answer (str, float, int) or None


@dataclass
class Turn:
    """One agent's response in one round.

    reads: the responses the agent read before answering, as ``[agent, round]`` pairs in the order
    shown (empty in round 0). details: what the debate protocol recorded about this turn (e.g. DIGRA's
    entropies and information-gain ratios, an injected round-0 response). form: how ``answer`` was read
    from ``text`` (``udpo.env.tasks.parsing.FORMS``: ``box``, ``stated``, ``letter``, ``restatement``, ...);
    ``unknown`` in a record written before forms were recorded.

    logprobs: the rollout engine's log-probs of the sampled tokens, as it recorded them (what trajectory
    files hold; empty when it recorded none). trainer_logprobs: the trainer's log-probs of the same tokens
    under the sampling policy, computed in memory (the update's first epoch with ``behavior_logprobs:
    recompute``, or :func:`udpo.algorithms.base.fill_behavior_logprobs` where the engine recorded none);
    None until then, and never written to a trajectory file.
    """

    agent: int
    round: int
    messages: list[dict[str, str]]
    text: str
    answer: Answer
    prompt_ids: list[int] = field(default_factory=list)
    completion_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    adapter: str | None = None
    finish_reason: str = "stop"
    reads: list[list[int]] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    form: str = FORM_UNKNOWN
    trainer_logprobs: list[float] | None = None

    @property
    def behavior_logprobs(self) -> list[float]:
        """The ratio's denominator: the trainer's log-probs where it computed them, else the engine's."""
        return self.logprobs if self.trainer_logprobs is None else self.trainer_logprobs


#: the fields of a Turn that live in memory only, never in a trajectory file
IN_MEMORY_TURN_FIELDS = ("trainer_logprobs",)
#: the keys a turn of a trajectory file may have
TURN_FIELDS = tuple(f for f in Turn.__dataclass_fields__ if f not in IN_MEMORY_TURN_FIELDS)


@dataclass
class Trajectory:
    """One debate on one question.

    answers[i][t]: agent i's parsed answer after round t (round 0 = independent answer).
    turns[i][t]: the Turn behind answers[i][t]. prediction: majority vote of the last round.
    meta: free-form run information (task, model, attack settings, compromised agents, ...) and, for a
    question read from a record (DatasetTask), ``columns``: every field of that record.
    """

    question_id: str
    question: str
    gold: Answer
    answers: list[list[Answer]]
    prediction: Answer
    correct: bool
    turns: list[list[Turn]] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def n_agents(self) -> int:
        return len(self.answers)

    @property
    def n_rounds(self) -> int:
        """T: rounds after the initial answer."""
        return len(self.answers[0]) - 1 if self.answers else 0

    def to_dict(self) -> dict[str, Any]:
        """The trajectory file's record (a turn's in-memory fields left out)."""
        d = asdict(self)
        for row in d["turns"]:
            for turn in row:
                for name in IN_MEMORY_TURN_FIELDS:
                    del turn[name]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trajectory:
        turns = [[Turn(**t) for t in agent_turns] for agent_turns in d.get("turns", [])]
        return cls(
            question_id=str(d["question_id"]),
            question=d.get("question", ""),
            gold=d.get("gold"),
            answers=[list(a) for a in d["answers"]],
            prediction=d.get("prediction"),
            correct=bool(d.get("correct", False)),
            turns=turns,
            meta=dict(d.get("meta", {})),
        )


REQUIRED_KEYS = ("question_id", "answers", "gold", "prediction", "correct")
TURN_KEYS = ("agent", "round", "messages", "text", "answer")


class TrajectoryFormatError(ValueError):
    """A trajectory file has a bad line; the message names the file and line number."""


def validate_record(d: Any) -> None:
    """Raise ValueError describing what is wrong with one decoded JSONL record: every field that
    :meth:`Trajectory.from_dict` and the readers use has its type checked here, so a record that
    passes converts without error."""
    if not isinstance(d, dict):
        raise ValueError(f"expected a JSON object, got {type(d).__name__}")
    missing = [k for k in REQUIRED_KEYS if k not in d]
    if missing:
        raise ValueError(f"missing key(s) {', '.join(missing)}")
    if not isinstance(d["question_id"], str | int) or isinstance(d["question_id"], bool):
        raise ValueError(f"'question_id' must be a string, got {type(d['question_id']).__name__}")
    answers = d["answers"]
    if not isinstance(answers, list) or not answers or not all(isinstance(a, list) for a in answers):
        raise ValueError("'answers' must be a non-empty list of per-agent lists")
    lengths = {len(a) for a in answers}
    if len(lengths) != 1 or 0 in lengths:
        raise ValueError(f"'answers' is ragged: per-agent lengths {[len(a) for a in answers]}")
    if not isinstance(d["correct"], bool):
        raise ValueError(f"'correct' must be true or false, got {d['correct']!r}")
    if not isinstance(d.get("meta", {}), dict):
        raise ValueError(f"'meta' must be an object, got {type(d['meta']).__name__}")
    turns = d.get("turns", [])
    if not isinstance(turns, list) or not all(isinstance(row, list) for row in turns):
        raise ValueError("'turns' must be a list of per-agent lists")
    for i, row in enumerate(turns):
        for t, turn in enumerate(row):
            if not isinstance(turn, dict):
                raise ValueError(f"turns[{i}][{t}] must be an object, got {type(turn).__name__}")
            unknown = sorted(set(turn) - set(TURN_FIELDS))
            absent = [k for k in TURN_KEYS if k not in turn]
            if unknown or absent:
                raise ValueError(f"turns[{i}][{t}]: unknown key(s) {unknown}, missing key(s) {absent}")


class TrajectoryWriter:
    """Appends trajectories to a JSONL file: one line per debate, flushed and fsynced per batch.

    Each line is serialized completely before it is written, and a batch is written with a single
    ``write`` call, so an interrupted run leaves only whole lines behind. A file whose last line
    lacks its newline is repaired on open (:func:`udpo.env.jsonl.repair_tail`: a whole record gets its
    newline, a line cut short is removed), exactly as the reader sees it.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        repair_tail(self.path)
        self._fh: TextIO | None = open(self.path, "a", encoding="utf-8")

    def write(self, trajectories: Iterable[Trajectory | dict[str, Any]]) -> None:
        lines = []
        for t in trajectories:
            d = t.to_dict() if isinstance(t, Trajectory) else t
            lines.append(json.dumps(d, ensure_ascii=False) + "\n")
        if not lines:
            return
        if self._fh is None:
            raise ValueError(f"writer for {self.path} is closed")
        self._fh.write("".join(lines))
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def __enter__(self) -> TrajectoryWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def iter_numbered_records(path: str | os.PathLike) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line number, record)`` for each validated record of a trajectory JSONL file.

    Line numbers start at 1 and count blank lines (which are skipped); errors name the file and line.
    Trajectory files are append-only: a last line cut short by a killed writer is dropped with a
    warning (see :mod:`udpo.env.jsonl`).
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"trajectory file not found: {path}")
    for lineno, d in iter_jsonl(path, error=TrajectoryFormatError, append_only=True):
        try:
            validate_record(d)
        except ValueError as e:
            raise TrajectoryFormatError(f"{path}:{lineno}: {e}") from None
        yield lineno, d


def iter_records(path: str | os.PathLike) -> Iterator[dict[str, Any]]:
    """Yield validated records of a trajectory JSONL file; errors name the file and line."""
    return (d for _, d in iter_numbered_records(path))


def read_trajectories(path: str | os.PathLike) -> list[Trajectory]:
    """Read every debate of a JSONL file as Trajectory objects (validated, errors name the line)."""
    return [Trajectory.from_dict(d) for d in iter_records(path)]
