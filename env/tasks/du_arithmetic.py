"""Du et al. (2023)'s arithmetic: ``a+b*c+d-e*f`` with six integers in 0..29, item by item as theirs.

"Improving Factuality and Reasoning in Language Models through Multiagent Debate" evaluates debate on
100 such expressions, drawn by their public generator (``math/gen_math.py`` in
composable-models/llm_multiagent_debate): NumPy's legacy global generator seeded with
``np.random.seed(0)``, then, per item, ``np.random.randint(0, 30, size=6)`` for a..f, and the answer
``a + b*c + d - e*f``. Nothing else draws from that generator in their script, so the same stream here
(a ``RandomState(0)``, the same calls in the same order) gives the same items: the first is
``12+15*21+0-3*27`` = 246.

Splits: ``test`` is their 100 items (``du-arithmetic-0`` .. ``-99``, the item's position in the
stream); ``n_questions`` above 100 continues the stream. ``train`` draws later items of the same
stream, from position 1000 on, skipping any expression already among the first 1000, so training
never sees an evaluation item. The ``seed`` argument of ``load`` is ignored: the items are theirs.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator

import numpy as np

from .base import Question
from .data import take
from .formats import NumericTask
from .parsing import canonical_number

#: NumPy seed of the published generator
SEED = 0
#: items per draw and their range [0, HIGH)
OPERANDS, HIGH = 6, 30
#: the train split starts at this position of the stream (the test split may use positions below it)
TRAIN_START = 1000


def du_stream() -> Iterator[tuple[int, tuple[int, int, int, int, int, int], int]]:
    """The published stream, item after item: (position, (a, b, c, d, e, f), a + b*c + d - e*f)."""
    rng = np.random.RandomState(SEED)
    for k in itertools.count():
        a, b, c, d, e, f = (int(x) for x in rng.randint(0, HIGH, size=OPERANDS))
        yield k, (a, b, c, d, e, f), a + b * c + d - e * f


def expression(operands: tuple[int, ...]) -> str:
    """``a+b*c+d-e*f`` written as the generator writes it."""
    return "{}+{}*{}+{}-{}*{}".format(*operands)


class DuArithmetic(NumericTask):
    """Du et al.'s arithmetic items (see the module docstring). n_questions: items per split (100)."""

    name = "du-arithmetic"
    splits = ("test", "train")
    default_profile = (
        "You are a careful calculator discussing arithmetic with other solvers. Double-check each step."
    )

    def __init__(self, n_questions: int = 100):
        if n_questions < 1:
            raise ValueError(f"n_questions must be >= 1, got {n_questions}")
        if n_questions > TRAIN_START:
            raise ValueError(f"n_questions must be <= {TRAIN_START} (test items stay below the train split)")
        self.n_questions = n_questions

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
                f"du-arithmetic items are regenerated from Du et al.'s seed; no data path is read (got {data_path!r})"
            )
        stream = du_stream()
        if split == "test":
            items = list(itertools.islice(stream, self.n_questions))
        else:
            held_out = {ops for _, ops, _ in itertools.islice(stream, TRAIN_START)}
            items = list(itertools.islice((it for it in stream if it[1] not in held_out), self.n_questions))
        return take([self._question(*item) for item in items], limit)

    def _question(self, position: int, operands: tuple[int, ...], answer: int) -> Question:
        return Question(
            id=f"du-arithmetic-{position}",
            text=f"What is the result of {expression(operands)}?",
            gold=canonical_number(answer),
            meta={"operands": list(operands), "position": position},
        )
