"""What the MAPPO and RMAAC baselines share (docs/algorithms.md, "The baselines: MAPPO and RMAAC"): a team
reward, a critic, GAE over rounds, a per-token clipped surrogate with each round's advantage, and a
squared-error value loss.

Names, for debate m, agent i and the rounds r = 0..K-1 the agent spoke in:

- ``R = r_task + w_consensus (1 - C_T)``: the team reward, shared by every agent; ``C_T`` is the pairwise
  conflict of the final answers (docs/metrics.md, "Inter-agent uncertainty"), so ``1 - C_T`` rewards the
  consensus MAPPO is adapted to optimize. It arrives after the last round: ``r_r = R`` for r = K-1 and 0
  before.
- ``s_r``: the state before round r, the question and the answers after round r-1 (the question alone
  for r = 0), as text (:func:`udpo.env.protocols.adversary.critic_state`). MAPPO's is the same for every
  agent (centralized); RMAAC's is what agent i observed, the adversary's swap included.
- ``V(s_r)``: the critic (:class:`udpo.algorithms.critic.Critic`), scored before the update.
- GAE (Schulman et al. 2016) over rounds: ``delta_r = r_r + gamma V(s_{r+1}) - V(s_r)`` with
  ``V(s_K) = 0``; ``A_r = sum_l (gamma lambda)^l delta_{r+l}``; value targets ``G_r = A_r + V(s_r)``.
  Advantages are then normalized over the batch (mean 0, std 1), as MAPPO does (``advantage_norm``).
  ``baseline: group`` puts the mean team reward of the question's debates in place of ``V(s_0)``.
- Actor loss of agent i: per token, ``min(rho A_r, clip(rho, 1-eps, 1+eps) A_r)`` (dual-clipped for
  ``A_r < 0``) with ``rho`` the token's ratio and ``A_r`` its round's advantage, averaged over the agent's
  tokens of each debate (or summed: ``loss_aggregation``), then over debates; minus ``eta`` times the
  per-token KL loss to the reference (the same anchor UDPO uses at ``ratio_level: token``). The loss is
  the negative.
- Critic loss: ``mean (V(s_r) - G_r)^2`` over the states of the debates, with gradients to the critic only.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from udpo.config.groups import AlgorithmArgs, RewardArgs
from udpo.env.trajectory import Trajectory

if TYPE_CHECKING:
    from udpo.algorithms.critic import Critic
from udpo.algorithms.transfer import host_floats, to_device
from udpo.rewards import debate_metrics

from .base import (
    Advantages,
    Algorithm,
    Behavior,
    RolloutBatch,
    aggregate,
    checked_settings,
    clipped_surrogate,
    correction_weights,
    kl_estimate,
    loss_metrics,
    normalize_advantages,
    ratio,
)
from .udpo import group_mean


def team_rewards(trajectories: Sequence[Trajectory], w_consensus: float) -> tuple[Tensor, dict[str, Tensor]]:
    """``R = r_task + w_consensus (1 - C_T)`` per debate [M], and the terms (``r_task``, ``consensus`` =
    ``1 - C_T``, and UDPO's ``r_intra``, ``r_inter``, ``r_sys`` for logging beside it)."""
    metrics = debate_metrics([t.answers for t in trajectories], keys=[t.question_id for t in trajectories])
    final_conflict = np.array([row[np.isfinite(row)][-1] for row in metrics.conflict])
    r_task = np.array([float(t.correct) for t in trajectories])
    consensus = 1.0 - final_conflict
    terms = {
        "r_task": r_task,
        "consensus": consensus,
        "r_intra": metrics.r_intra,
        "r_inter": metrics.r_inter,
        "r_sys": metrics.r_sys,
    }
    as_tensor = lambda x: torch.as_tensor(np.asarray(x, dtype=np.float32))  # noqa: E731
    return as_tensor(r_task + w_consensus * consensus), {k: as_tensor(v) for k, v in terms.items()}


def gae(values: Tensor, reward: Tensor, gamma: float, lam: float) -> tuple[Tensor, Tensor]:
    """GAE over K rounds with the reward at the last one: ``values`` [..., K], ``reward`` [...].

    Returns (advantages, value targets), both [..., K]."""
    k = values.shape[-1]
    advantages = torch.zeros_like(values)
    running = torch.zeros_like(reward)
    next_value = torch.zeros_like(reward)  # V(s_K) = 0: the debate has ended
    for r in reversed(range(k)):
        step_reward = reward if r == k - 1 else torch.zeros_like(reward)
        delta = step_reward + gamma * next_value - values[..., r]
        running = delta + gamma * lam * running
        advantages[..., r] = running
        next_value = values[..., r]
    return advantages, advantages + values


def per_token(advantages: Tensor, lengths: Sequence[int]) -> Tensor:
    """Each round's advantage repeated over that round's ``lengths[r]`` tokens."""
    return advantages[: len(lengths)].repeat_interleave(
        torch.as_tensor(list(lengths), device=advantages.device)
    )


class ActorCritic(Algorithm):
    """MAPPO-style actor-critic on debates; subclasses say what state each agent's critic value uses.

    settings: the run's algorithm settings (default: the config's defaults for this algorithm), of which
    the actor-critic reads the loss settings every algorithm shares (advantages normalized over the batch
    by ``auto``, as MAPPO does; ``loss_aggregation`` ``auto`` is "mean"), ``w_consensus`` (the weight of
    ``1 - C_T`` in the team reward), ``gae_gamma`` and ``gae_lambda`` (GAE's discount and lambda over
    rounds) and ``baseline`` ("batch": the critic's values alone; "group": the value of a debate's first
    state, the question alone, is the mean team reward of the debates of its question instead of the
    critic's). eta: the weight of the per-token KL anchor (0: none).

    ``advantages`` returns [M, N, K] (K: the most rounds an agent spoke; rounds it did not speak are 0) with
    the value targets :meth:`critic_loss` regresses on and the critic's explained variance."""

    needs_critic = True
    critic: Critic

    def __init__(self, critic, settings: AlgorithmArgs | None = None, eta: float = 0.01):
        if eta < 0:
            raise ValueError(f"eta must be >= 0, got {eta}")
        self.critic = critic
        self.settings = checked_settings(settings, self.name)
        self.eta = eta

    @classmethod
    def from_config(
        cls,
        algorithm: AlgorithmArgs,
        reward: RewardArgs,
        calibration: dict[str, Any] | None = None,
        critic=None,
        reward_functions: Sequence = (),
        seed: int = 0,
    ) -> ActorCritic:
        """The run's ``critic`` and its settings; one KL weight (``eta[0]`` or ``eta_base``)."""
        if critic is None:
            raise ValueError(f"algorithm {cls.name} needs a critic")
        return cls(critic, algorithm, eta=reward.eta[0] if reward.eta else reward.eta_base)

    @abc.abstractmethod
    def states(self, trajectory: Trajectory, agent: int) -> list[str]:
        """The state before each of ``agent``'s rounds in ``trajectory``, as critic text."""

    def rewards(self, trajectories: Sequence[Trajectory]) -> tuple[Tensor, dict[str, Tensor]]:
        team, terms = team_rewards(trajectories, self.settings.w_consensus)
        n = trajectories[0].n_agents
        return team[:, None].expand(-1, n).contiguous(), terms

    def reward_parts(self, batch: RolloutBatch) -> dict[str, Tensor]:
        """The team reward's two terms, ``r_task`` and ``w_consensus (1 - C_T)``, the same for every agent."""
        n = batch.n_agents
        parts = {
            "r_task": batch.terms["r_task"],
            "consensus": self.settings.w_consensus * batch.terms["consensus"],
        }
        return {name: v[:, None].expand(-1, n) for name, v in parts.items()}

    def needs_reference(self, agent: int) -> bool:
        return self.eta > 0

    @torch.no_grad()
    def advantages(self, batch: RolloutBatch) -> Advantages:
        m, n = len(batch), batch.n_agents
        states = [[self.states(t, i) for i in range(n)] for t in batch.trajectories]
        k = max(len(s) for row in states for s in row)
        unique = list(dict.fromkeys(s for row in states for per_agent in row for s in per_agent))
        scored = dict(zip(unique, self.critic.values(unique).float().cpu().tolist(), strict=True))
        mask = torch.zeros(m, n, k, dtype=torch.bool)
        raw = torch.zeros(m, n, k)
        targets = torch.zeros(m, n, k)
        values = torch.zeros(m, n, k)
        # baseline "group": the first state's value is the mean team reward of the question's debates
        cfg = self.settings
        first = group_mean(batch.rewards, batch.group_ids) if cfg.baseline == "group" else None
        for d in range(m):
            for i in range(n):
                s = states[d][i]
                v = torch.tensor([scored[x] for x in s])
                values[d, i, : len(s)] = v
                if first is not None:
                    v[0] = first[d, i]
                a, g = gae(v, batch.rewards[d, i], cfg.gae_gamma, cfg.gae_lambda)
                raw[d, i, : len(s)], targets[d, i, : len(s)] = a, g
                mask[d, i, : len(s)] = True
        critic_targets = [
            list(
                dict.fromkeys(  # a centralized state shared by the agents is one regression target
                    (states[d][i][r], float(targets[d, i, r]))
                    for i in range(n)
                    for r in range(len(states[d][i]))
                )
            )
            for d in range(m)
        ]
        return Advantages(
            normalize_advantages(raw, cfg.resolved_advantage_norm, mask),
            critic_targets,
            explained_variance(values[mask], targets[mask]),
        )

    def batch_metrics(self, batch: RolloutBatch, advantages: Advantages) -> dict[str, float]:
        """The shared statistics and ``critic/explained_variance`` (before this batch's update)."""
        return {
            **super().batch_metrics(batch, advantages),
            "critic/explained_variance": advantages.explained_variance,
        }

    def loss(
        self,
        batch: RolloutBatch,
        agent: int,
        logp: list[Tensor],
        behavior: Behavior,
        ref_logp: list[Tensor] | None,
        advantages: Tensor,
    ) -> tuple[Tensor, dict[str, float]]:
        cfg, aggregation = self.settings, self.settings.resolved_loss_aggregation
        if self.eta > 0 and ref_logp is None:
            raise ValueError(f"agent {agent}: the loss needs reference log-probs (eta > 0)")
        # each token gets its round's advantage A_r, [tokens] per debate
        A = [
            per_token(advantages[d].to(logp[0].device), [len(c) for c in row[agent].completion_ids])
            for d, row in enumerate(batch.turns)
        ]
        rho = [ratio(lp, b) for lp, b in zip(logp, behavior.logprobs, strict=True)]
        w_is, is_info = correction_weights(behavior, cfg.is_correction, cfg.is_cap, True, logp[0].device)
        l_clip = aggregate(
            [
                clipped_surrogate(r, a, cfg.clip_eps, cfg.dual_clip) * w
                for r, a, w in zip(rho, A, w_is, strict=True)
            ],
            aggregation,
        )
        l_anchor = (
            aggregate(
                [kl_estimate(lp, ref, cfg.kl_loss) for lp, ref in zip(logp, ref_logp, strict=True)],
                aggregation,
            )
            if self.eta > 0 and ref_logp is not None  # given whenever eta > 0 (checked above)
            else torch.zeros_like(l_clip)
        )
        objective = (to_device(batch.weights, l_clip.device) * l_clip).mean() - self.eta * l_anchor.mean()
        loss = -objective
        return loss, {**loss_metrics(rho, A, l_clip, l_anchor, loss, cfg.clip_eps, cfg.dual_clip), **is_info}

    def critic_loss(self, targets: Sequence[tuple[str, float]]) -> tuple[Tensor, dict[str, float]]:
        """``mean (V(s) - G)^2`` over the (state, G) pairs ``targets`` (:meth:`Advantages.targets_of` of
        what :meth:`advantages` returned), with gradients to the critic."""
        if not targets:
            raise ValueError("no value targets: give critic_loss the targets advantages() returned")
        v = self.critic.values([s for s, _ in targets], grad=True)
        g = to_device(torch.tensor([t for _, t in targets]), v.device)
        loss = ((v - g) ** 2).mean()
        return loss, host_floats({"value_loss": loss, "value_mean": v.mean(), "return_mean": g.mean()})


def explained_variance(values: Tensor, targets: Tensor) -> float:
    """``1 - Var(G - V) / Var(G)``: 1 for a perfect critic, 0 for a constant one, NaN when the targets do
    not vary."""
    var = targets.var(unbiased=False) if targets.numel() else torch.tensor(0.0)
    if var <= 0:
        return float("nan")
    return float(1 - (targets - values).var(unbiased=False) / var)


def previous_answers(trajectory: Trajectory, rnd: int) -> list | None:
    """Every agent's answer after round ``rnd - 1`` (None before round 0)."""
    return None if rnd == 0 else [row[rnd - 1] for row in trajectory.answers]
