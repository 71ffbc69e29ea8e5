"""Controlled injection (the woozle paper, sec. 3): replace round-0 responses with given correct or wrong ones.

``pattern`` names, per agent, what it says in round 0: "correct", "wrong", or "own" (it answers
itself). The paper's setup "2x 1v" (two wrong agents, one right) is ``["wrong", "wrong", "correct"]``.
An injected response becomes the agent's own round-0 turn (in its history and in what peers read),
marked ``details["inject"]`` and ``finish_reason: "injected"``; it has no token ids, so injected
debates are for measuring hallucination propagation, not for training.

Responses come from a JSONL file, one line per question:
``{"question_id": ..., "correct": "..." or [...], "wrong": "..." or [...]}`` (with lists, the k-th
agent given that kind gets entry ``k mod len``), or, for numeric and multiple-choice tasks, are
written from the gold answer (a wrong number is the gold plus a nonzero offset drawn per question;
a wrong letter another option). Every response must parse to the gold answer ("correct") or to
something else ("wrong"); otherwise a ValueError names the question (and file line).
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

from ..seeds import derived_seed
from ..tasks.base import Question, Task
from ..tasks.formats import ChoiceTask, NumericTask
from ..tasks.parsing import canonical_number
from .base import DebateState, Stage

KINDS = ("correct", "wrong", "own")


def check_pattern(pattern: Sequence[str], n_agents: int | None = None) -> list[str]:
    """The pattern as a list, each entry one of KINDS (and N entries when ``n_agents`` is given)."""
    pattern = list(pattern)
    bad = [p for p in pattern if p not in KINDS]
    if bad or not pattern:
        raise ValueError(f"inject: one entry per agent among {', '.join(KINDS)}, got {pattern}")
    if n_agents is not None and len(pattern) != n_agents:
        raise ValueError(f"inject pattern {pattern} has {len(pattern)} entries for {n_agents} agents")
    return pattern


def builtin_response(task: Task, question: Question, kind: str) -> str:
    """A short response stating the gold answer ("correct") or one wrong answer ("wrong")."""
    rng = random.Random(derived_seed("inject", question.id))
    if isinstance(task, NumericTask) and question.gold is not None:
        value = question.gold
        if kind == "wrong":
            offset = rng.choice([d for d in range(-10, 11) if d != 0])
            value = canonical_number(Decimal(question.gold) + offset)
        return f"I worked through it step by step and checked the result. The final answer is \\boxed{{{value}}}."
    if isinstance(task, ChoiceTask) and question.gold is not None:
        letter = question.gold
        if kind == "wrong":
            letter = rng.choice([x for x in task.letters(question) if x != question.gold])
        return f"After weighing every option, the best one is ({letter}).\nAnswer: ({letter})"
    raise ValueError(
        f"task {task.name}: built-in injected responses exist for numeric and multiple-choice tasks; "
        f"give the responses in a file (inject_file)"
    )


def read_responses(path: str | Path) -> dict[str, dict[str, list[str]]]:
    """question_id -> {"correct": [...], "wrong": [...]} from a JSONL file (errors name the line)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"inject file not found: {path}")
    out: dict[str, dict[str, list[str]]] = {}
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: not JSON: {e}") from None
        if not isinstance(record, dict) or "question_id" not in record:
            raise ValueError(f"{where}: expected an object with question_id, correct and/or wrong")
        entry = {}
        for kind in ("correct", "wrong"):
            value = record.get(kind, [])
            value = [value] if isinstance(value, str) else value
            if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
                raise ValueError(f"{where}: {kind!r} must be a non-empty string or a list of them")
            entry[kind] = value
        out[str(record["question_id"])] = entry
    return out


class Injection(Stage):
    """Supplies the round-0 responses ``pattern`` asks for (from ``path``, else written from the gold)."""

    name = "inject"

    def __init__(self, task: Task, pattern: Sequence[str], path: str | None = None):
        self.task, self.pattern, self.path = task, check_pattern(pattern), path
        self.responses = read_responses(path) if path else None

    def prepare(self, agents: list, task: Task) -> list:
        check_pattern(self.pattern, len(agents))
        return agents

    def supply(self, states: Sequence[DebateState], rnd: int) -> None:
        if rnd != 0:
            return
        for s in states:
            seen = {"correct": 0, "wrong": 0}
            for i, kind in enumerate(self.pattern):
                if kind == "own":
                    continue
                text = self.response(s.question, kind, seen[kind])
                seen[kind] += 1
                s.supplied[i] = text
                s.details[i][self.name] = kind

    def response(self, question: Question, kind: str, k: int) -> str:
        """The k-th response of ``kind`` for ``question``, checked against the gold answer."""
        if self.responses is None:
            text, where = builtin_response(self.task, question, kind), "built-in response"
        else:
            given = self.responses.get(question.id, {}).get(kind)
            if not given:
                raise ValueError(f"{self.path}: no {kind!r} response for question {question.id!r}")
            text, where = given[k % len(given)], str(self.path)
        answer = self.task.parse(text, question)
        if self.task.is_correct(answer, question) != (kind == "correct"):
            raise ValueError(
                f"{where}: the {kind!r} response for question {question.id!r} parses to {answer!r} "
                f"(gold {question.gold!r})"
            )
        return text

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "pattern": self.pattern, "source": self.path or "builtin"}
