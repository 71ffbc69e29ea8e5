"""Answer matrices: validation, and integer coding for the vectorized path.

An answer matrix holds N agents' parsed answers over rounds 0..T: ``answers[i][t]``. Answers are any
hashable values compared with ``==``. ``None`` (unparsed) is an abstention in the vote and, by the
silence rule (docs/metrics.md, "The answer matrix"), no answer at all in every uncertainty metric,
reward and calibration statistic: it differs from every answer, another ``None`` included. The batch
path works on integer codes instead: within one batch equal answers get equal codes, :data:`NONE_CODE`
stands for ``None`` and every other code is non-negative (codes are arbitrary labels: no metric depends
on their values). :func:`unparsed_apart` applies the silence rule to codes, the one place it is applied:
it gives each ``None`` a negative code of its own, so that comparing codes with ``==`` follows the rule.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from itertools import chain

import numpy as np

AnswerMatrix = Sequence[Sequence[Hashable | None]]
Matrix = tuple[tuple[Hashable | None, ...], ...]

#: integer code of an unparsed answer (``None``)
NONE_CODE = -1


def _is_nan(a: object) -> bool:
    """NaN of any real float type: Python float and every NumPy floating type (float16 .. longdouble)."""
    return isinstance(a, float | np.floating) and math.isnan(a)


def _as_row(row: object, i: int, where: str) -> tuple:
    if type(row) is tuple:  # fast paths first: ABC isinstance checks are slow on big batches
        return row
    if type(row) is list or (not isinstance(row, (str, bytes)) and isinstance(row, Sequence | np.ndarray)):
        return tuple(row)
    raise ValueError(
        f"{where}: agent {i} must be a sequence of T+1 answers, got {type(row).__name__} {row!r}"
    )


def _check_shape(answers: AnswerMatrix, where: str) -> Matrix:
    """Structure and hashability of one matrix (no per-answer NaN scan); rows as tuples."""
    if type(answers) not in (list, tuple) and (
        isinstance(answers, (str, bytes)) or not isinstance(answers, Sequence | np.ndarray)
    ):
        raise ValueError(f"{where}: expected N per-agent sequences of answers, got {type(answers).__name__}")
    if len(answers) == 0:
        raise ValueError(f"{where}: no agents (an answer matrix needs N >= 1 rows)")
    rows = tuple(_as_row(row, i, where) for i, row in enumerate(answers))
    try:
        hash(rows)  # hashes every answer in C
    except TypeError:
        for i, row in enumerate(rows):
            for t, a in enumerate(row):
                try:
                    hash(a)
                except TypeError:
                    raise ValueError(
                        f"{where}: answer of agent {i} at round {t} is unhashable ({type(a).__name__}: {a!r})"
                    ) from None
    lengths = [len(r) for r in rows]
    if len(set(lengths)) != 1:
        raise ValueError(
            f"{where}: ragged answer matrix, per-agent lengths {lengths} (every agent needs T+1)"
        )
    if lengths[0] == 0:
        raise ValueError(f"{where}: no rounds (each agent needs at least the round-0 answer)")
    return rows


def _check_nan(rows: Matrix, where: str) -> None:
    for i, row in enumerate(rows):
        for t, a in enumerate(row):
            if _is_nan(a):
                raise ValueError(f"{where}: answer of agent {i} at round {t} is NaN (use None for unparsed)")


def check_answers(answers: AnswerMatrix, where: str = "answers") -> Matrix:
    """Validate one answer matrix and return it as a tuple of per-agent tuples.

    Raises ValueError naming the problem (``where`` prefixes the message, e.g. ``"debate 3"``):
    not a sequence of per-agent sequences, no agents, no rounds, ragged rows, NaN or unhashable answers.
    """
    rows = _check_shape(answers, where)
    _check_nan(rows, where)
    return rows


def check_answer_matrices(answer_matrices: Sequence[AnswerMatrix], where: str = "debate") -> list[Matrix]:
    """:func:`check_answers` for many matrices (messages name ``"<where> <index>"``), fast for big batches.

    NaN is looked for among the distinct answers first, and located only when present.
    """
    matrices = [_check_shape(a, f"{where} {m}") for m, a in enumerate(answer_matrices)]
    distinct = set(chain.from_iterable(chain.from_iterable(matrices)))
    if any(_is_nan(v) for v in distinct):
        for m, a in enumerate(matrices):
            _check_nan(a, f"{where} {m}")
    return matrices


class AnswerCoder:
    """One shared answer -> code table, so codes of several batches stay comparable."""

    def __init__(self) -> None:
        self._lookup: dict[Hashable | None, int] = {None: NONE_CODE}

    def encode(self, matrices: Sequence[Matrix]) -> np.ndarray:
        """Codes ``M x N x (T+1)`` of validated matrices of one shape (see :func:`check_answer_matrices`)."""
        lookup = self._lookup
        n, t1 = len(matrices[0]), len(matrices[0][0])
        answers = list(chain.from_iterable(chain.from_iterable(matrices)))
        for v in set(answers) - lookup.keys():
            lookup[v] = len(lookup) - 1
        codes = np.fromiter(map(lookup.__getitem__, answers), dtype=np.int32, count=len(answers))
        return codes.reshape(len(matrices), n, t1)

    def values(self) -> list[Hashable]:
        """``values()[code]`` is the answer coded ``code`` (codes >= 0)."""
        return [x for x in self._lookup if x is not None]


def encode_answers(
    answer_matrices: Sequence[AnswerMatrix], return_values: bool = False
) -> np.ndarray | tuple[np.ndarray, list[Hashable]]:
    """Integer-code M answer matrices of one shape N x (T+1) into an ``int32`` array ``M x N x (T+1)``.

    ``None`` becomes :data:`NONE_CODE`; other answers get codes >= 0, equal answers (by ``==`` and hash,
    as in a dict) equal codes. With ``return_values`` also return ``values`` with ``values[code]`` the
    answer behind each code >= 0. Raises ValueError if a matrix is invalid or the shapes differ.
    """
    matrices = check_answer_matrices(answer_matrices)
    if not matrices:
        raise ValueError("no answer matrices to encode")
    shape = (len(matrices[0]), len(matrices[0][0]))
    for m, a in enumerate(matrices):
        if (len(a), len(a[0])) != shape:
            raise ValueError(
                f"debate {m}: shape {len(a)}x{len(a[0])} differs from debate 0's {shape[0]}x{shape[1]}; "
                "encode debates of one shape together (debate_metrics groups them for you)"
            )
    coder = AnswerCoder()
    codes = coder.encode(matrices)
    return (codes, coder.values()) if return_values else codes


def unparsed_apart(codes: np.ndarray) -> np.ndarray:
    """The silence rule on validated codes: every :data:`NONE_CODE` gets a negative code of its own.

    Codes compared with ``==`` afterwards find each unparsed answer different from every other entry,
    another unparsed one included (a singleton in ``p`` and ``K``, a change between rounds, a disagreeing
    pair), and equal only to itself. A code < 0 still marks an unparsed answer, so the vote can abstain.
    Returns ``codes`` itself when at most one answer is unparsed (it is apart already), else a copy.
    """
    unparsed = codes == NONE_CODE
    count = int(np.count_nonzero(unparsed))
    if count < 2:
        return codes
    apart = codes.astype(np.result_type(codes.dtype, np.min_scalar_type(NONE_CODE - count)))
    apart[unparsed] = NONE_CODE - np.arange(count)
    return apart


def answer_classes(answers: Sequence[Hashable | None]) -> list[int]:
    """A class per answer under the silence rule: equal answers share one, each ``None`` has its own."""
    return unparsed_apart(encode_answers([[(a,) for a in answers]])).ravel().tolist()


def check_codes(codes: np.ndarray) -> np.ndarray:
    """Validate an integer-coded batch ``M x N x (T+1)`` and return it as an integer array."""
    codes = np.asarray(codes)
    if codes.ndim != 3:
        raise ValueError(f"codes must have shape M x N x (T+1), got an array of shape {codes.shape}")
    if 0 in codes.shape[1:]:
        raise ValueError(f"codes must have N >= 1 agents and T+1 >= 1 rounds, got shape {codes.shape}")
    if not np.issubdtype(codes.dtype, np.integer):
        if np.issubdtype(codes.dtype, np.floating) and np.isnan(codes).any():
            raise ValueError("codes contain NaN; code unparsed answers as NONE_CODE (-1)")
        raise ValueError(f"codes must be integers (dtype {codes.dtype}); use encode_answers() to build them")
    if codes.size and codes.min() < NONE_CODE:
        raise ValueError(f"codes below NONE_CODE ({NONE_CODE}) found: min {codes.min()}")
    return codes
