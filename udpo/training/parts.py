"""A training run's parts, built in order from its configuration (:func:`build_parts`, which
:class:`~udpo.training.trainer.Trainer` calls in the run's :class:`~udpo.training.run_env.RunEnvironment`):

1. the run folder checked (the paths the config names, the checkpoint to resume) before anything loads;
2. the user's reward terms, and the questions (:mod:`udpo.training.data`), the longest of which are
   checked against the model's context, still before the model loads;
3. the team (one base model, one LoRA adapter per agent; the critic of mappo / rmaac), initialized from
   the run's seed, alike on every process;
4. the configuration resolved whole: the update's auto sizes measured on the loaded team and checked
   (:func:`udpo.training.autosize.resolve`);
5. from the resolved configuration, the update (optimizer, schedule: :class:`~udpo.training.update.Updater`),
   the rollouts (the debate engine: :class:`~udpo.training.rollouts.Rollouts`) and the held-out evaluation
   (:class:`~udpo.training.evaluation.HeldOutEvaluation`), each process sampling on a seed of its own from
   here on.

The parts built before step 4 read none of the settings it fills in; from step 4 on every part reads the
resolved configuration, the only one the run keeps. The algorithm and the replay buffer come later, from
the reward coefficients (calibration or checkpoint: :func:`algorithm_parts`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from udpo.algorithms import algorithm_class, build_algorithm
from udpo.algorithms.base import Algorithm
from udpo.algorithms.reward_functions import RewardFunction, load_reward_functions
from udpo.config import TrainConfig
from udpo.config.groups import AlgorithmArgs, DebateArgs, ModelArgs, OptimizerArgs, RewardArgs, RunArgs
from udpo.env.backends.base import Backend
from udpo.training import autosize, checkpointing
from udpo.training.callbacks import EvalCallback
from udpo.training.data import TrainingData, check_context, load_training_data
from udpo.training.errors import explain_oom
from udpo.training.evaluation import HeldOutEvaluation
from udpo.training.replay import RunReplay
from udpo.training.rollouts import Rollouts
from udpo.training.run_env import RunEnvironment
from udpo.training.update import Updater

if TYPE_CHECKING:
    from udpo.algorithms.critic import Critic
    from udpo.training.policy import LoraSettings, MultiAgentPolicy


@dataclass
class Parts:
    """What :func:`build_parts` builds: ``config`` (resolved), the ``reward_functions`` (user terms), the
    ``data``, the team (``policy``, ``critic``), the ``updater``, the ``rollouts``, the held-out
    ``evaluation``, and the ``update_plan``: the update's sizes and the estimate behind them
    (``benchmarks/iteration.py`` compares its peaks with it)."""

    config: TrainConfig
    reward_functions: list[RewardFunction]
    data: TrainingData
    policy: MultiAgentPolicy
    critic: Critic | None
    updater: Updater
    rollouts: Rollouts
    evaluation: HeldOutEvaluation
    update_plan: autosize.UpdatePlan


def build_parts(
    config: TrainConfig,
    env: RunEnvironment,
    backend: Backend | None = None,
    *,
    eval_callbacks: Sequence[EvalCallback] = (),
    model: Any = None,
    tokenizer: Any = None,
    lora: LoraSettings | None = None,
    reward_functions: Sequence[RewardFunction] | None = None,
) -> Parts:
    """The run's parts, in the order of the module docstring. backend, model, tokenizer, lora,
    reward_functions: what a :class:`~udpo.training.trainer.Trainer` was given instead of the config's;
    eval_callbacks: what the evaluation runs after its debates (:func:`udpo.training.callbacks.eval_callbacks_for`)."""
    critic_needed = algorithm_class(config.algorithm).needs_critic
    checkpointing.check_run_dir(config, deepspeed=env.deepspeed, critic=critic_needed)
    rewards = (
        list(reward_functions)
        if reward_functions is not None
        else load_reward_functions(config.reward_functions, config.reward_weights, config.reward_format)
    )
    data = load_training_data(
        config.group(DebateArgs),
        config.group(OptimizerArgs),
        config.group(RunArgs),
        calibrates=not config.coefficients_explicit,
    )
    widths = check_context(config.group(ModelArgs), config.group(DebateArgs), data.task, data.questions)
    env.seed_initialization()  # identical initialization on every process
    policy = build_team(config, env, model, tokenizer, lora)
    critic = None
    if critic_needed:
        from udpo.algorithms.critic import Critic

        critic = Critic(policy)
    config, plan = resolve(config, env, policy, widths)
    env.seed_sampling()  # different sampling per process from here on
    updater = build_updater(config, env, data.total_iterations, policy, critic)
    rollouts = Rollouts(
        config.group(ModelArgs),
        config.group(DebateArgs),
        config.group(RunArgs),
        data.task,
        policy,
        env.rank,
        env.world,
        backend,
        engine=updater.engine,
        card_share=env.gpu_share,
    )
    evaluation = HeldOutEvaluation(
        data.eval_set, eval_callbacks, config.eval_steps, data.total_iterations, env.folder, env.main
    )
    return Parts(config, rewards, data, policy, critic, updater, rollouts, evaluation, plan)


def build_team(
    config: TrainConfig,
    env: RunEnvironment,
    model: Any = None,
    tokenizer: Any = None,
    lora: LoraSettings | None = None,
) -> MultiAgentPolicy:
    """The team (one base, one adapter per agent) on the environment's device: the base ``model`` (and
    its ``tokenizer``) when given, else ``config.model``; ``lora`` when given, else ``config.lora_*``."""
    from udpo.training.policy import LoraSettings, MultiAgentPolicy

    settings = lora or LoraSettings(
        config.lora_r, config.lora_alpha, config.lora_dropout, config.lora_target_modules
    )
    with explain_oom(config):
        policy = MultiAgentPolicy(
            model=config.model if model is None else model,
            tokenizer=tokenizer,
            n_agents=config.n_agents,
            lora=settings,
            shared_adapter=config.shared_adapter,
            agent_models=config.agent_models,
            dtype=config.dtype,
            device=env.device,
            reference=config.reference,
        )
    policy.symmetric_passes = env.world > 1
    return policy


def build_updater(
    config: TrainConfig,
    env: RunEnvironment,
    iterations: int,
    policy: MultiAgentPolicy,
    critic: Critic | None,
) -> Updater:
    """The optimizer and schedule of ``policy``'s adapters (and the ``critic``'s) over ``iterations``
    iterations of ``update_epochs`` steps, in the environment's processes and precision."""
    total_steps = iterations * config.update_epochs
    return Updater(
        config.group(OptimizerArgs),
        config.group(AlgorithmArgs),
        policy,
        env.accelerator,
        total_steps=total_steps,
        warmup_steps=config.warmup_for(total_steps),
        temperature=config.temperature,
        critic=critic,
        deepspeed=env.deepspeed,
        bf16=env.bf16,
    )


def resolve(
    config: TrainConfig, env: RunEnvironment, policy: MultiAgentPolicy, widths: list[int] | None = None
) -> tuple[TrainConfig, autosize.UpdatePlan]:
    """``config`` resolved whole: the update's auto sizes measured on the loaded team and checked
    (:func:`udpo.training.autosize.resolve`; ``widths``: each round's longest row, from
    :func:`udpo.training.data.check_context`), announced on the main process and applied to the team; and
    the plan behind the sizes."""
    models = list(policy.models.values())
    resolved, plan = autosize.resolve(
        config, models, env.world, env.device, share=env.gpu_share, widths=widths
    )
    if env.main:
        auto = [k for k in autosize.CPU_DEFAULTS if getattr(config, k) is None]
        print(plan.describe(auto), file=sys.stderr)
    if resolved.gradient_checkpointing:
        policy.enable_gradient_checkpointing()
    return resolved, plan


def algorithm_parts(
    config: TrainConfig,
    calibration: dict[str, Any],
    critic: Critic | None,
    reward_functions: list[RewardFunction],
) -> tuple[Algorithm, RunReplay | None]:
    """The algorithm, and with ``replay`` the replay buffer (its priority uses the base weights), built
    from a calibration record."""
    algorithm = build_algorithm(
        config.group(AlgorithmArgs),
        config.group(RewardArgs),
        calibration,
        critic,
        reward_functions,
        config.seed,
    )
    if not config.replay:
        return algorithm, None
    return algorithm, RunReplay(
        config.group(AlgorithmArgs), config.group(RewardArgs), config.seed, calibration
    )
