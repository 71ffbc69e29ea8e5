"""Woozle metrics: how hallucinations spread through a debate (the DIGRA paper, eq. 1-3, 8, 9).

Input: ``correct[q, i, t]``, whether agent i's answer to question q is right after round t (an
unparsed answer never is), for Q debates of N agents over rounds 0..T (the paper numbers rounds
from 1: its round 1 is our round 0). Per round:

- ``MA_t``  = mean of ``correct[:, :, t]`` (t = 0..T): mean accuracy of the agents;
- ``MR_t``  = #(right at t-1, wrong at t) / #(right at t-1) (t = 1..T): misleading rate;
- ``IMR_t`` = #(right at 0, wrong at t) / #(right at 0) (t = 1..T): initial misleading rate
  (``IMR_1 = MR_1``);
- ``CR_t``  = #(wrong at t-1, right at t) / #(wrong at t-1) (t = 1..T): correction rate.

A rate whose denominator is 0 (no agent could be misled or corrected) is NaN; the paper's tables
print 0 in those cells.

Reads (who read whom) give two more per-round numbers over the speakers' reads of round t:
``wrong_read_fraction`` (share of the responses read that were wrong: the hallucinated information
flow) and ``read_degree`` (mean share of the N - 1 peers a speaker read; the paper's sparsity degree).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class WoozleMetrics:
    """Per-round woozle metrics: ``ma`` has T+1 entries (rounds 0..T), the rates T (rounds 1..T)."""

    ma: np.ndarray
    mr: np.ndarray
    imr: np.ndarray
    cr: np.ndarray

    def to_dict(self) -> dict[str, list[float]]:
        return {k: np.asarray(v, dtype=float).tolist() for k, v in vars(self).items()}


def correctness(answers: Sequence[Sequence[Hashable | None]], gold: Hashable | None) -> np.ndarray:
    """``[i, t]``: whether agent i's answer after round t equals ``gold`` (None is never right)."""
    return np.array([[a is not None and a == gold for a in row] for row in answers], dtype=bool)


def _rate(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    num, den = numerator.sum(axis=(0, 1)).astype(float), denominator.sum(axis=(0, 1)).astype(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


def woozle_metrics(correct: np.ndarray) -> WoozleMetrics:
    """MA, MR, IMR and CR per round from a boolean ``[Q, N, T+1]`` array (see the module docstring)."""
    c = np.asarray(correct)
    if c.ndim != 3 or 0 in c.shape:
        raise ValueError(f"correct must be a non-empty [debates, agents, rounds] array, got shape {c.shape}")
    if c.dtype != bool:
        raise ValueError(f"correct must be boolean, got dtype {c.dtype}")
    before, after = c[:, :, :-1], c[:, :, 1:]
    initial = np.repeat(c[:, :, :1], after.shape[2], axis=2)
    return WoozleMetrics(
        ma=c.mean(axis=(0, 1)),
        mr=_rate(before & ~after, before),
        imr=_rate(initial & ~after, initial),
        cr=_rate(~before & after, ~before),
    )


def read_flow(
    read_rounds: Sequence[int],
    read_wrong: Sequence[bool],
    turn_rounds: Sequence[int],
    turn_degrees: Sequence[float],
    n_rounds: int,
) -> dict[str, np.ndarray]:
    """Per round 1..T: ``wrong_read_fraction`` and ``read_degree`` (NaN for a round nobody spoke in).

    read_rounds[k], read_wrong[k]: the round of the k-th response read by a speaker, and whether that
    response's answer was wrong. turn_rounds[k], turn_degrees[k]: the round of the k-th speaker turn
    and the share of its N - 1 peers it read.
    """
    rr, rw = np.asarray(read_rounds, dtype=int), np.asarray(read_wrong, dtype=bool)
    tr, td = np.asarray(turn_rounds, dtype=int), np.asarray(turn_degrees, dtype=float)
    if rr.shape != rw.shape or tr.shape != td.shape:
        raise ValueError("read_rounds/read_wrong and turn_rounds/turn_degrees must have equal lengths")

    def per_round(rounds: np.ndarray, values: np.ndarray) -> np.ndarray:
        return np.array(
            [values[rounds == t].mean() if (rounds == t).any() else np.nan for t in range(1, n_rounds + 1)]
        )

    return {"wrong_read_fraction": per_round(rr, rw.astype(float)), "read_degree": per_round(tr, td)}
