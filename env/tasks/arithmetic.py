"""Generated arithmetic of graded difficulty: a task small models can learn on a CPU.

Questions read "What is 37 + 45?" and are answered like GSM8K (a number in ``\\boxed{}``).
Levels, roughly from easy to hard for a small model:

====== ==========================================================  ==========================
level  problems                                                     distinct problems
====== ==========================================================  ==========================
1      one-digit addition ``a + b``, a, b in 0..9                   100
2      two-digit addition, a, b in 10..99                           8,100
3      one-digit multiplication ``a * b``, a, b in 0..9             100
4      two-digit addition or subtraction (results may be negative)  16,200
5      two-digit times one-digit, a in 10..99, b in 2..9            720
6      exact division ``a / b``, b in 2..12, quotient in 2..50      539
7      three terms, operands 2..20, ``+ - *`` with precedence       61,731
8      two-digit multiplication, a, b in 10..99                     8,100
====== ==========================================================  ==========================

Train and test are disjoint by construction: every problem belongs to one half by a hash of
the problem (``a + b`` and ``b + a`` share a half), whatever the seed, and a split only draws
problems of its own half. Within a split problems do not repeat until the level's half runs out
(levels 1 and 3 have about 50 per split); then repeats are allowed. The same (seed, split,
options) always gives the same questions and ids (with a given Python version's ``random``).
"""

from __future__ import annotations

import operator
import os
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .base import Question
from .data import half_of, take
from .formats import NumericTask
from .parsing import canonical_number

_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.floordiv}  # "/" only exact
_MAX_DRAWS = 200  # draws tried for an unseen problem of the split's half before allowing a repeat


@dataclass(frozen=True)
class Problem:
    """expression: as shown ("37 + 45"). value: its exact integer result.
    key: identity for the train/test partition (commutative twins share one)."""

    expression: str
    value: int
    key: str


def _binary(a: int, op: str, b: int) -> Problem:
    value = _OPS[op](a, b)
    key = f"{min(a, b)} {op} {max(a, b)}" if op in "+*" else f"{a} {op} {b}"
    return Problem(f"{a} {op} {b}", value, key)


def _three_terms(rng: random.Random) -> Problem:
    a, b, c = (rng.randint(2, 20) for _ in range(3))
    op1, op2 = rng.choice("+-*"), rng.choice("+-*")
    if op2 == "*" and op1 != "*":  # multiplication binds first
        tail = b * c
        value = a + tail if op1 == "+" else a - tail
    else:
        head = _binary(a, op1, b).value
        value = _binary(head, op2, c).value
    expression = f"{a} {op1} {b} {op2} {c}"
    return Problem(expression, value, expression)


def _division(rng: random.Random) -> Problem:
    b, quotient = rng.randint(2, 12), rng.randint(2, 50)
    return _binary(b * quotient, "/", b)


#: level -> (description, generator)
LEVELS: dict[int, tuple[str, Callable[[random.Random], Problem]]] = {
    1: ("one-digit addition", lambda r: _binary(r.randint(0, 9), "+", r.randint(0, 9))),
    2: ("two-digit addition", lambda r: _binary(r.randint(10, 99), "+", r.randint(10, 99))),
    3: ("one-digit multiplication", lambda r: _binary(r.randint(0, 9), "*", r.randint(0, 9))),
    4: (
        "two-digit addition or subtraction",
        lambda r: _binary(r.randint(10, 99), r.choice("+-"), r.randint(10, 99)),
    ),
    5: ("two-digit times one-digit", lambda r: _binary(r.randint(10, 99), "*", r.randint(2, 9))),
    6: ("exact division", _division),
    7: ("three terms with + - * and precedence", _three_terms),
    8: ("two-digit multiplication", lambda r: _binary(r.randint(10, 99), "*", r.randint(10, 99))),
}


class Arithmetic(NumericTask):
    """Generated questions; see the module docstring for the levels.

    difficulty: one level or a list of levels (question k uses ``levels[k % len(levels)]``).
    n_questions: questions per split (default 100); ``load(limit=K)`` keeps the first K.
    answer_only: ask for the bare number instead of reasoning first (default False): a terse profile,
    "the number only" in every round, and in rounds t >= 1 the question asked again after the peers'
    answers. For debates under a small ``max_tokens`` cap (12-16 tokens), which would otherwise cut most
    answers of a small model; the parser reads the last number of the reply.
    """

    name = "arithmetic"
    splits = ("train", "test")
    default_profile = (
        "You are a careful calculator discussing arithmetic with other solvers. Double-check each step."
    )

    def __init__(
        self, difficulty: int | Sequence[int] = 1, n_questions: int = 100, answer_only: bool = False
    ):
        self.levels = [difficulty] if isinstance(difficulty, int) else [int(x) for x in difficulty]
        unknown = [x for x in self.levels if x not in LEVELS]
        if not self.levels or unknown:
            raise ValueError(f"difficulty must be levels among {sorted(LEVELS)}, got {difficulty!r}")
        if n_questions < 1:
            raise ValueError(f"n_questions must be >= 1, got {n_questions}")
        self.n_questions = n_questions
        self.answer_only = bool(answer_only)
        if self.answer_only:
            self.default_profile = (
                "You work as a calculator: you reply with one short line and never explain."
            )

    def format_instruction(self, question: Question) -> str:
        if self.answer_only:
            return "Answer with the number only."
        return super().format_instruction(question)

    def debate_request(self, question: Question) -> str:
        # a small model asked to "weigh their reasoning" recites the request; asked the question again,
        # it answers it (measured on training questions: docs/lab/plan_debate_reward.md)
        if self.answer_only:
            return f"{question.text} {self.format_instruction(question)}"
        return super().debate_request(question)

    def load(
        self,
        split: str = "test",
        data_path: str | os.PathLike | None = None,
        limit: int | None = None,
        seed: int = 0,
    ) -> list[Question]:
        self.check_split(split)
        if data_path is not None:
            raise ValueError(
                f"arithmetic questions are generated from the seed; no data path is read (got {data_path!r})"
            )
        rng = random.Random(f"arithmetic:{seed}:{split}")
        seen: set[str] = set()
        questions = []
        for k in range(self.n_questions):
            level = self.levels[k % len(self.levels)]
            problem = _draw(rng, LEVELS[level][1], split, seen)
            questions.append(
                Question(
                    id=f"arithmetic-{split}-s{seed}-{k}",
                    text=f"What is {problem.expression}?",
                    gold=canonical_number(problem.value),
                    meta={"level": level, "expression": problem.expression},
                )
            )
        return take(questions, limit)


def _draw(
    rng: random.Random, generate: Callable[[random.Random], Problem], split: str, seen: set[str]
) -> Problem:
    """A problem of ``split``'s half not in ``seen`` (added to it), or a repeat once none is found."""
    repeat = None
    for _ in range(_MAX_DRAWS):
        problem = generate(rng)
        if half_of(f"arithmetic:{problem.key}") != split:
            continue
        if problem.expression not in seen:
            seen.add(problem.expression)
            return problem
        repeat = repeat or problem
    if repeat is None:
        raise RuntimeError(f"no {split} problem found in {_MAX_DRAWS} draws")
    return repeat
