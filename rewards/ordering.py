"""The calibration's ordering report (docs/metrics.md, "The reward ordering"): what each agent's reward pays
for three reference debates, and whether a correct but split team out-earns a unanimous wrong one.

The reward terms add, so calibrated coefficients can pay agreement on a wrong answer more than a correct
vote that was contested (at N = 3 it happens whenever ``lambda_i < (2/3) beta_i + 0.64 gamma_i``). The
reference debates of N agents over rounds 0..T, gold answer :data:`RIGHT`:

- ``unanimous_wrong``: every agent gives the same wrong answer in every round.
- ``correct_split``: a bare majority right, each agent stable across rounds: the first ``N - d`` agents
  give the right answer in every round, the last ``d = floor((N - 1) / 2)`` one shared wrong answer (2-1 at
  N = 3, 3-1 at N = 4, 3-2 at N = 5). The reference debates are voted with the key of a bare answer list,
  ``""``, under which a tie between :data:`RIGHT` and :data:`WRONG` goes to the right answer (the smaller
  sha256 digest; a test checks it). So removing a right agent leaves either a majority or a tie the vote
  gives to the right answer: the vote is stable (L = 0). Two agents have no bare majority short of
  unanimity: at N = 2 it is 1-1, a tie the vote gives to the right answer (L = 1/2); at N = 1 the one
  agent is right.
- ``all_silent``: every answer unparsed (``None``) in every round.

The rewards are those of the library's reward function (:func:`~udpo.rewards.debate_metrics` and
:func:`~udpo.rewards.agent_rewards`) on these answer matrices, with the given coefficients and reward
scope. With scope "agent" an agent's reward depends on its seat: in ``correct_split`` the last ``d``
agents are the dissenters.

The correctness floor (docs/metrics.md, "The correctness floor"; beyond the paper): ``lambda*_i``, the task
weight above which the correct split out-earns the unanimous wrong debate for agent i, is the difference of
the two debates' rewards with ``lambda_i = 0`` (``r_task`` is 0 and 1 in them); with scope "agent" the
largest difference over every seating of the dissenters. The floor raises each
``lambda_i`` to ``(1 + margin) * lambda*_i`` where it is lower.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations

import numpy as np

from .batch import Scope, agent_rewards, debate_metrics
from .coding import AnswerMatrix

#: the gold answer of the reference debates, and the wrong answer their wrong agents share
RIGHT, WRONG = "right", "wrong"
#: the reference debates, in the order they are reported
REFERENCE_DEBATES = ("unanimous_wrong", "correct_split", "all_silent")


def reference_debates(n_agents: int, rounds: int) -> dict[str, AnswerMatrix]:
    """The answer matrices (N x (T+1)) of :data:`REFERENCE_DEBATES` (see the module docstring)."""
    if n_agents < 1 or rounds < 0:
        raise ValueError(
            f"reference debates need N >= 1 agents and T >= 0 rounds, got {n_agents} and {rounds}"
        )
    dissent = _dissent(n_agents)
    seats = [RIGHT] * (n_agents - dissent) + [WRONG] * dissent
    return {
        "unanimous_wrong": [[WRONG] * (rounds + 1) for _ in range(n_agents)],
        "correct_split": [[answer] * (rounds + 1) for answer in seats],
        "all_silent": [[None] * (rounds + 1) for _ in range(n_agents)],
    }


def _dissent(n_agents: int) -> int:
    """The number of wrong agents in ``correct_split``."""
    return 1 if n_agents == 2 else (n_agents - 1) // 2


def split_seatings(n_agents: int, rounds: int) -> list[AnswerMatrix]:
    """``correct_split`` with its dissenters in every set of seats. The vote never depends on the seats, so
    every seating's vote is right, as the reference seating's is; with scope "agent" the seats decide only
    which agents are the dissenters."""
    return [
        [[WRONG if i in wrong else RIGHT] * (rounds + 1) for i in range(n_agents)]
        for wrong in map(set, combinations(range(n_agents), _dissent(n_agents)))
    ]


@dataclass(frozen=True)
class RewardOrdering:
    """Each agent's reward in each reference debate (``rewards[debate]``: N floats) for T ``rounds``."""

    rounds: int
    scope: Scope
    rewards: dict[str, np.ndarray]

    @property
    def split_beats_wrong(self) -> np.ndarray:
        """Per agent: whether the correct split earns strictly more than the unanimous wrong debate."""
        return self.rewards["correct_split"] > self.rewards["unanimous_wrong"]

    def to_dict(self) -> dict:
        """JSON-ready: ``rounds``, ``scope``, ``reward`` per debate and agent, ``split_beats_unanimous_wrong``."""
        return {
            "rounds": self.rounds,
            "scope": self.scope,
            "reward": {name: self.rewards[name].tolist() for name in REFERENCE_DEBATES},
            "split_beats_unanimous_wrong": self.split_beats_wrong.tolist(),
        }

    def table(self) -> str:
        """A plain-text table per agent, for logs and the console."""
        head = f"{'agent':>5} " + " ".join(f"{name:>16}" for name in REFERENCE_DEBATES) + "  split > wrong"
        lines = [f"reward of reference debates (T = {self.rounds}, scope {self.scope}):", head]
        for i, beats in enumerate(self.split_beats_wrong):
            values = " ".join(f"{self.rewards[name][i]:>16.3f}" for name in REFERENCE_DEBATES)
            lines.append(f"{i:>5} {values}  {'yes' if beats else 'NO: a unanimous wrong team earns more'}")
        return "\n".join(lines)


def ordering_from_dict(d: Mapping) -> RewardOrdering:
    """Rebuild a :class:`RewardOrdering` from :meth:`RewardOrdering.to_dict` output (a calibration record's
    ``ordering``)."""
    try:
        rewards = {name: np.asarray(d["reward"][name], dtype=float) for name in REFERENCE_DEBATES}
        return RewardOrdering(rounds=int(d["rounds"]), scope=d["scope"], rewards=rewards)
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"not a reward ordering record: {e!r}") from None


def reward_ordering(
    coefficients: Mapping[str, Sequence[float] | np.ndarray], rounds: int, scope: Scope = "trajectory"
) -> RewardOrdering:
    """The ordering report for per-agent ``coefficients`` (``alpha``, ``beta``, ``gamma``, ``lambda_``, one
    value per agent; other keys such as ``eta`` are ignored) and debates of T ``rounds``."""
    weights = {k: np.asarray(coefficients[k], dtype=float) for k in ("alpha", "beta", "gamma", "lambda_")}
    debates = reference_debates(len(weights["alpha"]), rounds)
    metrics = debate_metrics(list(debates.values()), [RIGHT] * len(debates))
    rewards = agent_rewards(metrics, **weights, scope=scope)
    return RewardOrdering(
        rounds=rounds, scope=scope, rewards={name: rewards[k] for k, name in enumerate(debates)}
    )


def correctness_threshold(
    coefficients: Mapping[str, Sequence[float] | np.ndarray], rounds: int, scope: Scope = "trajectory"
) -> np.ndarray:
    """``lambda*_i`` per agent: ``R0_i(unanimous_wrong) - R0_i(correct_split)``, the rewards with ``lambda = 0``
    of the given ``alpha``, ``beta``, ``gamma`` (one value per agent); with scope "agent" the largest of it
    over :func:`split_seatings`. The split out-earns the wrong debate for agent i exactly when
    ``lambda_i > lambda*_i``."""
    weights = {k: np.asarray(coefficients[k], dtype=float) for k in ("alpha", "beta", "gamma")}
    n_agents = len(weights["alpha"])
    debates = reference_debates(n_agents, rounds)
    splits = split_seatings(n_agents, rounds) if scope == "agent" else [debates["correct_split"]]
    metrics = debate_metrics([debates["unanimous_wrong"], *splits], [RIGHT] * (1 + len(splits)))
    r0 = agent_rewards(metrics, **weights, lambda_=0.0, scope=scope)
    return (r0[0] - r0[1:]).max(axis=0)


def correctness_floor(
    coefficients: Mapping[str, Sequence[float] | np.ndarray],
    rounds: int,
    scope: Scope = "trajectory",
    margin: float = 0.1,
) -> dict[str, float | list[float]]:
    """SPEC section 4's ``correctness_floor``: each ``lambda_i`` raised to ``(1 + margin) * lambda*_i``
    (:func:`correctness_threshold`) where it is lower; unchanged where ``lambda*_i <= 0``. Returns the
    record's block: ``margin``, ``lambda_star``, ``lambda_before`` and ``lambda_after`` (per agent)."""
    if not (margin >= 0 and math.isfinite(margin)):
        raise ValueError(f"the correctness floor's margin must be a finite number >= 0, got {margin}")
    star = correctness_threshold(coefficients, rounds, scope)
    before = np.asarray(coefficients["lambda_"], dtype=float)
    after = np.where(star > 0, np.maximum(before, (1 + margin) * star), before)
    return {
        "margin": float(margin),
        "lambda_star": star.tolist(),
        "lambda_before": before.tolist(),
        "lambda_after": after.tolist(),
    }
