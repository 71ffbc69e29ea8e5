"""Test oracle: the uncertainty metrics, reward terms and majority vote of one debate, written to read like
SPEC's formulas (sections 1-4), one Python loop per sum.

The silence rule (SPEC section 1): an unparsed answer (None) differs from every answer, another None
included; :func:`differ` is every comparison of two answers here, and :func:`final_round_spread` counts
each None as an answer class of its own. The vote still skips None (an abstention); its ties go to the
tied answer of smallest ``sha256(f"{key}\n{answer}")`` hex digest, ``key`` the question id (SPEC section 1,
"Majority vote"), written here with its own loop, not the library's digest helper.

The library computes them once, vectorized (:mod:`udpo.rewards.batch`; ``uncertainty``,
``agent_uncertainty``, ``rewards`` and ``majority_vote`` are that path on a batch of one). These
independent formulas are what the batch path is checked against (tests/test_batch_metrics.py), on hand
cases and random matrices; nothing outside tests/ imports them.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import Hashable, Sequence

import numpy as np

from udpo.rewards import AgentUncertainty, Rewards, Uncertainty, check_answers, is_correct


def differ(x: Hashable | None, y: Hashable | None) -> bool:
    """Whether two answers (of two agents, or of one agent in two rounds) differ: always when either is None.
    (A cell is never compared with itself: with T = 0 the revision M is 0.)"""
    return x is None or y is None or x != y


def majority_vote(answers: Sequence[Hashable | None], key: str = "") -> Hashable | None:
    """The most frequent non-None answer; a tie to the tied answer whose sha256 of ``key``, a newline and
    the answer (as text) is the smallest hex string; None when nobody answered."""
    counts: dict[Hashable, int] = {}
    for a in answers:
        if a is not None:
            counts[a] = counts.get(a, 0) + 1
    best, best_count, best_digest = None, 0, ""
    for a, c in counts.items():
        digest = hashlib.sha256((key + "\n" + str(a)).encode("utf-8")).hexdigest()
        if c > best_count or (c == best_count and digest < best_digest):
            best, best_count, best_digest = a, c, digest
    return best


def loo_changes(final: tuple, key: str = "") -> tuple[float, ...]:
    """Per agent: 1.0 if removing it changes the majority vote of ``final``, else 0.0 (all 0 when N = 1)."""
    if len(final) == 1:
        return (0.0,)
    vote = majority_vote(final, key)
    return tuple(float(majority_vote(final[:i] + final[i + 1 :], key) != vote) for i in range(len(final)))


def final_round_spread(final: tuple) -> tuple[float, float]:
    """Normalized entropy H (0 when unanimous, exactly 1 for a uniform split, else capped at 1) and
    disagreement D of the final-round answers (each None a class of its own, of count 1)."""
    n = len(final)
    counts = list(Counter(a for a in final if a is not None).values()) + [1 for a in final if a is None]
    k = len(counts)
    if k == 1:
        entropy = 0.0
    elif min(counts) == max(counts):
        entropy = 1.0
    else:
        entropy = min(1.0, -sum(c / n * math.log(c / n) for c in counts) / math.log(k))
    disagreement = float(max(counts) < n)
    return entropy, disagreement


def uncertainty(answers, lam: float = 0.5, key: str = "") -> Uncertainty:
    """U_intra, U_inter and U_sys (with their parts) of one debate's answer matrix."""
    a = check_answers(answers)
    n, t_max = len(a), len(a[0]) - 1

    flips = sum(differ(a[i][t], a[i][t + 1]) for i in range(n) for t in range(1, t_max))
    flip_rate = flips / (n * (t_max - 1)) if t_max >= 2 else 0.0
    revision_rate = sum(t_max > 0 and differ(a[i][0], a[i][t_max]) for i in range(n)) / n
    u_intra = lam * flip_rate + (1 - lam) * revision_rate

    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    conflict = tuple(
        sum(differ(a[i][t], a[j][t]) for i, j in pairs) / len(pairs) if pairs else 0.0
        for t in range(t_max + 1)
    )
    u_inter = sum(conflict) / (t_max + 1)

    final = tuple(row[t_max] for row in a)
    entropy, disagreement = final_round_spread(final)
    loo_instability = sum(loo_changes(final, key)) / n
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


def agent_uncertainty(answers, lam: float = 0.5, key: str = "") -> AgentUncertainty:
    """Each agent's flips (all transitions), U_intra, U_inter and leave-one-out change."""
    a = check_answers(answers)
    n, t_max = len(a), len(a[0]) - 1
    flips = tuple(sum(differ(row[t], row[t + 1]) for t in range(t_max)) for row in a)
    u_intra = []
    for row in a:
        f_i = sum(differ(row[t], row[t + 1]) for t in range(1, t_max)) / (t_max - 1) if t_max >= 2 else 0.0
        u_intra.append(lam * f_i + (1 - lam) * float(t_max > 0 and differ(row[0], row[t_max])))
    u_inter = tuple(
        sum(sum(differ(a[i][t], a[j][t]) for j in range(n) if j != i) / (n - 1) for t in range(t_max + 1))
        / (t_max + 1)
        if n > 1
        else 0.0
        for i in range(n)
    )
    loo = loo_changes(tuple(row[t_max] for row in a), key)
    return AgentUncertainty(flips=flips, u_intra=tuple(u_intra), u_inter=u_inter, loo=loo)


def rewards(answers, gold, scope: str = "trajectory", match=None, key: str = "") -> Rewards:
    """r_intra, r_inter, r_sys and r_task of one debate (per agent with ``scope="agent"``)."""
    a = check_answers(answers)
    n, t_max = len(a), len(a[0]) - 1
    final = tuple(row[t_max] for row in a)
    r_task = float(is_correct(majority_vote(final, key), gold, match))
    if scope == "trajectory":
        u = uncertainty(a, key=key)
        flips = sum(differ(row[t], row[t + 1]) for row in a for t in range(t_max))
        r_intra = 1.0 - flips / (n * t_max) if t_max > 0 else 1.0
        return Rewards(r_intra=r_intra, r_inter=1.0 - u.u_inter, r_sys=1.0 - u.u_sys, r_task=r_task)
    per_agent = agent_uncertainty(a, key=key)
    entropy, disagreement = final_round_spread(final)
    flips = np.asarray(per_agent.flips, dtype=float)
    return Rewards(
        r_intra=1.0 - flips / t_max if t_max > 0 else np.ones(n),
        r_inter=1.0 - np.asarray(per_agent.u_inter),
        r_sys=1.0 - (entropy + disagreement + np.asarray(per_agent.loo)) / 3,
        r_task=np.full(n, r_task),
    )
