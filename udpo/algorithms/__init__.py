"""Policy-optimization algorithms on batches of debates: UDPO (the MAPPO and RMAAC baselines share
the same :class:`Algorithm` interface). See docs/algorithms.md."""

from .base import AgentTurns, Algorithm, RolloutBatch, fill_behavior_logprobs
from .udpo import UDPO, Coefficients, UDPOConfig, compute_rewards

__all__ = [
    "UDPO",
    "AgentTurns",
    "Algorithm",
    "Coefficients",
    "RolloutBatch",
    "UDPOConfig",
    "compute_rewards",
    "fill_behavior_logprobs",
]
