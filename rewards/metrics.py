"""Three-level uncertainty of one debate (docs/metrics.md, "Formulas as implemented" and "Agent-tailored
coefficients"), written to read like the formulas.

For an answer matrix ``a[i][t]`` (N agents, rounds t = 0..T; see :mod:`udpo.rewards.coding`):

- ``flip_rate`` F: share of debate-round transitions t -> t+1 (t = 1..T-1) where an agent changes its
  answer; 0 when T < 2. ``revision_rate`` M: share of agents whose final answer differs from round 0.
- ``u_intra`` = lam * F + (1 - lam) * M: intra-agent uncertainty (agents changing their own minds).
- ``conflict`` C_t: share of agent pairs that disagree in round t (0 when N = 1);
  ``u_inter`` = mean of C_t over rounds 0..T: inter-agent uncertainty.
- Over the final round: ``entropy`` H (natural-log entropy of the answer distribution divided by
  ln K, K distinct answers; 0 when K = 1), ``disagreement`` D (1 unless unanimous) and
  ``loo_instability`` L (share of agents whose removal changes the vote; 0 when N = 1);
  ``u_sys`` = (H + D + L) / 3: system-level uncertainty.

The consensus-on-wrong guard (issue 24: agreement must not be bought with correctness), from the final
round and whether the debate's vote is right: ``majority`` is 1 when more than half of the agents give
the same answer and the vote (then that answer) is wrong, ``unanimous`` when every agent gives it.

This is the reference path, one debate at a time; :mod:`udpo.rewards.batch` computes the same
numbers for many debates at once.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass

from .coding import AnswerMatrix, check_answers
from .vote import majority_vote


@dataclass(frozen=True)
class Uncertainty:
    """Debate-level uncertainty; ``conflict`` has one value per round 0..T."""

    flip_rate: float
    revision_rate: float
    u_intra: float
    conflict: tuple[float, ...]
    u_inter: float
    entropy: float
    disagreement: float
    loo_instability: float
    u_sys: float

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class AgentUncertainty:
    """Per-agent profile of one debate (docs/metrics.md, "Rewards" and "Agent-tailored coefficients"), one
    value per agent.

    flips: answer changes over all transitions t = 0..T-1 (the count behind r_intra).
    u_intra: lam * F_i + (1 - lam) * M_i with F_i over t = 1..T-1 (0 when T < 2), M_i = [a_i0 != a_iT].
    u_inter: mean over rounds of the share of peers agent i disagrees with (0 when N = 1).
    loo: [vote(final) != vote(final without agent i)] (0 when N = 1).
    """

    flips: tuple[int, ...]
    u_intra: tuple[float, ...]
    u_inter: tuple[float, ...]
    loo: tuple[float, ...]


@dataclass(frozen=True)
class WrongConsensus:
    """The consensus-on-wrong guard of one debate: 1.0 or 0.0 each (see the module docstring)."""

    majority: float
    unanimous: float


def wrong_consensus(answers: AnswerMatrix, correct: bool) -> WrongConsensus:
    """Whether a strict majority (``majority``) or every agent (``unanimous``) ends on one answer while the
    debate's vote is wrong (``correct``: the task's verdict on the vote). A strict majority's answer is
    the vote, so the vote being wrong means that answer is; unparsed answers (None) never count."""
    a = check_answers(answers)
    final = [row[-1] for row in a]
    top = max(Counter(x for x in final if x is not None).values(), default=0)
    wrong = not correct
    return WrongConsensus(
        majority=float(wrong and 2 * top > len(final)), unanimous=float(wrong and top == len(final))
    )


def _check_lam(lam: float) -> None:
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"lam must lie in [0, 1], got {lam}")


def loo_changes(final: tuple) -> tuple[float, ...]:
    """Per agent: 1.0 if removing it changes the majority vote of ``final``, else 0.0 (all 0 when N = 1)."""
    if len(final) == 1:
        return (0.0,)
    vote = majority_vote(final)
    return tuple(float(majority_vote(final[:i] + final[i + 1 :]) != vote) for i in range(len(final)))


def final_round_spread(final: tuple) -> tuple[float, float]:
    """Normalized entropy H and disagreement D of the final-round answers (None counts as an answer).

    H of a uniform split is exactly 1 (the sum of logs alone can round to 1 +- 4e-16); any other H is
    capped at 1 against rounding, so H never leaves [0, 1].
    """
    n = len(final)
    counts = Counter(final).values()
    k = len(counts)
    if k == 1:
        entropy = 0.0
    elif min(counts) == max(counts):
        entropy = 1.0
    else:
        entropy = min(1.0, -sum(c / n * math.log(c / n) for c in counts) / math.log(k))
    disagreement = float(max(counts) < n)
    return entropy, disagreement


def uncertainty(answers: AnswerMatrix, lam: float = 0.5) -> Uncertainty:
    """U_intra, U_inter and U_sys (with their parts) of one debate's answer matrix."""
    _check_lam(lam)
    a = check_answers(answers)
    n, t_max = len(a), len(a[0]) - 1

    flips = sum(a[i][t] != a[i][t + 1] for i in range(n) for t in range(1, t_max))
    flip_rate = flips / (n * (t_max - 1)) if t_max >= 2 else 0.0
    revision_rate = sum(a[i][0] != a[i][t_max] for i in range(n)) / n
    u_intra = lam * flip_rate + (1 - lam) * revision_rate

    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    conflict = tuple(
        sum(a[i][t] != a[j][t] for i, j in pairs) / len(pairs) if pairs else 0.0 for t in range(t_max + 1)
    )
    u_inter = sum(conflict) / (t_max + 1)

    final = tuple(row[t_max] for row in a)
    entropy, disagreement = final_round_spread(final)
    loo_instability = sum(loo_changes(final)) / n
    u_sys = (entropy + disagreement + loo_instability) / 3
    return Uncertainty(
        flip_rate=flip_rate,
        revision_rate=revision_rate,
        u_intra=u_intra,
        conflict=conflict,
        u_inter=u_inter,
        entropy=entropy,
        disagreement=disagreement,
        loo_instability=loo_instability,
        u_sys=u_sys,
    )


def agent_uncertainty(answers: AnswerMatrix, lam: float = 0.5) -> AgentUncertainty:
    """Each agent's share of the debate's uncertainty (used by agent-scope rewards and calibration)."""
    _check_lam(lam)
    a = check_answers(answers)
    n, t_max = len(a), len(a[0]) - 1
    flips = tuple(sum(row[t] != row[t + 1] for t in range(t_max)) for row in a)
    u_intra = []
    for row in a:
        f_i = sum(row[t] != row[t + 1] for t in range(1, t_max)) / (t_max - 1) if t_max >= 2 else 0.0
        u_intra.append(lam * f_i + (1 - lam) * float(row[0] != row[t_max]))
    u_inter = tuple(
        sum(sum(a[i][t] != a[j][t] for j in range(n) if j != i) / (n - 1) for t in range(t_max + 1))
        / (t_max + 1)
        if n > 1
        else 0.0
        for i in range(n)
    )
    loo = loo_changes(tuple(row[t_max] for row in a))
    return AgentUncertainty(flips=flips, u_intra=tuple(u_intra), u_inter=u_inter, loo=loo)
