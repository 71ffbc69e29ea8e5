"""Uncertainty-driven rewards of one debate (docs/metrics.md, "Rewards") and the replay priority
(docs/algorithms.md, "Uncertainty-driven replay").

- ``r_intra`` = 1 - (answer changes over all N*T transitions t -> t+1, t = 0..T-1) / (N*T); 1 when T = 0.
  (The paper prints the normalizer N(T-1); we normalize by the number of transitions so the reward
  stays in [0, 1].) Note r_intra is *not* 1 - U_intra: it counts the round-0 transition and no revision term.
- ``r_inter`` = 1 - U_inter, ``r_sys`` = 1 - U_sys, ``r_task`` = [vote(final round) == gold]
  (an all-None vote is wrong).

With ``scope="agent"`` each term is per agent: r_intra_i = 1 - flips_i / T, r_inter_i = 1 - (agent i's
share of disagreeing peers, averaged over rounds), r_sys_i = 1 - (H + D + L_i) / 3; r_task is the team's.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Literal

import numpy as np

from .coding import AnswerMatrix, check_answers
from .metrics import agent_uncertainty, final_round_spread, uncertainty
from .vote import majority_vote

Scope = Literal["trajectory", "agent"]
#: match(prediction, gold) -> whether a (non-None) prediction is correct; default ``==``
Match = Callable[[Hashable, Hashable], bool]


@dataclass(frozen=True)
class Rewards:
    """The four reward terms: floats (scope "trajectory") or arrays of N floats (scope "agent")."""

    r_intra: float | np.ndarray
    r_inter: float | np.ndarray
    r_sys: float | np.ndarray
    r_task: float | np.ndarray

    def to_dict(self) -> dict:
        return {k: np.asarray(v).tolist() for k, v in vars(self).items()}


def is_correct(prediction: Hashable | None, gold: Hashable | None, match: Match | None = None) -> bool:
    """Whether a prediction is right: ``None`` never is; otherwise ``match`` (default ``==``)."""
    if prediction is None:
        return False
    return bool(match(prediction, gold)) if match is not None else bool(prediction == gold)


def rewards(
    answers: AnswerMatrix, gold: Hashable | None, scope: Scope = "trajectory", match: Match | None = None
) -> Rewards:
    """r_intra, r_inter, r_sys and r_task of one debate (per agent with ``scope="agent"``)."""
    if scope not in ("trajectory", "agent"):
        raise ValueError(f"scope must be 'trajectory' or 'agent', got {scope!r}")
    a = check_answers(answers)
    n, t_max = len(a), len(a[0]) - 1
    final = tuple(row[t_max] for row in a)
    r_task = float(is_correct(majority_vote(final), gold, match))
    if scope == "trajectory":
        u = uncertainty(a)
        flips = sum(row[t] != row[t + 1] for row in a for t in range(t_max))
        r_intra = 1.0 - flips / (n * t_max) if t_max > 0 else 1.0
        return Rewards(r_intra=r_intra, r_inter=1.0 - u.u_inter, r_sys=1.0 - u.u_sys, r_task=r_task)
    per_agent = agent_uncertainty(a)
    entropy, disagreement = final_round_spread(final)
    flips = np.asarray(per_agent.flips, dtype=float)
    return Rewards(
        r_intra=1.0 - flips / t_max if t_max > 0 else np.ones(n),
        r_inter=1.0 - np.asarray(per_agent.u_inter),
        r_sys=1.0 - (entropy + disagreement + np.asarray(per_agent.loo)) / 3,
        r_task=np.full(n, r_task),
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
