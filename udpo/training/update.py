"""The optimizer, its schedule and one update: per epoch, agent and micro-batch, the agent's log-probs,
the algorithm's loss and backward; gradients summed over processes, each adapter's norm clipped on its
own, one AdamW step; then (critic-based algorithms) ``critic_epochs`` passes of the critic's loss, each a
step of the critic's parameter group alone, at its own learning rate.

The schedule (:func:`lr_factor`) warms up linearly from ``1 / (warmup + 1)`` of the peak, so the first
optimizer step moves, then decays (cosine, linear) or stays (constant). The first epoch also measures, on
the fresh debates, the trainer's log-probs of the sampling policy (the adapters have not moved yet): with
``behavior_logprobs: recompute`` they are the behavior log-probs the loss is given in every epoch, and
the update returns them (:class:`UpdateResult`) for the loop to record; where the engine recorded
log-probs, the sampler/trainer mismatch (``mismatch/*``) and each agent's per-token log-ratio for the
importance weights of ``is_correction``. Nothing is written into the batch or its trajectories.

The same steps run on every path. Without DeepSpeed the gradients are summed with one all-reduce
(:func:`udpo.training.distributed.sum_gradients`) and the optimizer is torch's AdamW. Under DeepSpeed (ZeRO-2/3)
the engine owns the optimizer and reduces (ZeRO-2/3: partitions) the gradients during backward; each
adapter's norm, the non-finite check and the clipping then read and scale the full gradients through
DeepSpeed's ``safe_get_full_grad`` / ``safe_set_full_grad`` before the engine steps, so DeepSpeed's own
``gradient_clipping`` (over all adapters together) stays off. Every process runs the same number of
backward passes (micro-batches of the smallest shard's size) and, through the policy's
``symmetric_passes``, of forward passes.

Each step of :meth:`Updater.update` runs under a ``torch.profiler.record_function`` label, what a profile
of it is split by (``benchmarks/profiling.py``; outside a profiler a label costs a microsecond or so):
``update/reference`` (the no-grad reference passes), ``update/forward/agent_i``, ``update/loss/agent_i`` and
``update/backward/agent_i`` per agent and micro-batch, ``update/fresh_logprobs`` (epoch 0: the fresh
debates' log-probs copied to the host), ``update/record`` (the loss read on the host), ``update/step`` (the
norms, clipping and optimizer step), ``update/critic`` and ``update/stats`` (the statistics returned).
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.profiler import record_function

from udpo.algorithms.base import (
    LOG_RATIO_CLAMP,
    Advantages,
    Algorithm,
    Behavior,
    RolloutBatch,
    TrainerLogprobs,
)
from udpo.config.groups import AlgorithmArgs, OptimizerArgs
from udpo.training import distributed as dist

#: on_non_finite(iteration, what, metrics): stop the run (save the last good state, raise)
NonFinite = Callable[[int, str, dict[str, Any]], None]


@dataclass(frozen=True)
class UpdateResult:
    """What one update measured. metrics: the per-agent loss statistics, gradient norms, mismatch and
    pass statistics (the same on every process). behavior: with ``behavior_logprobs: recompute``, the
    trainer's log-probs of every fresh debate's turns from the first epoch, before any step (every
    process's debates; empty otherwise): what the loop records on the debates
    (:func:`udpo.algorithms.base.record_behavior`) before it stores them for replay."""

    metrics: dict[str, float]
    behavior: TrainerLogprobs


class Updater:
    """Owns the optimizer (one parameter group per adapter, plus ``critic``) and its schedule.

    optim: the optimizer's settings (and the update's sizes); algorithm: the update's epochs, the critic's
    settings, where behavior log-probs come from. params: every trainable parameter, summed over processes
    before each step. ``accelerator``: the run's (its device, DeepSpeed's engine). temperature: the
    sampling temperature, at which the policy scores log-probs in training. bf16: autocast the update's
    passes to bf16 (:meth:`autocast`)."""

    def __init__(
        self,
        optim: OptimizerArgs,
        algorithm: AlgorithmArgs,
        policy,
        accelerator,
        total_steps: int,
        warmup_steps: int,
        *,
        temperature: float,
        critic=None,
        deepspeed: bool = False,
        bf16: bool = False,
    ):
        self.optim, self.algorithm = optim, algorithm
        self.bf16 = bf16
        self.policy, self.accelerator, self.temperature = policy, accelerator, temperature
        self.n_agents = len(policy.adapter_names)
        self.deepspeed = deepspeed
        self.rank, self.world = accelerator.process_index, accelerator.num_processes
        adapters = list(dict.fromkeys(policy.adapter_names))  # distinct adapters, agent order
        groups = [
            {"params": policy.parameters_of(policy.adapter_names.index(a)), "adapter": a} for a in adapters
        ]
        #: the critic's peak learning rate (docs/algorithms.md, "The baselines": default 10 x the actors')
        self.critic_lr = algorithm.critic_learning_rate or 10 * optim.learning_rate
        if critic is not None:
            groups.append({"params": critic.parameters(), "adapter": "critic", "lr": self.critic_lr})
        self.params = [p for g in groups for p in g["params"]]
        #: adapter (or "critic") -> its parameters: what is clipped on its own
        self.groups = {g["adapter"]: g["params"] for g in groups}
        dist.broadcast_parameters(self.params)  # identical start on every process
        self.optimizer = torch.optim.AdamW(
            groups,
            lr=optim.learning_rate,
            betas=(optim.adam_beta1, optim.adam_beta2),
            eps=optim.adam_epsilon,
            weight_decay=optim.weight_decay,
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            functools.partial(
                lr_factor, warmup=warmup_steps, total=total_steps, kind=optim.lr_scheduler_type
            ),
        )
        self.steps = 0
        self.engine: Any = None  # the DeepSpeed engine (wrapping the base model) under DeepSpeed
        if deepspeed:
            self._prepare_deepspeed(critic)

    def _prepare_deepspeed(self, critic) -> None:
        """DeepSpeed (ZeRO-2/3) owns the optimizer step: it needs the model, optimizer and scheduler."""
        if critic is not None:
            raise ValueError(
                "mappo and rmaac do not run under DeepSpeed (the critic's head is outside the model)"
            )
        if len(self.policy.models) != 1:
            raise ValueError("DeepSpeed training supports one base model; agent_models lists several")
        ds_config = self.accelerator.state.deepspeed_plugin.deepspeed_config
        clipping = ds_config.get("gradient_clipping", "auto")
        if clipping != "auto" and float(clipping) > 0:
            raise ValueError(
                f"the DeepSpeed config sets gradient_clipping {clipping}: UDPO clips each adapter's gradient "
                f"norm itself (max_grad_norm={self.optim.max_grad_norm}); set gradient_clipping to 0"
            )
        ds_config["gradient_clipping"] = 0.0
        (base,) = self.policy.models
        # every backward (one per agent and micro-batch) accumulates; the engine steps after the last one
        self.accelerator.gradient_accumulation_steps = self.n_agents * self.micro_batch_count
        model, self.optimizer, self.scheduler = self.accelerator.prepare(
            self.policy.models[base], self.optimizer, self.scheduler
        )
        self.engine = model

    def autocast(self) -> contextlib.AbstractContextManager:
        """The update's precision: bf16 autocast on the run's device where ``bf16`` asks for it, none under
        DeepSpeed (its engine keeps its own precision) or in fp32. The updater's own, not accelerate's
        process-wide setting, so trainers of either precision can follow one another in one process."""
        if not self.bf16 or self.deepspeed:
            return contextlib.nullcontext()
        return torch.autocast(self.accelerator.device.type, dtype=torch.bfloat16)

    def micro_batches(self, local: list[int], total: int) -> list[list[int]]:
        """This process's debates split into ``gradient_accumulation_steps`` micro-batches (of ``total``
        debates over all processes: every process decides alike, from the smallest shard)."""
        ga, smallest = self.micro_batch_count, total // self.world
        if smallest < ga:
            raise ValueError(
                f"gradient_accumulation_steps={ga} is more than the {smallest} debates per update that the "
                f"least busy of {self.world} process(es) has; lower it or raise questions_per_iteration"
            )
        return [chunk.tolist() for chunk in np.array_split(np.asarray(local), ga)]

    def can_update(self, total: int) -> bool:
        """Whether an update of ``total`` debates fills every process's micro-batches (:meth:`micro_batches`):
        one short of its planned size (dynamic sampling at its cap) may not, and is then skipped."""
        return total // self.world >= self.micro_batch_count

    @property
    def micro_batch_count(self) -> int:
        """``gradient_accumulation_steps``, sized by :mod:`udpo.training.autosize` before the updater is built."""
        steps = self.optim.gradient_accumulation_steps
        if steps is None:
            raise ValueError("gradient_accumulation_steps is not sized yet (udpo.training.autosize.resolve)")
        return steps

    def scoring(self) -> dict[str, Any]:
        """How the policy scores log-probs in training: the sampling temperature and the pass sizes."""
        return {
            "temperature": self.temperature,
            "batch_size": self.optim.logprob_batch_size,
            "token_budget": self.optim.logprob_token_budget,
        }

    def update(
        self,
        algorithm: Algorithm,
        batch: RolloutBatch,
        advantages: Advantages,
        fresh_count: int,
        iteration: int,
        on_non_finite: NonFinite,
    ) -> UpdateResult:
        """``update_epochs`` optimizer steps on the batch (its first ``fresh_count`` debates fresh); returns
        the per-agent loss statistics and the behavior log-probs it measured.

        The reference log-probs of this process's debates come first, from no-grad passes (with
        ``reference: base`` all agents share them: one model, adapters off). Then per epoch, agent and
        micro-batch: the agent's log-probs with gradients, its loss, backward. In epoch 0 the adapters have
        not moved, so with ``behavior_logprobs: recompute`` those log-probs are also the fresh debates'
        behavior log-probs: the loss is given them in every epoch, and they are returned, gathered from
        every process.
        """
        settings, total = self.algorithm, len(batch.trajectories)
        local = dist.shard(total, self.rank, self.world)
        chunks = self.micro_batches(local, total)
        self.policy.forward_stats.reset()
        with record_function("update/reference"), self.autocast():
            reference = self._reference_logprobs(algorithm, batch, local)
        stats: dict[str, list[float]] = {}
        # what epoch 0 measures on the fresh debates, and whether it is their behavior log-probs
        first = FirstEpoch(recompute=settings.behavior_logprobs == "recompute" and fresh_count > 0)

        for epoch in range(settings.update_epochs):
            for agent in range(self.n_agents):
                for chunk in chunks:
                    sub = batch.select(chunk)
                    prompts, completions = sub.agent_sequences(agent)
                    with record_function(f"update/forward/agent_{agent}"), self.autocast():
                        flat = self.policy.token_logprobs(agent, prompts, completions, **self.scoring())
                    if epoch == 0:  # the adapters have not moved: these are the sampling policy's log-probs
                        with record_function("update/fresh_logprobs"):
                            fresh = [m for m, g in enumerate(chunk) if g < fresh_count]
                            first.measure(sub, agent, chunk, fresh, _on_host(flat) if fresh else [])
                    with record_function(f"update/loss/agent_{agent}"):
                        logp = sub.per_debate(agent, flat)
                        behavior = first.behavior(sub, agent, chunk, logp[0].device)
                        loss, info = algorithm.loss(
                            sub,
                            agent,
                            logp,
                            behavior,
                            [reference[agent, g] for g in chunk]
                            if algorithm.needs_reference(agent)
                            else None,
                            advantages.values[chunk, agent],
                        )
                    with record_function("update/record"):
                        self._record(
                            stats,
                            f"agent_{agent}",
                            loss,
                            info,
                            f"loss of agent {agent}",
                            iteration,
                            on_non_finite,
                        )
                    with record_function(f"update/backward/agent_{agent}"):
                        self._backward(loss * len(chunk) / total)
            with record_function("update/step"):
                stats.update(self.step(iteration, on_non_finite, groups=self.actor_groups))
        if algorithm.critic is not None:
            with record_function("update/critic"):
                for _ in range(settings.critic_epochs):
                    self._critic_pass(algorithm, advantages, chunks, total, stats, iteration, on_non_finite)
        with record_function("update/stats"):
            means = {key: float(np.mean(v)) for key, v in stats.items()}
            means.update(mismatch_stats(list(first.engine_logratio.values())))
            means["update/padding"] = self.policy.forward_stats.padding
            means["update/empty_passes"] = float(self.policy.forward_stats.empty_passes)
            means = dist.mean_over_processes(means)
        for key in {k.split("/", 1)[1] for k in means if k.startswith("agent_")}:
            values = [means[f"agent_{i}/{key}"] for i in range(self.n_agents) if f"agent_{i}/{key}" in means]
            means[f"update/{key}"] = float(np.mean(values))
        return UpdateResult(means, first.gathered())

    @property
    def actor_groups(self) -> list[str]:
        """The agents' parameter groups (every group but the critic's)."""
        return [g for g in self.groups if g != "critic"]

    def warm_start_critic(
        self, algorithm: Algorithm, batch: RolloutBatch, epochs: int, on_non_finite: NonFinite
    ) -> dict[str, float]:
        """Fit the critic on ``batch`` (the warm-up debates) before training: ``epochs`` passes, each with
        value targets from the critic as it then is (``algorithm.advantages``) and one step at the critic's
        peak learning rate; the schedule does not advance. Returns the mean value loss of the first and
        last pass (``critic_warmup/value_loss_first``, ``..._last``) and the final explained variance."""
        total = len(batch)
        chunks = self.micro_batches(dist.shard(total, self.rank, self.world), total)
        (group,) = [g for g in self.optimizer.param_groups if g["adapter"] == "critic"]
        scheduled, group["lr"] = group["lr"], self.critic_lr
        losses = []
        try:
            for _ in range(epochs):
                stats: dict[str, list[float]] = {}
                self._critic_pass(
                    algorithm, algorithm.advantages(batch), chunks, total, stats, 0, on_non_finite
                )
                losses.append(float(np.mean(stats["critic/value_loss"])))
        finally:
            group["lr"] = scheduled
        fitted = algorithm.advantages(batch)  # the explained variance of the fitted critic
        return dist.mean_over_processes(
            {
                "critic_warmup/value_loss_first": losses[0],
                "critic_warmup/value_loss_last": losses[-1],
                "critic_warmup/explained_variance": fitted.explained_variance,
            }
        )

    def _critic_pass(
        self,
        algorithm: Algorithm,
        advantages: Advantages,
        chunks: list[list[int]],
        total: int,
        stats: dict[str, list[float]],
        iteration: int,
        on_non_finite: NonFinite,
    ) -> None:
        """One pass of the critic's loss on the value targets of ``advantages`` over ``chunks`` and one step
        of the critic's group alone (the schedule advances with the actors' steps only)."""
        for chunk in chunks:
            with self.autocast():
                loss, info = algorithm.critic_loss(advantages.targets_of(chunk))
            self._record(stats, "critic", loss, info, "the critic's loss", iteration, on_non_finite)
            self._backward(loss * len(chunk) / total)
        for key, value in self.step(iteration, on_non_finite, groups=["critic"], schedule=False).items():
            stats.setdefault(key, []).extend(value)

    @staticmethod
    def _record(
        stats: dict[str, list[float]],
        prefix: str,
        loss: torch.Tensor,
        info: dict[str, float],
        what: str,
        iteration: int,
        on_non_finite: NonFinite,
    ) -> None:
        """Keep a loss and its metrics under ``prefix/``; stop every process on a non-finite loss."""
        finite = bool(torch.isfinite(loss))
        if dist.any_true(not finite):  # every process stops together (saving is collective)
            state = f"is {loss.item()}" if not finite else "is not finite on another process"
            on_non_finite(iteration, f"{what} {state}", info)
        for key, value in {**info, "loss": float(loss.detach())}.items():
            stats.setdefault(f"{prefix}/{key}", []).append(float(value))

    @torch.no_grad()
    def _reference_logprobs(
        self, algorithm: Algorithm, batch: RolloutBatch, debates: list[int]
    ) -> dict[tuple[int, int], torch.Tensor]:
        """(agent, batch position) -> the agent's reference log-probs in that debate, for ``debates`` and every
        agent whose loss needs them, from one :meth:`~udpo.training.policy.MultiAgentPolicy.reference_logprobs` call."""
        agents = [i for i in range(self.n_agents) if algorithm.needs_reference(i)]
        sub = batch.select(debates)
        sequences = [sub.agent_sequences(i) for i in agents]
        flat = self.policy.reference_logprobs(
            [i for i, (prompts, _) in zip(agents, sequences, strict=True) for _ in prompts],
            [p for prompts, _ in sequences for p in prompts],
            [c for _, completions in sequences for c in completions],
            **self.scoring(),
        )
        out, k = {}, 0
        for i, (prompts, _) in zip(agents, sequences, strict=True):
            for g, lp in zip(debates, sub.per_debate(i, flat[k : k + len(prompts)]), strict=True):
                out[i, g] = lp
            k += len(prompts)
        return out

    def _backward(self, loss: torch.Tensor) -> None:
        if self.deepspeed:
            # the engine divides by its accumulation steps and averages over processes; undo both so the
            # gradient is the same batch mean as on the plain path
            self.engine.backward(loss * self.engine.gradient_accumulation_steps() * self.world)
            if not self.engine.is_gradient_accumulation_boundary():
                self.engine.step()  # counts the micro-step; the real step is in :meth:`step`
        else:
            loss.backward()

    def step(
        self,
        iteration: int,
        on_non_finite: NonFinite,
        groups: Sequence[str] | None = None,
        schedule: bool = True,
    ) -> dict[str, list[float]]:
        """Sum gradients over processes, clip each group's norm, step; returns the norms. ``groups``: the
        parameter groups that took part (default: all; the others have no gradient, and AdamW leaves them
        alone); ``schedule``: advance the learning-rate schedule (and count an optimizer step)."""
        groups = list(self.groups) if groups is None else list(groups)
        if not self.deepspeed:
            dist.sum_gradients([p for g in groups for p in self.groups[g]])
        norms = {}
        limit = self.optim.max_grad_norm if self.optim.max_grad_norm > 0 else float("inf")
        for adapter in groups:
            params = self.groups[adapter]
            grads = [self._grad(p) for p in params]
            norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads]))
            norms[adapter] = float(norm)
            scale = min(limit / (float(norm) + 1e-6), 1.0)  # as torch's clip_grad_norm_
            if math.isfinite(scale) and scale < 1.0:  # the same decision on every process: a full norm
                for p, g in zip(params, grads, strict=True):
                    self._set_grad(p, g * scale)
        bad = [a for a, n in norms.items() if not math.isfinite(n)]
        if bad:
            self.zero_grad()
            on_non_finite(iteration, f"gradient norm of adapter(s) {bad} is not finite", {})
        if self.deepspeed:
            self.engine.step()  # the optimizer step and the schedule
        else:
            self.optimizer.step()
            if schedule:
                self.scheduler.step()
        self.zero_grad()
        self.steps += int(schedule)
        return {f"grad_norm/{a}": [n] for a, n in norms.items()}

    def _grad(self, p: torch.nn.Parameter) -> torch.Tensor:
        """The full gradient of ``p`` (a zero tensor where no loss reached it)."""
        if self.deepspeed:
            from deepspeed.utils import safe_get_full_grad

            g = safe_get_full_grad(p)
        else:
            g = p.grad
        shape = p.ds_shape if hasattr(p, "ds_shape") else p.shape  # ZeRO-3: the full shape
        return torch.zeros(shape, device=p.device) if g is None else g

    def _set_grad(self, p: torch.nn.Parameter, g: torch.Tensor) -> None:
        if self.deepspeed:
            from deepspeed.utils import safe_set_full_grad

            safe_set_full_grad(p, g)
        elif p.grad is not None:
            p.grad.copy_(g)

    def zero_grad(self) -> None:
        if self.deepspeed:
            self.engine.zero_grad()
        else:
            self.optimizer.zero_grad(set_to_none=True)


def lr_factor(step: int, warmup: int, total: int, kind: str) -> float:
    """The learning rate of optimizer step ``step`` (0-based) as a share of the peak. Warm-up: ``(step + 1) /
    (warmup + 1)``, so the first step moves (a warm-up from 0 would waste it); then ``cosine`` (half a
    cosine to 0 at ``total``), ``linear`` (to 0 at ``total``) or ``constant`` (the peak)."""
    if step < warmup:
        return (step + 1) / (warmup + 1)
    if kind == "constant":
        return 1.0
    progress = (step - warmup) / max(1, total - warmup)
    if kind == "linear":
        return max(0.0, 1.0 - progress)
    if kind != "cosine":
        raise ValueError(f"lr_scheduler_type must be cosine, linear or constant, got {kind!r}")
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))


def _on_host(flat: list[torch.Tensor]) -> list[torch.Tensor]:
    """``flat`` (per-round log-probs) detached and copied to the host as float32 in one copy: on a GPU one
    wait for the device instead of one per round."""
    if not flat:
        return []
    host = torch.cat([lp.detach().float().reshape(-1) for lp in flat]).cpu()
    return list(host.split([lp.numel() for lp in flat]))


class FirstEpoch:
    """What an update's first epoch measures on the fresh debates, before any step: per (agent, debate),
    the trainer's log-probs of each round (on the host), and ``log pi_trainer - log pi_engine`` of its
    tokens where the engine recorded log-probs. recompute: whether the measured log-probs are the fresh
    debates' behavior log-probs (``behavior_logprobs: recompute``)."""

    def __init__(self, recompute: bool) -> None:
        self.recompute = recompute
        self.rounds: dict[tuple[int, int], list[torch.Tensor]] = {}
        self.engine_logratio: dict[tuple[int, int], torch.Tensor] = {}

    def measure(
        self, sub: RolloutBatch, agent: int, chunk: list[int], fresh: list[int], flat: list[torch.Tensor]
    ) -> None:
        """Keep ``flat`` (``agent``'s per-round log-probs of micro-batch ``sub``, on the host
        (:func:`_on_host`), ordered as ``sub.agent_sequences(agent)``) for its ``fresh`` debates (positions
        in ``sub``, whose batch positions are ``chunk``)."""
        starts = np.cumsum([0, *(len(row[agent].completion_ids) for row in sub.turns)])
        for m in fresh:
            rounds = flat[starts[m] : starts[m + 1]]
            self.rounds[agent, chunk[m]] = rounds
            engine = sub.turns[m][agent].engine_logprobs
            if engine is not None:
                trainer = torch.cat(rounds)
                self.engine_logratio[agent, chunk[m]] = trainer - torch.tensor(engine, dtype=torch.float32)

    def behavior(self, sub: RolloutBatch, agent: int, chunk: list[int], device: torch.device) -> Behavior:
        """What ``agent``'s loss on micro-batch ``sub`` (batch positions ``chunk``) is given: the measured
        log-probs as the behavior log-probs with ``recompute``, else those recorded in the batch; the
        engine log-ratios measured."""
        own = [(m, (agent, g)) for m, g in enumerate(chunk)]
        measured = (
            {m: torch.cat(self.rounds[key]) for m, key in own if key in self.rounds}
            if self.recompute
            else None
        )
        logratio = {m: self.engine_logratio[key] for m, key in own if key in self.engine_logratio}
        return sub.behavior(agent, device, measured, logratio)

    def gathered(self) -> TrainerLogprobs:
        """With ``recompute``, the measured log-probs of every process, (debate, agent, round) -> values
        (a collective: every process calls it); else nothing."""
        if not self.recompute:
            return {}
        mine = {
            (g, agent, r): lp.tolist()
            for (agent, g), rounds in self.rounds.items()
            for r, lp in enumerate(rounds)
        }
        return {key: values for theirs in dist.gather_objects(mine) for key, values in theirs.items()}


def mismatch_stats(logratios: list[torch.Tensor]) -> dict[str, float]:
    """Sampler/trainer mismatch of the engine-recorded tokens of every process (``d = log pi_trainer - log
    pi_engine``): ``mismatch/abs_mean`` and ``mismatch/abs_max`` of ``|d|``, ``mismatch/engine_minus_trainer``
    (mean of ``-d``, the number docs/algorithms.md asks for), ``mismatch/kl`` (mean of ``exp(d) - d - 1``, an
    estimate of KL(engine || trainer) on the engine's samples) and ``mismatch/tokens``. Empty when no token
    was recorded."""
    local = torch.cat(logratios) if logratios else torch.zeros(0)
    d = torch.cat(dist.gather_objects(local)).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    if not d.numel():
        return {}
    return {
        "mismatch/abs_mean": d.abs().mean().item(),
        "mismatch/abs_max": d.abs().max().item(),
        "mismatch/engine_minus_trainer": (-d).mean().item(),
        "mismatch/kl": (torch.exp(d) - d - 1).mean().item(),
        "mismatch/tokens": float(d.numel()),
    }
