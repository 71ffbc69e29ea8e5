"""Uncertainty-driven rewards of one debate (docs/metrics.md, "Rewards") and the replay priority
(docs/algorithms.md, "Uncertainty-driven replay").

- ``r_intra`` = 1 - (answer changes over all N*T transitions t -> t+1, t = 0..T-1) / (N*T); 1 when T = 0.
  (The paper prints the normalizer N(T-1); we normalize by the number of transitions so the reward
  stays in [0, 1].) Note r_intra is *not* 1 - U_intra: it counts the round-0 transition and no revision term.
- ``r_inter`` = 1 - U_inter, ``r_sys`` = 1 - U_sys, ``r_task`` = [vote(final round) == gold]
  (an all-None vote is wrong).

With ``scope="agent"`` each term is per agent: r_intra_i = 1 - flips_i / T, r_inter_i = 1 - (agent i's
share of disagreeing peers, averaged over rounds), r_sys_i = 1 - (H + D + L_i) / 3; r_task is the team's.

:func:`rewards` reads them from :mod:`udpo.rewards.batch` on a batch of one (the one implementation).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

import numpy as np

from .batch import Match, Scope, is_correct, one_debate
from .coding import AnswerMatrix

__all__ = ["Match", "Rewards", "Scope", "composite_uncertainty", "is_correct", "rewards"]


@dataclass(frozen=True)
class Rewards:
    """The four reward terms: floats (scope "trajectory") or arrays of N floats (scope "agent")."""

    r_intra: float | np.ndarray
    r_inter: float | np.ndarray
    r_sys: float | np.ndarray
    r_task: float | np.ndarray

    def to_dict(self) -> dict:
        return {k: np.asarray(v).tolist() for k, v in vars(self).items()}


def rewards(
    answers: AnswerMatrix,
    gold: Hashable | None,
    scope: Scope = "trajectory",
    match: Match | None = None,
    key: str = "",
) -> Rewards:
    """r_intra, r_inter, r_sys and r_task of one debate (per agent with ``scope="agent"``); ``key``: its
    question id, the key of its votes (r_task's and L's)."""
    if scope not in ("trajectory", "agent"):
        raise ValueError(f"scope must be 'trajectory' or 'agent', got {scope!r}")
    m = one_debate(answers, gold, match=match, key=key)
    r_task = float(m.r_task[0])
    if scope == "trajectory":
        return Rewards(
            r_intra=float(m.r_intra[0]), r_inter=float(m.r_inter[0]), r_sys=float(m.r_sys[0]), r_task=r_task
        )
    return Rewards(
        r_intra=m.agent_r_intra[0],
        r_inter=m.agent_r_inter[0],
        r_sys=m.agent_r_sys[0],
        r_task=np.full(len(m.agent_r_sys[0]), r_task),
    )


def composite_uncertainty(
    r_intra: float | np.ndarray,
    r_inter: float | np.ndarray,
    r_sys: float | np.ndarray,
    alpha: float = 1 / 3,
    beta: float = 1 / 3,
    gamma: float = 1 / 3,
) -> float | np.ndarray:
    """Replay priority ``U = alpha (1 - r_intra) + beta (1 - r_inter) + gamma (1 - r_sys)``
    (docs/algorithms.md, "Uncertainty-driven replay").

    Works on floats or arrays (broadcast). The weights are the calibration's base weights
    (``Calibration.alpha_base`` etc.); with the 1/3 defaults U is the mean of the three uncertainties.
    """
    for name, w in (("alpha", alpha), ("beta", beta), ("gamma", gamma)):
        if not np.isfinite(w) or w < 0:
            raise ValueError(f"{name} must be a finite weight >= 0, got {w}")
    out = (
        alpha * (1 - np.asarray(r_intra)) + beta * (1 - np.asarray(r_inter)) + gamma * (1 - np.asarray(r_sys))
    )
    if np.isnan(out).any():
        raise ValueError("composite_uncertainty got NaN rewards")
    return float(out) if out.ndim == 0 else out
