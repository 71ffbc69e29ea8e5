"""Policy-optimization algorithms on batches of debates: UDPO and the MAPPO and RMAAC baselines, all
behind the :class:`Algorithm` interface. See docs/algorithms.md."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .actor_critic import ActorCritic, ActorCriticConfig
from .base import AgentTurns, Algorithm, LossSettings, RolloutBatch, fill_behavior_logprobs
from .mappo import MAPPO
from .rmaac import RMAAC
from .udpo import UDPO, Coefficients, UDPOConfig, compute_rewards


def build_algorithm(
    config, calibration: dict[str, Any], critic=None, reward_functions: Sequence = ()
) -> Algorithm:
    """The algorithm a run's ``config`` (a :class:`udpo.config.TrainConfig`) names. UDPO takes its per-agent
    coefficients from the ``calibration`` record; MAPPO and RMAAC need the run's ``critic``."""
    shared = {
        "clip_eps": config.clip_eps,
        "dual_clip": config.dual_clip,
        "loss_aggregation": config.loss_aggregation,
        "kl_loss": config.kl_loss,
        "is_correction": config.is_correction,
        "is_cap": config.is_cap,
        "baseline": config.baseline,
    }
    if config.advantage_norm != "auto":  # auto: each algorithm's own default
        shared["advantage_norm"] = config.advantage_norm
    if config.algorithm == "udpo":
        return UDPO(
            Coefficients.from_dict(calibration),
            UDPOConfig(**shared, ratio_level=config.ratio_level),
            scope=config.reward_scope,
            functions=reward_functions,
        )
    if critic is None:
        raise ValueError(f"algorithm {config.algorithm} needs a critic")
    settings = ActorCriticConfig(
        **shared,
        eta=config.eta[0] if config.eta else config.eta_base,
        w_consensus=config.w_consensus,
        gamma=config.gae_gamma,
        lam=config.gae_lambda,
    )
    if config.algorithm == "mappo":
        return MAPPO(critic, settings)
    if config.algorithm == "rmaac":
        return RMAAC(critic, settings, budget=config.adversary_budget)
    raise ValueError(f"unknown algorithm {config.algorithm!r}; choose udpo, mappo or rmaac")


__all__ = [
    "MAPPO",
    "RMAAC",
    "UDPO",
    "ActorCritic",
    "ActorCriticConfig",
    "AgentTurns",
    "Algorithm",
    "Coefficients",
    "LossSettings",
    "RolloutBatch",
    "UDPOConfig",
    "build_algorithm",
    "compute_rewards",
    "fill_behavior_logprobs",
]
