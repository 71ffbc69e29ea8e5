"""Policy-optimization algorithms on batches of debates: UDPO and the MAPPO and RMAAC baselines, all
behind the :class:`Algorithm` interface. See docs/algorithms.md."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from udpo.config.groups import AlgorithmArgs, AlgorithmName, RewardArgs

from .actor_critic import ActorCritic
from .base import (
    Advantages,
    AgentTurns,
    Algorithm,
    Behavior,
    RolloutBatch,
    fill_behavior_logprobs,
    record_behavior,
)
from .mappo import MAPPO
from .rmaac import RMAAC
from .udpo import UDPO, Coefficients, compute_rewards

#: every algorithm a run can name (udpo.config.AlgorithmName), by name; each class declares what it needs
#: (``needs_critic``, an ``adversary_stage``) and builds itself from a run's config (``from_config``)
ALGORITHMS: dict[AlgorithmName, type[Algorithm]] = {cls.name: cls for cls in (UDPO, MAPPO, RMAAC)}


def algorithm_class(name: str) -> type[Algorithm]:
    """The class of algorithm ``name`` (a ValueError naming the choices otherwise)."""
    if name not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; choose {', '.join(ALGORITHMS)}")
    return ALGORITHMS[name]


def build_algorithm(
    algorithm: AlgorithmArgs,
    reward: RewardArgs,
    calibration: dict[str, Any],
    critic=None,
    reward_functions: Sequence = (),
    seed: int = 0,
) -> Algorithm:
    """The algorithm ``algorithm.algorithm`` names, with the run's ``algorithm`` and ``reward`` settings.
    UDPO takes its per-agent coefficients from the ``calibration`` record; MAPPO and RMAAC need the run's
    ``critic``."""
    return algorithm_class(algorithm.algorithm).from_config(
        algorithm, reward, calibration, critic, reward_functions, seed
    )


__all__ = [
    "ALGORITHMS",
    "MAPPO",
    "RMAAC",
    "UDPO",
    "ActorCritic",
    "Advantages",
    "AgentTurns",
    "Algorithm",
    "Behavior",
    "Coefficients",
    "RolloutBatch",
    "algorithm_class",
    "build_algorithm",
    "compute_rewards",
    "fill_behavior_logprobs",
    "record_behavior",
]
