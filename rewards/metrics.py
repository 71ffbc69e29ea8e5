"""Three-level uncertainty of one debate (docs/metrics.md, "Formulas as implemented" and "Agent-tailored
coefficients"): the definitions, and the one-debate view of the one implementation.

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

The consensus-on-wrong guard (agreement must not be bought with correctness), from the final
round and whether the debate's vote is right: ``majority`` is 1 when more than half of the agents give
the same answer and the vote (then that answer) is wrong, ``unanimous`` when every agent gives it.

:func:`uncertainty` and :func:`agent_uncertainty` are :mod:`udpo.rewards.batch` on a batch of one (the
one implementation, vectorized); the formulas above written out one debate at a time are the tests'
oracle (tests/reference_metrics.py).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass

from .batch import one_debate
from .coding import AnswerMatrix, check_answers


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


def uncertainty(answers: AnswerMatrix, lam: float = 0.5, key: str = "") -> Uncertainty:
    """U_intra, U_inter and U_sys (with their parts) of one debate's answer matrix; ``key``: its question
    id, the key of the votes behind L."""
    m = one_debate(answers, lam=lam, key=key)
    return Uncertainty(
        flip_rate=float(m.flip_rate[0]),
        revision_rate=float(m.revision_rate[0]),
        u_intra=float(m.u_intra[0]),
        conflict=tuple(m.conflict[0].tolist()),
        u_inter=float(m.u_inter[0]),
        entropy=float(m.entropy[0]),
        disagreement=float(m.disagreement[0]),
        loo_instability=float(m.loo_instability[0]),
        u_sys=float(m.u_sys[0]),
    )


def agent_uncertainty(answers: AnswerMatrix, lam: float = 0.5, key: str = "") -> AgentUncertainty:
    """Each agent's share of the debate's uncertainty (used by agent-scope rewards and calibration);
    ``key``: its question id, the key of the votes behind L_i."""
    m = one_debate(answers, lam=lam, key=key)
    return AgentUncertainty(
        flips=tuple(m.agent_flips[0].tolist()),
        u_intra=tuple(m.agent_u_intra[0].tolist()),
        u_inter=tuple(m.agent_u_inter[0].tolist()),
        loo=tuple(m.agent_loo[0].tolist()),
    )
