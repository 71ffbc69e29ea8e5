"""The calibration's ordering report (docs/metrics.md, "The reward ordering"): what each agent's reward pays
for three reference debates, and whether a correct but split team out-earns a unanimous wrong one.

The reward terms add, so calibrated coefficients can pay agreement on a wrong answer more than a correct
vote that was contested (at N = 3 it happens whenever ``lambda_i < (2/3) beta_i + 0.64 gamma_i``). The
reference debates of N agents over rounds 0..T, gold answer :data:`RIGHT`:

- ``unanimous_wrong``: every agent gives the same wrong answer in every round.
- ``correct_split``: a bare majority right, each agent stable across rounds: the first ``N - d`` agents
  give the right answer in every round, the last ``d = floor((N - 1) / 2)`` one shared wrong answer (2-1 at
  N = 3, 3-1 at N = 4, 3-2 at N = 5). The right agents come first, so removing one of them leaves either a
  majority or a tie that the vote gives to the right answer: the vote is stable (L = 0). Two agents have no
  bare majority short of unanimity: at N = 2 it is 1-1, a tie the vote gives to agent 0's right answer
  (L = 1/2); at N = 1 the one agent is right.
- ``all_silent``: every answer unparsed (``None``) in every round.

The rewards are those of the library's reward function (:func:`~udpo.rewards.debate_metrics` and
:func:`~udpo.rewards.agent_rewards`) on these answer matrices, with the given coefficients and reward
scope. With scope "agent" an agent's reward depends on its seat: in ``correct_split`` the last ``d``
agents are the dissenters.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

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
    dissent = 1 if n_agents == 2 else (n_agents - 1) // 2
    seats = [RIGHT] * (n_agents - dissent) + [WRONG] * dissent
    return {
        "unanimous_wrong": [[WRONG] * (rounds + 1) for _ in range(n_agents)],
        "correct_split": [[answer] * (rounds + 1) for answer in seats],
        "all_silent": [[None] * (rounds + 1) for _ in range(n_agents)],
    }


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
