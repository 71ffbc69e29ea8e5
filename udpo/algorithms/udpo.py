"""UDPO: Uncertainty-Driven Policy Optimization (paper section 4.3 and appendix A; docs/algorithms.md).

Names as in the paper, for agent i and debate trajectory tau:

- ``r_intra, r_inter, r_sys``: uncertainty-driven rewards (stable agents, agreement, a confident and
  robust vote); ``r_task``: whether the majority vote is right. ``r_i`` (eq. 4) weighs them with the
  agent-tailored coefficients ``alpha_i, beta_i, gamma_i, lambda_i`` (:class:`Coefficients`).
- ``A_i = r_i - b`` (eq. 9): advantage over the batch-mean baseline (or the mean over the debates of
  the same question, ``baseline="group"``).
- ``rho_i = exp(logp_i^theta - logp_i^behavior)`` (eq. 5): the trajectory-level ratio over all of agent
  i's generated tokens in the debate. The paper writes the reference policy in the denominator; we
  use the policy that sampled the debate, which keeps the ratio an importance weight.
- ``l_clip = min(rho A, clip(rho, 1-eps, 1+eps) A)`` (eq. 7), dual-clipped for ``A < 0``: ``max(l_clip, c A)``
  (docs/algorithms.md, "The objective"; stale replayed samples). ``l_anchor`` (eq. 8): the per-token KL loss
  (``kl_loss``: ``exp(r) - r - 1``, whose value estimates KL(pi_theta || pi_ref) and whose gradient is that of
  KL(pi_ref || pi_theta), or ``r^2 / 2``; ``r = logp_ref - logp_theta``), on the ratio's scale: summed over
  agent i's tokens of the debate (the KL of trajectory distributions) beside a trajectory ratio, averaged over
  them beside per-token ratios (``loss_aggregation`` may choose either for both terms). ``eta_i``: the agent's
  anchoring weight.
- Every log-prob is of the sampling distribution: log-softmax of logits / temperature.
- Objective (eq. 6): ``mean_tau[w(tau) l_clip] - eta_i mean_tau[l_anchor]``, with replay importance
  weights ``w`` (1 for fresh debates). The loss is its negative.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from udpo.algorithms.reward_functions import RewardFunction
from udpo.algorithms.transfer import to_device
from udpo.config.groups import ABLATIONS, AlgorithmArgs, RewardArgs
from udpo.env.trajectory import Trajectory
from udpo.rewards import Calibration, agent_rewards, coin_rewards, debate_metrics

from .base import (
    Advantages,
    Algorithm,
    Behavior,
    RolloutBatch,
    aggregate,
    checked_settings,
    clipped_surrogate,
    correction_weights,
    debate_sum,
    kl_estimate,
    loss_metrics,
    normalize_advantages,
    ratio,
)


@dataclass(frozen=True)
class Coefficients:
    """Per-agent reward weights ``alpha, beta, gamma, lambda_`` (eq. 4) and anchoring weights ``eta`` (eq. 6).

    Each is a tuple of N non-negative floats. Build with :meth:`uniform`, :meth:`from_calibration` (warm-up
    calibration, docs/metrics.md, "Agent-tailored coefficients") or explicitly; :meth:`without` applies
    ablations.
    """

    alpha: tuple[float, ...]
    beta: tuple[float, ...]
    gamma: tuple[float, ...]
    lambda_: tuple[float, ...]
    eta: tuple[float, ...]

    def __post_init__(self) -> None:
        names = ("alpha", "beta", "gamma", "lambda_", "eta")
        for name in names:
            values = tuple(float(v) for v in np.atleast_1d(np.asarray(getattr(self, name), dtype=float)))
            bad = [v for v in values if not math.isfinite(v) or v < 0]
            if bad:
                raise ValueError(f"coefficient {name} must be finite and >= 0, got {list(values)}")
            object.__setattr__(self, name, values)
        lengths = {name: len(getattr(self, name)) for name in names}
        if len(set(lengths.values())) != 1:
            raise ValueError(f"coefficients need one value per agent for every name, got lengths {lengths}")

    @property
    def n_agents(self) -> int:
        return len(self.alpha)

    @classmethod
    def uniform(
        cls,
        n_agents: int,
        alpha: float = 1 / 3,
        beta: float = 1 / 3,
        gamma: float = 1 / 3,
        lambda_: float = 1.0,
        eta: float = 0.01,
    ) -> Coefficients:
        """The same coefficients for every agent (defaults: the base values of docs/metrics.md without
        calibration)."""
        return cls(*((v,) * n_agents for v in (alpha, beta, gamma, lambda_, eta)))

    @classmethod
    def from_calibration(cls, calibration: Calibration) -> Coefficients:
        """The agent-tailored coefficients of :func:`udpo.rewards.calibrate`."""
        c = calibration
        return cls(*(tuple(map(float, v)) for v in (c.alpha, c.beta, c.gamma, c.lambda_, c.eta)))

    @classmethod
    def from_dict(cls, d: Mapping) -> Coefficients:
        """From :meth:`to_dict` output or the ``coefficients`` block of ``Calibration.to_dict()``
        (``lambda`` is accepted for ``lambda_``)."""
        d = dict(d.get("coefficients", d))
        if "lambda" in d:
            d["lambda_"] = d.pop("lambda")
        missing = [k for k in ("alpha", "beta", "gamma", "lambda_", "eta") if k not in d]
        if missing:
            raise ValueError(f"coefficients are missing {', '.join(missing)} (got keys {sorted(d)})")
        return cls(d["alpha"], d["beta"], d["gamma"], d["lambda_"], d["eta"])

    def without(self, *ablations: str) -> Coefficients:
        """Ablations "intra", "inter", "sys": zero alpha, beta or gamma for every agent."""
        unknown = [a for a in ablations if a not in ABLATIONS]
        if unknown:
            raise ValueError(f"unknown ablation(s) {unknown}; choose from {sorted(ABLATIONS)}")
        return replace(self, **{ABLATIONS[a]: (0.0,) * self.n_agents for a in ablations})

    def to_dict(self) -> dict[str, list[float]]:
        return {k: list(getattr(self, k)) for k in ("alpha", "beta", "gamma", "lambda_", "eta")}


def task_rewards(trajectories: Sequence[Trajectory], kind: str = "correct", seed: int = 0) -> np.ndarray:
    """``r_task`` of each debate, [M]: ``correct``: whether its vote is right (the trajectory's ``correct``,
    judged by its task); ``coin``: :func:`udpo.rewards.coin_rewards` of the run's ``seed``, which ignores
    every answer (a learning check's negative control)."""
    if kind == "coin":
        return coin_rewards([t.question_id for t in trajectories], seed)
    if kind != "correct":
        raise ValueError(f"task_reward must be 'correct' or 'coin', got {kind!r}")
    return np.array([float(t.correct) for t in trajectories])


def compute_rewards(
    trajectories: Sequence[Trajectory],
    coefficients: Coefficients,
    scope: Literal["trajectory", "agent"] = "trajectory",
    functions: Sequence[RewardFunction] = (),
    task_reward: str = "correct",
    seed: int = 0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Eq. 4 for every agent of every debate: ``r_i = alpha_i r_intra + beta_i r_inter + gamma_i r_sys
    + lambda_i r_task``, plus ``w_k f_k(tau, i)`` for each user reward function (udpo.algorithms.reward_functions).

    Returns rewards [M, N] and the terms ``r_intra, r_inter, r_sys`` ([M], or [M, N] with
    ``scope="agent"``), ``r_task`` ([M]: :func:`task_rewards` of ``task_reward`` and ``seed``) and each
    function's unweighted values ([M, N], under its ``module:function`` name).
    """
    if not trajectories:
        raise ValueError("compute_rewards needs at least one trajectory")
    n = coefficients.n_agents
    for k, t in enumerate(trajectories):
        if t.n_agents != n:
            raise ValueError(
                f"trajectory {k} (question {t.question_id}) has {t.n_agents} agents; coefficients have {n}"
            )
    metrics = debate_metrics([t.answers for t in trajectories], keys=[t.question_id for t in trajectories])
    metrics = replace(metrics, r_task=task_rewards(trajectories, task_reward, seed))
    c = coefficients
    r = agent_rewards(metrics, c.alpha, c.beta, c.gamma, c.lambda_, scope=scope)
    prefix = "agent_" if scope == "agent" else ""
    terms = {name: getattr(metrics, prefix + name) for name in ("r_intra", "r_inter", "r_sys")}
    terms["r_task"] = metrics.r_task
    for f in functions:
        terms[f.name] = f.scores(trajectories, n)
        r = r + f.weight * terms[f.name]

    def as_tensor(x):
        return torch.as_tensor(np.asarray(x, dtype=np.float32))

    return as_tensor(r), {name: as_tensor(v) for name, v in terms.items()}


class UDPO(Algorithm):
    """The UDPO objective with agent-tailored coefficients (set ``coefficients`` after calibration).
    settings: the run's algorithm settings (default: the config's defaults), of which UDPO reads the loss
    settings every algorithm shares, ``ratio_level`` ("trajectory": eq. 5, one ratio per agent and debate;
    "token": PPO-style per-token ratios) and ``baseline`` ("batch": the mean of r_i over the batch, eq. 9;
    "group": its mean over the debates of the same question, a lone debate getting A = 0). scope,
    functions, task_reward, seed: of the rewards (:func:`compute_rewards`)."""

    name = "udpo"

    def __init__(
        self,
        coefficients: Coefficients,
        settings: AlgorithmArgs | None = None,
        scope: Literal["trajectory", "agent"] = "trajectory",
        functions: Sequence[RewardFunction] = (),
        task_reward: str = "correct",
        seed: int = 0,
    ):
        self.coefficients = coefficients
        self.settings = checked_settings(settings, self.name)
        self.scope, self.functions = scope, list(functions)
        self.task_reward, self.seed = task_reward, seed

    @classmethod
    def from_config(
        cls,
        algorithm: AlgorithmArgs,
        reward: RewardArgs,
        calibration: dict[str, Any],
        critic=None,
        reward_functions: Sequence = (),
        seed: int = 0,
    ) -> UDPO:
        """Per-agent coefficients from the ``calibration`` record; no critic."""
        return cls(
            Coefficients.from_dict(calibration),
            algorithm,
            scope=reward.reward_scope,
            functions=reward_functions,
            task_reward=reward.task_reward,
            seed=seed,
        )

    def rewards(self, trajectories: Sequence[Trajectory]) -> tuple[Tensor, dict[str, Tensor]]:
        return compute_rewards(
            trajectories, self.coefficients, self.scope, self.functions, self.task_reward, self.seed
        )

    def reward_parts(self, batch: RolloutBatch) -> dict[str, Tensor]:
        """Eq. 4's terms with their per-agent weights (``alpha_i r_intra``, ..., ``lambda_i r_task``) and each
        user term's ``w_k f_k``, [M, N] each."""
        c, n = self.coefficients, batch.n_agents
        weights = {"r_intra": c.alpha, "r_inter": c.beta, "r_sys": c.gamma, "r_task": c.lambda_}
        weights.update({f.name: (f.weight,) * n for f in self.functions})
        out = {}
        for name, w in weights.items():
            term = batch.terms[name]
            out[name] = (term if term.dim() == 2 else term[:, None]) * torch.tensor(w, dtype=term.dtype)
        return out

    def advantages(self, batch: RolloutBatch) -> Advantages:
        r = batch.rewards  # r_i(tau_m), eq. 4: [M, N]
        b = group_mean(r, batch.group_ids) if self.settings.baseline == "group" else r.mean(0, keepdim=True)
        # eq. 9, then the option's scaling
        return Advantages(normalize_advantages(r - b, self.settings.resolved_advantage_norm))

    def needs_reference(self, agent: int) -> bool:
        return self.coefficients.eta[agent] > 0

    def loss(
        self,
        batch: RolloutBatch,
        agent: int,
        logp: list[Tensor],
        behavior: Behavior,
        ref_logp: list[Tensor] | None,
        advantages: Tensor,
    ) -> tuple[Tensor, dict[str, float]]:
        cfg = self.settings
        eps, c, eta = cfg.clip_eps, cfg.dual_clip, self.coefficients.eta[agent]
        aggregation = cfg.resolved_loss_aggregation
        _check_inputs(agent, logp, behavior, ref_logp, need_reference=eta > 0)
        # eq. 9: A_i(tau) = r_i(tau) - b, [M]
        A = advantages.to(logp[0].device)
        trajectory = cfg.ratio_level == "trajectory"
        # sampler/trainer importance weights: one per debate beside a trajectory ratio, else per token
        w_is, is_info = correction_weights(
            behavior, cfg.is_correction, cfg.is_cap, not trajectory, logp[0].device
        )
        if trajectory:
            # eq. 5: rho_i = exp(log pi_theta(tau) - log pi_behavior(tau)), all of agent i's tokens, [M]
            rho = ratio(debate_sum(logp), debate_sum(behavior.logprobs))
            # eq. 7, dual-clipped where A < 0, [M]; "mean" aggregation divides by the agent's token count
            l_clip = clipped_surrogate(rho, A, eps, c) * torch.stack(w_is)
            if aggregation == "mean":
                l_clip = l_clip / to_device(torch.tensor([max(lp.numel(), 1) for lp in logp]), A.device)
        else:
            # per-token ratios; eq. 7 per token, summed or averaged over agent i's tokens of each debate, [M]
            rho = [ratio(lp, b) for lp, b in zip(logp, behavior.logprobs, strict=True)]
            l_clip = aggregate(
                [clipped_surrogate(r, a, eps, c) * w for r, a, w in zip(rho, A, w_is, strict=True)],
                aggregation,
            )
        # eq. 8: l_anchor, the per-token KL loss summed over the debate's tokens (the KL of trajectory
        # distributions, on the trajectory ratio's scale) or averaged over them, [M]
        if eta > 0 and ref_logp is not None:  # given whenever eta > 0 (checked above)
            l_anchor = aggregate(
                [kl_estimate(lp, ref, cfg.kl_loss) for lp, ref in zip(logp, ref_logp, strict=True)],
                aggregation,
            )
        else:
            l_anchor = torch.zeros_like(A)
        # eq. 6: replay-weighted clipped surrogate minus eta_i times the anchor
        objective = (to_device(batch.weights, A.device) * l_clip).mean() - eta * l_anchor.mean()
        loss = -objective
        return loss, {**loss_metrics(rho, A, l_clip, l_anchor, loss, eps, c), **is_info}


def group_mean(r: Tensor, group_ids: Sequence[str]) -> Tensor:
    """Each row's mean over the rows with the same group id (same shape as ``r``)."""
    keys = {g: k for k, g in enumerate(dict.fromkeys(group_ids))}
    idx = torch.tensor([keys[g] for g in group_ids], device=r.device)
    sums = torch.zeros(len(keys), *r.shape[1:], dtype=r.dtype, device=r.device).index_add_(0, idx, r)
    counts = torch.bincount(idx, minlength=len(keys)).to(r.dtype).reshape(-1, *[1] * (r.dim() - 1))
    return (sums / counts)[idx]


def _check_inputs(
    agent: int, logp: list[Tensor], behavior: Behavior, ref_logp: list[Tensor] | None, need_reference: bool
) -> None:
    """Check that the given lists cover the tokens of ``agent``'s behavior log-probs."""
    if need_reference and ref_logp is None:
        raise ValueError(f"agent {agent} has eta > 0: the loss needs reference log-probs")
    given = [("log-probs", logp)] + (
        [("reference log-probs", ref_logp)] if need_reference and ref_logp is not None else []
    )
    for name, values in given:
        if len(values) != len(behavior.logprobs):
            raise ValueError(f"got {name} for {len(values)} debates, the batch has {len(behavior.logprobs)}")
        for m, (lp, b) in enumerate(zip(values, behavior.logprobs, strict=True)):
            if lp.shape != b.shape:
                raise ValueError(
                    f"debate {m}: {lp.numel()} {name} for agent {agent}'s {b.numel()} generated tokens "
                    "(compute them from batch.agent_sequences(agent) and batch.per_debate)"
                )
