"""Static and random communication topologies: each speaker reads some peers' latest responses.

- full (Standard MAD, Du et al.): every agent reads every other agent.
- sparse with degree D (Li et al.; the DIGRA paper's ``MAD(D)``): agent i reads its next
  ``d = round(D (N - 1))`` agents around a ring (i+1, ..., i+d mod N), at least one; D = 1 is full.
- random (the DIGRA paper's ``MAD(random)``): each round each agent reads k peers, k uniform in
  1..N-1, the peers uniform among the others; drawn from (seed, question id, round, agent), so the
  same seed gives the same topology however debates are batched.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

from ..seeds import derived_seed
from .base import DebateState, Stage


class Topology(Stage):
    """A stage that shows each speaker the latest responses of the peers ``peers`` names."""

    selects = True

    def peers(self, state: DebateState, agent: int, rnd: int) -> list[int]:
        raise NotImplementedError

    def select(self, states: Sequence[DebateState], rnd: int) -> None:
        for state in states:
            for i in state.speakers():
                state.reads[i] = [state.latest(j) for j in self.peers(state, i, rnd)]


class FullTopology(Topology):
    """Every agent reads every other agent (Standard MAD)."""

    name = "standard"

    def peers(self, state: DebateState, agent: int, rnd: int) -> list[int]:
        return [j for j in range(state.n_agents) if j != agent]


class SparseTopology(Topology):
    """Agent i reads the ``d = round(degree * (N - 1))`` agents after it on a ring (at least one)."""

    name = "sparse"

    def __init__(self, degree: float = 0.5):
        if not 0 < degree <= 1:
            raise ValueError(f"sparse topology degree D must be in (0, 1], got {degree}")
        self.degree = degree

    def peers(self, state: DebateState, agent: int, rnd: int) -> list[int]:
        n = state.n_agents
        d = min(n - 1, max(1, math.floor(self.degree * (n - 1) + 0.5)))
        return [(agent + k) % n for k in range(1, d + 1)] if n > 1 else []

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "degree": self.degree}


class RandomTopology(Topology):
    """Each round, agent i reads k random peers, k uniform in 1..N-1 (seeded per question, round, agent)."""

    name = "random"

    def __init__(self, seed: int = 0):
        self.seed = seed

    def peers(self, state: DebateState, agent: int, rnd: int) -> list[int]:
        others = [j for j in range(state.n_agents) if j != agent]
        if not others:
            return []
        rng = random.Random(derived_seed(self.seed, "random-topology", state.question.id, rnd, agent))
        return sorted(rng.sample(others, rng.randint(1, len(others))))

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "seed": self.seed}
