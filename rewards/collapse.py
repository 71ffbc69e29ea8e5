"""Agents that stop answering: the share of a team's agents whose answers an evaluation could mostly not
parse (the collapse that a reward paying for silence once taught, docs/lab/results.md)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

#: an agent has collapsed when more than this share of its answers over an evaluation is unparsed
COLLAPSE_THRESHOLD = 0.5


def agent_unparsed_rates(answer_matrices: Sequence[Sequence[Sequence[object]]]) -> np.ndarray:
    """[N]: each agent's share of unparsed (``None``) answers over every round of every debate."""
    if not answer_matrices:
        raise ValueError("agent_unparsed_rates needs at least one debate")
    n_agents = {len(a) for a in answer_matrices}
    if len(n_agents) != 1:
        raise ValueError(f"every debate needs the same number of agents, got {sorted(n_agents)}")
    silent = np.zeros(n_agents.pop())
    turns = np.zeros_like(silent)
    for answers in answer_matrices:
        for i, row in enumerate(answers):
            silent[i] += sum(a is None for a in row)
            turns[i] += len(row)
    return silent / np.maximum(turns, 1)


def collapse_rate(
    answer_matrices: Sequence[Sequence[Sequence[object]]], threshold: float = COLLAPSE_THRESHOLD
) -> float:
    """Share of agents whose unparsed rate over ``answer_matrices`` (one evaluation's debates) exceeds
    ``threshold``."""
    return float(np.mean(agent_unparsed_rates(answer_matrices) > threshold))
