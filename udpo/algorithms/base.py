"""What every policy-optimization algorithm sees: a batch of debates, and the methods to fill in.

A :class:`RolloutBatch` holds M debate trajectories, each agent's generated turns as stored token ids
(with the behavior log-probs known when the batch was built), each agent's reward ``r_i`` per debate
and the reward terms behind it. An :class:`Algorithm` (UDPO, and the MAPPO and RMAAC baselines) turns
rewards into :class:`Advantages` (a critic's value targets with them) and, per agent, log-probs into a
loss against the sampling policy's numbers it is given (:class:`Behavior`); rollouts, the policy,
logging and evaluation are shared. Nothing here writes into the batch or its trajectories: the update
passes what it measures to the loss and returns it, and the loop records it (:func:`record_behavior`).

Shared math, named once here:

- ``rho = exp(logp_theta - logp_behavior)``: importance ratio of the current policy to the one that
  sampled the tokens (log-ratios are clamped to +-``LOG_RATIO_CLAMP`` so exp never overflows).
- ``min(rho A, clip(rho, 1 - eps, 1 + eps) A)``: the PPO clipped surrogate; with dual clipping (Ye et al.
  2020) ``max(that, c A)`` where ``A < 0``, so a stale sample with a huge ``rho`` cannot multiply a
  negative advantage's gradient without bound.
- KL losses with ``r = logp_ref - logp_theta`` on tokens sampled from pi_theta (docs/algorithms.md, "The
  objective"), per token: ``k3 = exp(r) - r - 1`` (Schulman's "k3", GRPO's loss) is non-negative and its
  *value* is an unbiased estimate of KL(pi_theta || pi_ref); differentiated as a loss, its expected gradient
  is that of KL(pi_ref || pi_theta), the forward KL. ``k2 = r^2 / 2`` has in expectation the gradient of
  KL(pi_theta || pi_ref). ``tests/test_objective.py`` checks both against the exact gradients.
- Truncated importance sampling against sampler/trainer mismatch (docs/algorithms.md, "Sampler/trainer
  mismatch"): a rollout engine's log-probs differ from the trainer's, so the samples follow the engine while
  the ratio's denominator is the trainer's; each sample's surrogate is weighted by ``min(exp(logp_trainer -
  logp_engine), C)`` (per token, or per debate beside a trajectory ratio), or a debate whose ratio leaves
  ``[1/C, C]`` is dropped (:func:`correction_weights`).
"""

from __future__ import annotations

import abc
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar, get_args

import torch
from torch import Tensor

from udpo.algorithms.transfer import host_floats, to_device
from udpo.config.groups import AdvantageNorm, AlgorithmArgs, AlgorithmName, KLLoss, RewardArgs
from udpo.env.trajectory import Trajectory, Turn

if TYPE_CHECKING:
    from udpo.algorithms.critic import Critic

LOG_RATIO_CLAMP = 20.0


#: (debate, agent, round) -> the trainer's log-probs of that turn's tokens under the sampling policy:
#: what the update measures and :func:`fill_behavior_logprobs` computes, recorded by :func:`record_behavior`
TrainerLogprobs = dict[tuple[int, int, int], list[float]]


@dataclass
class AgentTurns:
    """One agent's turns in one debate, one entry per round it spoke (token ids as generated)."""

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    #: per round, the ratio's denominator as recorded when the batch was built: the trainer's log-probs
    #: where it computed them, else the engine's (:attr:`udpo.env.trajectory.Turn.behavior_logprobs`)
    behavior_logprobs: list[list[float]]
    #: the log-probs the rollout engine recorded, all rounds concatenated (None unless every round has
    #: one per token): what the update's first epoch measures the sampler/trainer mismatch against
    engine_logprobs: list[float] | None = None

    @classmethod
    def from_turns(cls, turns: Sequence[Turn]) -> AgentTurns:
        recorded = all(len(t.logprobs) == len(t.completion_ids) for t in turns)
        return cls(
            prompt_ids=[list(t.prompt_ids) for t in turns],
            completion_ids=[list(t.completion_ids) for t in turns],
            behavior_logprobs=[list(t.behavior_logprobs) for t in turns],
            engine_logprobs=[float(x) for t in turns for x in t.logprobs] if recorded else None,
        )

    @property
    def n_tokens(self) -> int:
        return sum(len(c) for c in self.completion_ids)

    @property
    def has_behavior(self) -> bool:
        """Whether every round's behavior log-probs were recorded (one per completion token)."""
        return all(
            len(lp) == len(c) for lp, c in zip(self.behavior_logprobs, self.completion_ids, strict=True)
        )


@dataclass(frozen=True)
class Behavior:
    """What a loss is given of the policy that sampled one agent's tokens, one entry per debate of the
    (micro-)batch: ``logprobs``, the ratio's denominator (all the agent's rounds concatenated); and
    ``engine_logratio``, per token ``log pi_trainer - log pi_engine`` of the sampling policy, measured by
    the update's first epoch on a fresh debate whose engine recorded log-probs (None: no such
    measurement, importance weight 1; :func:`correction_weights`)."""

    logprobs: list[Tensor]
    engine_logratio: list[Tensor | None]


@dataclass(frozen=True)
class Advantages:
    """What :meth:`Algorithm.advantages` gives the update. values: every agent's advantage in every
    debate, [M, N] (or per round, [M, N, R]). critic_targets: a critic-based algorithm's value targets,
    per debate the (state, G) pairs of its states (one per distinct state; empty without a critic), what
    :meth:`Algorithm.critic_loss` regresses on. explained_variance: of the critic's values on those
    targets (nan without a critic)."""

    values: Tensor
    critic_targets: list[list[tuple[str, float]]] = field(default_factory=list)
    explained_variance: float = float("nan")

    def targets_of(self, debates: Sequence[int]) -> list[tuple[str, float]]:
        """The value targets of ``debates`` (positions in the batch), debate by debate."""
        return [pair for d in debates for pair in self.critic_targets[d]]


@dataclass
class RolloutBatch:
    """M debates ready for an update.

    trajectories: the debates. turns[m][i]: agent i's turns in debate m. rewards: [M, N] reward r_i.
    terms: the reward terms (r_intra, r_inter, r_sys, r_task), each [M] or [M, N].
    group_ids: question id of each debate (debates of one question form a group).
    weights: [M] importance weights (replayed debates), ones for fresh debates.
    """

    trajectories: list[Trajectory]
    turns: list[list[AgentTurns]]
    rewards: Tensor
    terms: dict[str, Tensor]
    group_ids: list[str]
    weights: Tensor

    @classmethod
    def from_trajectories(
        cls,
        trajectories: Sequence[Trajectory],
        rewards: Tensor,
        terms: dict[str, Tensor],
        weights: Tensor | None = None,
    ) -> RolloutBatch:
        """Collect every agent's stored turns; ``weights`` default to ones."""
        m = len(trajectories)
        if rewards.shape[0] != m:
            raise ValueError(f"rewards has {rewards.shape[0]} rows for {m} trajectories")
        for k, t in enumerate(trajectories):
            if len(t.turns) != t.n_agents or any(not row for row in t.turns):
                raise ValueError(
                    f"trajectory {k} (question {t.question_id}) has no stored turns for some agent; "
                    "training needs trajectories with turns (token ids and log-probs)"
                )
        weights = torch.ones(m) if weights is None else torch.as_tensor(weights, dtype=torch.float32)
        if weights.shape != (m,):
            raise ValueError(f"weights must have shape ({m},), got {tuple(weights.shape)}")
        return cls(
            trajectories=list(trajectories),
            turns=[[AgentTurns.from_turns(row) for row in t.turns] for t in trajectories],
            rewards=rewards,
            terms=terms,
            group_ids=[t.question_id for t in trajectories],
            weights=weights,
        )

    def __len__(self) -> int:
        return len(self.trajectories)

    @property
    def n_agents(self) -> int:
        return self.rewards.shape[1]

    def select(self, indices: Sequence[int]) -> RolloutBatch:
        """The sub-batch of the given debates (for micro-batching; compute advantages on the full batch)."""
        idx = torch.as_tensor(list(indices), dtype=torch.long)
        return replace(
            self,
            trajectories=[self.trajectories[k] for k in indices],
            turns=[self.turns[k] for k in indices],
            rewards=self.rewards[idx],
            terms={name: v[idx] for name, v in self.terms.items()},
            group_ids=[self.group_ids[k] for k in indices],
            weights=self.weights[idx],
        )

    def agent_sequences(self, agent: int) -> tuple[list[list[int]], list[list[int]]]:
        """All of ``agent``'s (prompt ids, completion ids), debate by debate, round by round: the input of
        :meth:`udpo.training.policy.MultiAgentPolicy.token_logprobs`."""
        prompts = [p for row in self.turns for p in row[agent].prompt_ids]
        completions = [c for row in self.turns for c in row[agent].completion_ids]
        return prompts, completions

    def per_debate(self, agent: int, flat: Sequence[Tensor]) -> list[Tensor]:
        """Concatenate per-round tensors (ordered as :meth:`agent_sequences`) into one tensor per debate."""
        out, k = [], 0
        for row in self.turns:
            n_rounds = len(row[agent].completion_ids)
            out.append(torch.cat(list(flat[k : k + n_rounds])))
            k += n_rounds
        if k != len(flat):
            raise ValueError(f"got {len(flat)} per-round tensors; agent {agent} has {k} turns in this batch")
        return out

    def behavior(
        self,
        agent: int,
        device: torch.device | str | None = None,
        measured: Mapping[int, Tensor] | None = None,
        engine_logratio: Mapping[int, Tensor] | None = None,
    ) -> Behavior:
        """The sampling policy's numbers for ``agent``'s tokens, one tensor per debate (all its rounds
        concatenated): the trainer's log-probs ``measured[m]`` (float32 on the host) where given, else the
        behavior log-probs recorded in this batch; with ``engine_logratio[m]`` where given (debates are
        positions in this batch)."""
        measured, engine_logratio = measured or {}, engine_logratio or {}
        per_debate = []
        for m, row in enumerate(self.turns):
            if m in measured:
                per_debate.append(measured[m])
                continue
            turns = row[agent]
            if not turns.has_behavior:
                raise ValueError(
                    f"debate {m} (question {self.group_ids[m]}): agent {agent} has turns without behavior "
                    "log-probs; call fill_behavior_logprobs(trajectories, policy) before the first update"
                )
            per_debate.append(
                torch.tensor([x for lp in turns.behavior_logprobs for x in lp], dtype=torch.float32)
            )
        flat = to_device(torch.cat(per_debate), "cpu" if device is None else device) if per_debate else None
        logprobs = list(flat.split([len(lp) for lp in per_debate])) if flat is not None else []
        return Behavior(logprobs, [engine_logratio.get(m) for m in range(len(self))])


def record_behavior(
    trajectories: Sequence[Trajectory], measured: Mapping[tuple[int, int, int], Sequence[float]]
) -> None:
    """Record the trainer's log-probs ``measured`` ((debate, agent, round) -> one per completion token;
    debates are positions in ``trajectories``) as those turns' ``trainer_logprobs``: how the loop keeps what
    an update or :func:`fill_behavior_logprobs` computed, once, before the debates are stored for replay."""
    for (m, agent, rnd), values in measured.items():
        turn = trajectories[m].turns[agent][rnd]
        if len(values) != len(turn.completion_ids):
            raise ValueError(
                f"{len(values)} log-probs for the {len(turn.completion_ids)} tokens of debate {m}, "
                f"agent {agent}, round {rnd}"
            )
        turn.trainer_logprobs = [float(v) for v in values]


@torch.no_grad()
def fill_behavior_logprobs(
    trajectories: Sequence[Trajectory], policy, *, temperature: float = 1.0, **scoring
) -> int:
    """Compute, with the current policy at the sampling ``temperature``, the behavior log-probs a backend
    did not record (e.g. an OpenAI-compatible server) and record them as the turns' ``trainer_logprobs``
    (:func:`record_behavior`). Call before the debates' batch is built; ``scoring`` goes to
    ``policy.token_logprobs`` (``batch_size``, ``token_budget``). Returns the turns filled."""
    filled: TrainerLogprobs = {}
    for i in range(max((t.n_agents for t in trajectories), default=0)):
        missing = [  # (debate, round) without behavior log-probs
            (m, r)
            for m, t in enumerate(trajectories)
            for r, turn in enumerate(t.turns[i])
            if len(turn.behavior_logprobs) != len(turn.completion_ids)
        ]
        if not missing:
            continue
        logps = policy.token_logprobs(
            i,
            [list(trajectories[m].turns[i][r].prompt_ids) for m, r in missing],
            [list(trajectories[m].turns[i][r].completion_ids) for m, r in missing],
            temperature=temperature,
            **scoring,
        )
        filled.update({(m, i, r): lp.tolist() for (m, r), lp in zip(missing, logps, strict=True)})
    record_behavior(trajectories, filled)
    return len(filled)


def ratio(logp: Tensor, logp_behavior: Tensor) -> Tensor:
    """rho = exp(logp_theta - logp_behavior), log-ratio clamped to +-LOG_RATIO_CLAMP."""
    return torch.exp((logp - logp_behavior).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))


def clipped_surrogate(rho: Tensor, advantage: Tensor, eps: float, dual_clip: float = 0.0) -> Tensor:
    """min(rho A, clip(rho, 1 - eps, 1 + eps) A), elementwise; with ``dual_clip`` c > 1, where A < 0 the
    result is max(that, c A) (its gradient vanishes once rho > c)."""
    surrogate = torch.minimum(rho * advantage, rho.clamp(1 - eps, 1 + eps) * advantage)
    if dual_clip:
        surrogate = torch.where(advantage < 0, torch.maximum(surrogate, dual_clip * advantage), surrogate)
    return surrogate


KL_LOSSES: tuple[KLLoss, ...] = get_args(KLLoss)
ADVANTAGE_NORMS: tuple[AdvantageNorm, ...] = get_args(AdvantageNorm)


def checked_settings(settings: AlgorithmArgs | None, name: AlgorithmName) -> AlgorithmArgs:
    """The settings algorithm ``name`` is given (None: the config's defaults for it), checked as a config
    checks them; a ValueError if they are another algorithm's (its ``auto`` would resolve for that one)."""
    settings = AlgorithmArgs(algorithm=name) if settings is None else settings
    if settings.algorithm != name:
        raise ValueError(f"{name} was given the settings of algorithm {settings.algorithm!r}")
    AlgorithmArgs.check(settings)  # the group's own check, also when given a whole TrainConfig
    return settings


def kl_estimate(logp: Tensor, logp_ref: Tensor, kind: str = "k3") -> Tensor:
    """Per-token KL loss with r = logp_ref - logp_theta (r clamped like the ratio): ``k3`` = exp(r) - r - 1,
    whose expected gradient on samples of pi_theta is that of KL(ref || theta); ``k2`` = r^2 / 2, whose
    expected gradient is that of KL(theta || ref). See the module docstring."""
    r = (logp_ref - logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    if kind == "k2":
        return 0.5 * r**2
    if kind != "k3":
        raise ValueError(f"kl_loss must be one of {KL_LOSSES}, got {kind!r}")
    return torch.exp(r) - r - 1


def aggregate(values: Sequence[Tensor], how: str) -> Tensor:
    """[M] each debate's per-token values summed (``sum``) or averaged (``mean``) over its tokens."""
    return debate_sum(values) if how == "sum" else debate_mean(values)


def normalize_advantages(advantages: Tensor, how: str, mask: Tensor | None = None) -> Tensor:
    """Advantages [M, N, ...] scaled to mean 0 and std 1: over every entry (``batch``), over each agent's
    entries (``agent``: dim 1, each agent's own statistics), or left as they are (``none``). ``mask``
    (same shape, bool) marks the entries that exist (rounds an agent spoke); the others stay 0."""
    if how == "none":
        return advantages
    if how not in ADVANTAGE_NORMS:
        raise ValueError(f"advantage_norm must be one of {ADVANTAGE_NORMS}, got {how!r}")
    mask = torch.ones_like(advantages, dtype=torch.bool) if mask is None else mask
    out = torch.zeros_like(advantages)
    groups = [slice(None)] if how == "batch" else [i for i in range(advantages.shape[1])]
    for g in groups:
        a, m = advantages[:, g], mask[:, g]
        picked = a[m]
        if picked.numel() < 2:
            out[:, g] = torch.where(m, a, a.new_zeros(()))
            continue
        out[:, g] = torch.where(m, (a - picked.mean()) / (picked.std() + 1e-8), a.new_zeros(()))
    return out


def correction_weights(
    behavior: Behavior, how: str, cap: float, per_token: bool, device: torch.device | str
) -> tuple[list[Tensor], dict[str, float]]:
    """Sampler/trainer importance weights of one agent's samples, one tensor per debate: per token
    ``min(exp(log pi_trainer - log pi_engine), cap)`` (``tis`` with ``per_token``), per debate the same
    of the summed log-ratio (``tis``), or 1 where the debate's ratio lies in ``[1/cap, cap]`` and 0
    elsewhere (``mask``). A debate without an engine log-ratio (``behavior.engine_logratio`` None, e.g.
    replayed) gets 1. Also returns ``is_weight_mean`` and ``is_clipped_frac`` (share truncated or masked)."""
    weights = []  # built on the host from the engine's log-ratios, sent to the device in one copy
    for logprobs, log_ratio in zip(behavior.logprobs, behavior.engine_logratio, strict=True):
        n = logprobs.numel() if per_token else 1
        if how == "none" or log_ratio is None:
            weights.append(torch.ones(n))
            continue
        if how == "mask":
            inside = log_ratio.sum().abs() <= math.log(cap)
            weights.append(torch.full((n,), float(inside)))
            continue
        if not per_token:
            log_ratio = log_ratio.sum().reshape(1)
        weights.append(torch.exp(log_ratio.clamp(max=math.log(cap))))
    flat = torch.cat(weights) if weights else torch.ones(1)
    clipped = flat == 0 if how == "mask" else flat >= cap * (1 - 1e-6)
    info = {"is_weight_mean": flat.mean().item(), "is_clipped_frac": clipped.float().mean().item()}
    weights = list(to_device(flat, device).split([len(w) for w in weights])) if weights else []
    return (weights if per_token else [w.reshape(()) for w in weights]), info


def debate_mean(values: Sequence[Tensor]) -> Tensor:
    """[M] mean of each debate's per-token values (0 for a debate without tokens)."""
    return torch.stack([v.mean() if v.numel() else v.new_zeros(()) for v in values])


def debate_sum(values: Sequence[Tensor]) -> Tensor:
    """[M] sum of each debate's per-token values (0 for a debate without tokens)."""
    return torch.stack([v.sum() for v in values])


class Algorithm(abc.ABC):
    """A policy-optimization algorithm: rewards -> advantages, and per agent, log-probs -> loss.

    The training loop, per update: ``A = algo.advantages(batch)`` once on the whole batch, then for each
    agent i: log-probs ``logp[m]`` (all of agent i's tokens in debate m, under theta, with gradients), the
    sampling policy's ``behavior`` (:class:`Behavior`: the recorded ones, :meth:`RolloutBatch.behavior`,
    or what the update measured) and ``ref_logp[m]`` (under the reference, when ``needs_reference(i)``),
    then ``loss, metrics = algo.loss(batch, i, logp, behavior, ref_logp, A.values[:, i])`` and
    ``loss.backward()``. Per-round advantages (MAPPO-style critics) fit the same call: return [M, N, R] in
    ``A.values`` and split ``logp[m]`` by round with the completion lengths in ``batch.turns[m][i]``. An
    algorithm with a ``critic`` returns its value targets in ``A.critic_targets`` and gets
    ``loss = algo.critic_loss(A.targets_of(micro_batch))`` and ``loss.backward()`` per micro-batch; the
    critic's parameters are an optimizer group of their own.
    """

    #: the name a run gives it (``algorithm:``), its key in ``udpo.algorithms.ALGORITHMS``
    name: ClassVar[AlgorithmName]
    #: whether the run must build a critic (a value head with its own adapter) and pass it to ``from_config``
    needs_critic = False
    #: a critic-based algorithm's critic (its parameters train with :meth:`critic_loss`); None otherwise
    critic: Critic | None = None

    @classmethod
    @abc.abstractmethod
    def from_config(
        cls,
        algorithm: AlgorithmArgs,
        reward: RewardArgs,
        calibration: dict[str, Any],
        critic=None,
        reward_functions: Sequence = (),
        seed: int = 0,
    ) -> Algorithm:
        """The algorithm a run's ``algorithm`` and ``reward`` settings set up (the two groups of a
        :class:`udpo.config.TrainConfig`), with the run's ``calibration`` record, its ``critic`` (when
        :attr:`needs_critic`), its user reward terms and its ``seed``."""

    def adversary_stage(self, task):
        """A protocol stage that perturbs what agents read in training rollouts, or None (the default)."""
        return None

    @abc.abstractmethod
    def rewards(self, trajectories: Sequence[Trajectory]) -> tuple[Tensor, dict[str, Tensor]]:
        """Each agent's reward in each debate [M, N], and the named reward terms behind it (for logging)."""

    def batch(
        self, trajectories: Sequence[Trajectory], weights: Sequence[float] | None = None
    ) -> RolloutBatch:
        """The debates' rewards (:meth:`rewards`) and per-agent turns, ready for an update; ``weights``: each
        debate's weight in the loss (replayed debates: their importance weights), None: all 1."""
        rewards, terms = self.rewards(trajectories)
        return RolloutBatch.from_trajectories(
            trajectories,
            rewards=rewards,
            terms=terms,
            weights=None if weights is None else torch.as_tensor(weights, dtype=torch.float32),
        )

    @abc.abstractmethod
    def reward_parts(self, batch: RolloutBatch) -> dict[str, Tensor]:
        """Each reward term's contribution to every agent's reward, [M, N] each (its weight times the term),
        summing to ``batch.rewards``: what the logged shares of the within-question reward differences are
        of (:func:`udpo.training.dynamic_sampling.reward_shares`)."""

    @abc.abstractmethod
    def advantages(self, batch: RolloutBatch) -> Advantages:
        """Advantages of every agent in every debate, [M, N] (or per round, [M, N, R]), and a critic's value
        targets (:class:`Advantages`)."""

    @abc.abstractmethod
    def loss(
        self,
        batch: RolloutBatch,
        agent: int,
        logp: list[Tensor],
        behavior: Behavior,
        ref_logp: list[Tensor] | None,
        advantages: Tensor,
    ) -> tuple[Tensor, dict[str, float]]:
        """Scalar loss to minimize for ``agent`` and its metrics (plain floats): ``logp`` against the
        sampling policy's ``behavior``, with ``advantages`` (the agent's column of :attr:`Advantages.values`)."""

    def needs_reference(self, agent: int) -> bool:
        """Whether ``loss`` uses reference log-probs for ``agent`` (the loop skips that forward pass if not)."""
        return True

    def critic_loss(self, targets: Sequence[tuple[str, float]]) -> tuple[Tensor, dict[str, float]]:
        """The critic's loss on value ``targets``, (state, G) pairs (:meth:`Advantages.targets_of`)."""
        raise NotImplementedError(f"{self.name} has no critic")

    def batch_metrics(self, batch: RolloutBatch, advantages: Advantages) -> dict[str, float]:
        """Reward, reward-term and advantage statistics of a batch, for logging."""
        out = {"reward/mean": batch.rewards.mean().item()}
        for i in range(batch.n_agents):
            out[f"reward/agent_{i}"] = batch.rewards[:, i].mean().item()
        for name, value in batch.terms.items():
            out[f"reward/{name}"] = value.float().mean().item()
        values = advantages.values
        out.update(
            {
                "advantage/mean": values.mean().item(),
                "advantage/std": values.std().item() if values.numel() > 1 else 0.0,
                "advantage/min": values.min().item(),
                "advantage/max": values.max().item(),
                "replay_weight/mean": batch.weights.mean().item(),
            }
        )
        return out


@torch.no_grad()
def loss_metrics(
    rho: Tensor | list[Tensor],
    A: Tensor | list[Tensor],
    l_clip: Tensor,
    l_anchor: Tensor,
    loss: Tensor,
    eps: float,
    c: float,
) -> dict[str, float]:
    """Statistics of a clipped-surrogate loss. ``rho``: one ratio per debate, or per-token ratios per
    debate; ``A``: per debate, or per token like ``rho``. clip_frac: share of ratios outside the trust
    region [1 - eps, 1 + eps]; dual_clip_frac: share where A < 0 and rho > c (the dual clip holds the
    objective at c A)."""
    shown = A if isinstance(A, Tensor) else torch.cat(A)  # advantage statistics: per debate, or per token
    if isinstance(rho, list):
        negative = torch.cat([a.expand_as(r) for r, a in zip(rho, A, strict=True)]) < 0
        rho = torch.cat(rho)
    else:
        negative = shown < 0  # rho per debate: so is A
    if not rho.numel():
        rho, negative = torch.ones(1), torch.zeros(1, dtype=torch.bool)
    if not shown.numel():
        shown = torch.zeros(1)
    stats = {
        "loss": loss,
        "surrogate": l_clip.mean(),
        "kl": l_anchor.mean(),
        "ratio_mean": rho.mean(),
        "ratio_min": rho.min(),
        "ratio_max": rho.max(),
        "clip_frac": ((rho - 1).abs() > eps).float().mean(),
        "dual_clip_frac": (negative & (rho > c)).float().mean() if c else torch.zeros((), device=loss.device),
        "advantage_mean": shown.mean(),
        "advantage_abs_mean": shown.abs().mean(),
    }
    return host_floats(stats)
