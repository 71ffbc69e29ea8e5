"""Training configuration: one dataclass of six field groups, every field documented, parsed with TRL's
``TrlParser``.

A recipe is a YAML file of ``field: value`` lines; command-line flags override it::

    python train_udpo.py --config recipes/quickstart.yaml --learning_rate 2e-5

Unknown keys (in the file or on the command line) and incompatible settings raise :class:`ConfigError`
naming the key, the file and what to do. ``python -m udpo.config`` prints the reference table that
docs/training.md embeds.
"""

from __future__ import annotations

import argparse
import difflib
import json
import math
import os
import sys
import types
import typing
from collections.abc import Sequence
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

#: the names of udpo.algorithms.ALGORITHMS (a test keeps them equal): the config is checked before torch loads
ALGORITHMS = ("udpo", "mappo", "rmaac")
TRACKERS = ("none", "jsonl", "wandb", "tensorboard")
#: per-agent reward coefficients (paper eq. 4 and 6) that may be given explicitly instead of calibrated
COEFFICIENTS = ("alpha", "beta", "gamma", "lambda_", "eta")
#: ablation name -> the coefficient it zeroes ("w/o intra" sets every alpha_i to 0, ...)
ABLATIONS = {"intra": "alpha", "inter": "beta", "sys": "gamma"}


class ConfigError(ValueError):
    """A configuration value is unknown, malformed or incompatible; the message names the key."""


def _f(default: Any, help: str, **kw) -> Any:
    """A dataclass field with a default and the help text shown by ``--help`` and in the docs."""
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"help": help, **kw})
    return field(default=default, metadata={"help": help, **kw})


@dataclass
class ModelArgs:
    """The team's model and the engine that samples it: base model, dtype, LoRA, backend."""

    model: str = _f("smollm2-135m-instruct", "Base model: alias, local folder or Hub id.")
    agent_models: list[str] | None = _f(
        None, "Heterogeneous teams: one base model per agent (N entries); default: `model` for all."
    )
    dtype: str = _f(
        "auto",
        "Weights dtype: auto (bf16 on GPU and on CPUs with bf16 matrix units, else fp32), bf16, fp16 or fp32.",
    )
    bf16: bool | None = _f(None, "bf16 autocast (default: on when the weights are bf16).")
    gradient_checkpointing: bool = _f(False, "Recompute activations in the backward pass to save memory.")
    lora_r: int = _f(8, "LoRA rank.")
    lora_alpha: int = _f(16, "LoRA scaling numerator (scale = lora_alpha / lora_r).")
    lora_dropout: float = _f(0.0, "Dropout on the LoRA input.")
    lora_target_modules: list[str] = _f(
        ["q_proj", "k_proj", "v_proj", "o_proj"], "Modules that get adapters."
    )
    shared_adapter: bool = _f(False, "All agents share one adapter (parameter sharing) instead of one each.")
    backend: Literal["hf", "vllm", "openai"] = _f(
        "hf",
        "Rollout engine. hf: the policy's own model (on-policy, no sync). vllm: a local engine that gets "
        "new LoRA ids after each update. openai: an OpenAI-compatible server that can load LoRA adapters.",
    )
    base_url: str | None = _f(None, "Server URL for backend: openai.")
    vllm_gpu_memory_utilization: float | None = _f(
        None,
        "vLLM: share of GPU memory for weights and KV cache (training default 0.3: the engine shares "
        "each GPU with the trainer; udpo debate/eval default 0.9).",
    )
    vllm_kv_cache_gib: float | None = _f(
        None, "vLLM: explicit KV-cache size in GiB (default on CPU: a tenth of host RAM)."
    )
    vllm_max_model_len: int = _f(4096, "vLLM: prompt + completion tokens per request.")
    vllm_max_loras: int | None = _f(None, "vLLM: adapters resident at once (default: one per agent).")

    def check(self) -> None:
        """The rules on these fields alone (ConfigError naming the field)."""
        from udpo.env.backends.base import DTYPE_NAMES as DTYPES  # without torch: checked before it loads

        _check_ranges(
            self,
            positive=("lora_r", "lora_alpha", "vllm_max_model_len"),
            fractions=("lora_dropout",),
            optional_positive=("vllm_max_loras",),
            nonempty=("model",),
            entries=("agent_models", "lora_target_modules"),
        )
        if self.dtype != "auto" and self.dtype not in DTYPES:
            raise ConfigError(f"dtype must be auto, {', '.join(DTYPES)}; got {self.dtype!r}")
        util = self.vllm_gpu_memory_utilization
        if util is not None and not 0 < util <= 1:
            raise ConfigError(f"vllm_gpu_memory_utilization must be in (0, 1], got {util}")
        kv = self.vllm_kv_cache_gib
        if kv is not None and not (kv > 0 and math.isfinite(kv)):
            raise ConfigError(f"vllm_kv_cache_gib must be a finite number > 0, got {kv}")
        if self.agent_models is not None and self.shared_adapter and len(set(self.agent_models)) > 1:
            raise ConfigError("shared_adapter: true needs one base model; agent_models lists several")
        if self.backend == "openai" and not self.base_url:
            raise ConfigError(
                "backend: openai needs base_url (an OpenAI-compatible server that loads LoRA adapters)"
            )
        if self.base_url and self.backend != "openai":
            raise ConfigError(f"base_url is only used by backend: openai (backend is {self.backend!r})")


@dataclass
class DebateArgs:
    """What is debated and how: the task and its data, the team, the rounds, sampling, the protocol."""

    task: str = _f(
        "arithmetic",
        "Task: gsm8k, truthfulqa, commonsenseqa, arithmetic, du-arithmetic, realmistake, a name given to "
        "udpo.env.tasks.register_task, or package.module:TaskClass.",
    )
    task_options: dict | str | None = _f(
        None,
        "Task constructor options, e.g. {difficulty: [1, 3], n_questions: 200} (JSON on the command line).",
    )
    data_path: str | None = _f(
        None,
        "Data file or folder for the task (default: $UDPO_DATA_DIR, else ../shared/data beside the checkout).",
    )
    train_split: str = _f("train", "Split the training and warm-up questions come from.")
    eval_split: str = _f("test", "Split of the held-out evaluation questions.")
    max_train_questions: int | None = _f(None, "Use at most this many training questions (default: all).")
    n_agents: int = _f(3, "N: agents per debate.")
    rounds: int = _f(2, "T: debate rounds after the independent round 0.")
    profiles: list[str] | None = _f(
        None, "Agent system prompts: one for every agent or N entries (default: the task's profile)."
    )
    temperature: float = _f(0.7, "Sampling temperature of rollouts and evaluation (0: greedy).")
    top_p: float = _f(
        1.0,
        "Nucleus sampling mass in (0, 1]. The trainer's log-probs are those of logits / temperature over the "
        "whole vocabulary, as in TRL and verl: below 1 they ignore the truncation.",
    )
    max_tokens: int = _f(256, "Maximum new tokens per response.")
    debate_batch_size: int = _f(16, "Questions debated together (one backend call per round).")
    chat_template_kwargs: dict | str | None = _f(
        None,
        "Extra arguments of the model's chat template, e.g. {enable_thinking: false} for Qwen3 (JSON on the "
        "command line); passed to every backend.",
    )
    protocol: Literal["standard", "sparse", "random", "dig", "digra", "interventions"] = _f(
        "standard",
        "Who reads whom in rollouts and evaluations: standard (all peers), sparse, random, dig, digra "
        "(information-gain-ratio topology) or interventions (pruning and refutation); docs/protocols.md.",
    )
    protocol_options: dict | str | None = _f(
        None,
        "Options of the protocol, e.g. {alpha: 0.2, entropy_model: null} for digra or {degree: 0.5} for "
        "sparse (JSON on the command line); docs/protocols.md lists them.",
    )

    def check(self) -> None:
        """The rules on these fields alone (ConfigError naming the field): sizes, the task and its
        splits, the protocol's options."""
        from udpo.env.debate import check_debate_size

        _check_ranges(
            self,
            positive=("n_agents", "max_tokens", "debate_batch_size"),
            nonnegative=("rounds", "temperature"),
            optional_positive=("max_train_questions",),
            nonempty=("task", "train_split", "eval_split"),
        )
        try:
            check_debate_size(self.n_agents, self.rounds, self.max_tokens)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1] (1: no nucleus truncation), got {self.top_p}")
        self._check_task()
        if self.profiles is not None and len(self.profiles) not in (1, self.n_agents):
            raise ConfigError(
                f"profiles needs 1 value (all agents) or n_agents={self.n_agents} values, got {len(self.profiles)}"
            )
        try:
            protocol = self.protocol_config()
        except (TypeError, ValueError) as e:
            raise ConfigError(f"protocol_options: {e}") from None
        if protocol.inject is not None:
            raise ConfigError(
                "protocol_options: inject replaces round-0 responses to measure hallucination propagation "
                "(udpo debate --inject); it has no token ids to train on"
            )

    def _check_task(self) -> None:
        """The task exists (built-in, registered or ``module:attr``), takes ``task_options`` and has the
        two splits."""
        from udpo.env.tasks import get_task, task_parameters

        try:
            takes = task_parameters(self.task)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"task: {e}") from None
        options = self.task_options or {}
        unknown = [k for k in options if k not in takes]
        if unknown:
            raise ConfigError(
                f"task_options: task {self.task} takes {', '.join(takes) if takes else 'no options'}, "
                f"not {', '.join(map(str, unknown))}"
            )
        try:
            task = get_task(self.task, **options)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"task_options {options!r:.200}: {e}") from None
        for name in ("train_split", "eval_split"):
            if getattr(self, name) not in task.splits:
                raise ConfigError(
                    f"{name}: task {self.task} has no split {getattr(self, name)!r}; "
                    f"choose from {', '.join(task.splits)}"
                )

    def protocol_config(self):
        """The debate protocol of rollouts and evaluations (a ``udpo.env.protocols.ProtocolConfig``)."""
        from udpo.env.protocols.config import ProtocolConfig

        return ProtocolConfig.from_options(self.protocol, self.protocol_options)


@dataclass
class RewardArgs:
    """UDPO's rewards: the uncertainty terms, their per-agent coefficients (given or calibrated), ablations, user terms."""

    reward_scope: Literal["trajectory", "agent"] = _f(
        "trajectory", "Reward terms per debate (paper) or per agent (each agent's own share)."
    )
    lam: float = _f(0.5, "lam: weight of the flip rate F against belief revision M in U_intra.")
    kappa: float = _f(1.5, "kappa: asymmetry of the calibrated coefficients.")
    alpha: list[float] | None = _f(None, "alpha_i, weight of r_intra: one value or N (default: calibrated).")
    beta: list[float] | None = _f(None, "beta_i, weight of r_inter: one value or N (default: calibrated).")
    gamma: list[float] | None = _f(None, "gamma_i, weight of r_sys: one value or N (default: calibrated).")
    lambda_: list[float] | None = _f(
        None, "lambda_i, weight of r_task: one value or N (default: calibrated)."
    )
    eta: list[float] | None = _f(None, "eta_i, KL anchor weight: one value or N (default: calibrated).")
    alpha_base: float | None = _f(
        None, "alpha_base (with beta_base, gamma_base; default: Cohen's d weights)."
    )
    beta_base: float | None = _f(None, "beta_base (with alpha_base, gamma_base).")
    gamma_base: float | None = _f(None, "gamma_base (with alpha_base, beta_base).")
    lambda_base: float = _f(1.0, "lambda_base of the calibrated task weight.")
    eta_base: float = _f(0.01, "eta_base of the calibrated KL weight.")
    calibration_file: str | None = _f(
        None,
        "A calibration.json written by another run or by `udpo calibrate` (RUN/calibration.json): udpo uses "
        "its coefficients instead of calibrating, so the runs of a study share one calibration (explicit "
        "values and ablations still apply; no warm-up debates). The baselines have no coefficients.",
    )
    ablations: list[str] = _f(
        [],
        "Ablations 'intra', 'inter', 'sys' (paper's w/o rows): alpha_i, beta_i or gamma_i set to 0 for all agents.",
    )
    reward_functions: list[str] = _f(
        [],
        "Your own reward terms: 'package.module:function' callables (trajectory, agent) -> float, each "
        "weighted by reward_weights and added to every r_i (see docs/training.md).",
    )
    reward_weights: list[float] = _f([], "One weight per reward_functions entry (default: 1 each).")

    def check(self) -> None:
        """The rules on these fields alone (ConfigError naming the field)."""
        _check_ranges(self, nonnegative=("kappa", "lambda_base", "eta_base"))
        if not 0 <= self.lam <= 1:
            raise ConfigError(f"lam must be in [0, 1], got {self.lam}")
        # weights without named functions weigh the callables given to udpo.UDPOTrainer (checked there,
        # and by parse_config for recipes and the command line, which can only name functions)
        if self.reward_functions and len(self.reward_weights) not in (0, len(self.reward_functions)):
            raise ConfigError(
                f"reward_weights needs one weight per reward_functions entry ({len(self.reward_functions)}), "
                f"got {len(self.reward_weights)}"
            )
        if any(not math.isfinite(w) for w in self.reward_weights):
            raise ConfigError(f"reward_weights must be finite numbers, got {self.reward_weights}")
        for spec in self.reward_functions:
            if spec.count(":") != 1 or not all(spec.split(":")):
                raise ConfigError(f"reward_functions entry {spec!r} must look like 'package.module:function'")
        for name in ("alpha_base", "beta_base", "gamma_base"):
            value = getattr(self, name)
            if value is not None and not (value >= 0 and math.isfinite(value)):
                raise ConfigError(f"{name} must be a finite number >= 0, got {value}")
        for name in COEFFICIENTS:
            value = getattr(self, name)
            if value is not None and any(not (v >= 0 and math.isfinite(v)) for v in value):
                raise ConfigError(f"{name} values must be finite and >= 0, got {value}")
        unknown = [a for a in self.ablations if a not in ABLATIONS]
        if unknown:
            raise ConfigError(f"unknown ablation(s) {unknown}; choose from {sorted(ABLATIONS)}")
        given = [ABLATIONS[a] for a in self.ablations if getattr(self, ABLATIONS[a]) is not None]
        if given:
            raise ConfigError(f"ablations {self.ablations} zero {given}: do not also give {given} explicitly")
        bases = {k: getattr(self, k) for k in ("alpha_base", "beta_base", "gamma_base")}
        if len({v is None for v in bases.values()}) > 1:
            missing = ", ".join(k for k, v in bases.items() if v is None)
            raise ConfigError(
                f"give alpha_base, beta_base and gamma_base together (missing: {missing}), or none "
                f"of them for Cohen's d weights"
            )

    @property
    def coefficients_explicit(self) -> bool:
        """All five per-agent coefficients are given, so no warm-up calibration is needed."""
        return all(getattr(self, k) is not None for k in COEFFICIENTS)

    @property
    def base_weights(self) -> tuple[float, float, float] | None:
        """(alpha_base, beta_base, gamma_base) when given explicitly, else None (Cohen's d)."""
        if self.alpha_base is None:
            return None
        return (self.alpha_base, self.beta_base, self.gamma_base)  # type: ignore[return-value]


@dataclass
class AlgorithmArgs:
    """The policy-optimization algorithm: its objective, advantages, reference, critic, sampler correction, replay."""

    algorithm: Literal["udpo", "mappo", "rmaac"] = _f(
        "udpo", "Advantage and loss: udpo (mappo, rmaac: baselines)."
    )
    clip_eps: float = _f(0.2, "eps: the ratio is clipped to [1 - eps, 1 + eps].")
    ratio_level: Literal["trajectory", "token"] = _f(
        "trajectory", "Importance ratio per debate (paper) or per token (PPO/GRPO style)."
    )
    baseline: Literal["batch", "group"] = _f(
        "batch", "Advantage baseline b_i: batch mean of r_i, or mean over the debates of the same question."
    )
    advantage_norm: Literal["auto", "none", "batch", "agent"] = _f(
        "auto",
        "Advantage normalisation, every algorithm: none; batch (mean 0, std 1 over the batch); agent (each "
        "agent's advantages by its own mean and std, as Dr. MAS: agents' reward scales differ). auto: batch "
        "for mappo and rmaac, none for udpo.",
    )
    loss_aggregation: Literal["auto", "sum", "mean"] = _f(
        "auto",
        "Length normalisation, every algorithm: an agent's surrogate and KL in one debate summed over its "
        "tokens (sum) or divided by their number (mean). auto: sum at ratio_level trajectory (udpo), mean "
        "at ratio_level token and for mappo and rmaac.",
    )
    kl_loss: Literal["k3", "k2"] = _f(
        "k3",
        "Per-token KL loss, r = logp_ref - logp_theta: k3 = exp(r) - r - 1 (as GRPO; its gradient is that of "
        "KL(ref || theta)) or k2 = r^2 / 2 (its gradient is that of KL(theta || ref)).",
    )
    reference: Literal["base", "lagged"] = _f(
        "base", "KL reference: the base model (adapters off) or a lagged snapshot of each adapter."
    )
    ref_update_interval: int = _f(0, "reference: lagged: refresh the snapshot every this many iterations.")
    update_epochs: int = _f(1, "Optimizer passes over each iteration's debates.")
    dual_clip: float = _f(
        3.0,
        "c of dual clipping (Ye et al. 2020): for A < 0 the objective is max(min(rho A, clip(rho) A), c A), "
        "bounding stale samples' gradients; > 1, or 0 to turn it off.",
    )
    behavior_logprobs: Literal["rollout", "recompute"] = _f(
        "recompute",
        "Denominator of the ratio: log-probs recorded by the rollout engine, or recomputed by the trainer "
        "before the first update (removes engine/trainer numeric mismatch).",
    )
    is_correction: Literal["none", "tis", "mask"] = _f(
        "none",
        "behavior_logprobs: recompute with engine-recorded log-probs: weight each sample's surrogate by the "
        "truncated importance ratio min(exp(logp_trainer - logp_engine), is_cap) (tis: per token, or per "
        "debate at ratio_level trajectory), or drop debates whose ratio leaves [1/is_cap, is_cap] (mask).",
    )
    is_cap: float = _f(2.0, "C of is_correction: the truncation (tis) or the mask's bound (mask); > 1.")
    w_consensus: float = _f(
        0.5,
        "mappo, rmaac: team reward r_task + w_consensus (1 - C_T), C_T the final round's pairwise conflict.",
    )
    gae_gamma: float = _f(1.0, "mappo, rmaac: discount over rounds in GAE.")
    gae_lambda: float = _f(0.95, "mappo, rmaac: lambda of GAE over rounds.")
    critic_learning_rate: float | None = _f(
        None,
        "mappo, rmaac: the critic's peak AdamW learning rate, same schedule (default: 10 x learning_rate).",
    )
    critic_epochs: int = _f(
        1, "mappo, rmaac: the critic's passes (optimizer steps of its own) over each iteration's debates."
    )
    critic_warmup_epochs: int = _f(
        0,
        "mappo, rmaac: warm start: before training the baselines debate the warm-up questions (as UDPO's "
        "calibration does) and fit the critic this many passes on them (0: no warm start).",
    )
    adversary_budget: int = _f(
        1, "rmaac: peers whose answer the adversary may swap, per agent and round (0: no adversary)."
    )
    replay: bool = _f(False, "Uncertainty-driven replay of past debates (paper appendix A.3).")
    replay_capacity: int = _f(256, "Debates kept in the replay buffer (most recent).")
    replay_fraction: float = _f(0.25, "Share of each update batch drawn from the buffer.")
    replay_eta: float = _f(1.0, "eta_replay: sampling probability proportional to (U + 1e-3) ** eta_replay.")
    replay_beta: float = _f(1.0, "beta_is: exponent of the importance-sampling correction.")
    replay_refresh_interval: int = _f(
        0, "Re-debate the buffer's questions with the current policy every this many iterations (0: never)."
    )

    def check(self) -> None:
        """The rules on these fields alone (ConfigError naming the field)."""
        _check_ranges(
            self,
            positive=("update_epochs", "critic_epochs", "replay_capacity"),
            nonnegative=(
                "ref_update_interval",
                "replay_refresh_interval",
                "w_consensus",
                "replay_eta",
                "replay_beta",
                "critic_warmup_epochs",
            ),
            fractions=("replay_fraction",),
        )
        if self.algorithm not in ALGORITHMS:
            raise ConfigError(f"algorithm: {self.algorithm!r} is not one of {', '.join(ALGORITHMS)}")
        if not 0 < self.clip_eps < 1:
            raise ConfigError(f"clip_eps must be in (0, 1), got {self.clip_eps}")
        if not (self.dual_clip == 0 or (self.dual_clip > 1 and math.isfinite(self.dual_clip))):
            raise ConfigError(f"dual_clip must be 0 (off) or a finite number > 1, got {self.dual_clip}")
        if self.algorithm == "udpo":
            critic_only = {
                "critic_learning_rate": self.critic_learning_rate is not None,
                "critic_epochs": self.critic_epochs != 1,
                "critic_warmup_epochs": self.critic_warmup_epochs > 0,
            }
            given = [name for name, on in critic_only.items() if on]
            if given:
                raise ConfigError(f"{', '.join(given)}: only mappo and rmaac have a critic")
        lr = self.critic_learning_rate
        if lr is not None and not (lr > 0 and math.isfinite(lr)):
            raise ConfigError(f"critic_learning_rate must be a finite number > 0, got {lr}")
        if not (self.is_cap > 1 and math.isfinite(self.is_cap)):
            raise ConfigError(f"is_cap must be a finite number > 1, got {self.is_cap}")
        if self.is_correction != "none" and self.behavior_logprobs != "recompute":
            raise ConfigError(
                f"is_correction: {self.is_correction} weights the trainer's recomputed ratio by the "
                f"trainer/engine ratio; with behavior_logprobs: rollout the ratio already divides by the "
                f"engine's probabilities: use behavior_logprobs: recompute"
            )
        for name in ("gae_gamma", "gae_lambda"):
            if not 0 <= getattr(self, name) <= 1:
                raise ConfigError(f"{name} must lie in [0, 1], got {getattr(self, name)}")
        if self.reference == "lagged" and self.ref_update_interval < 1:
            raise ConfigError(
                "reference: lagged needs ref_update_interval >= 1 (iterations between refreshes)"
            )
        if self.reference == "base" and self.ref_update_interval > 0:
            raise ConfigError("ref_update_interval only applies to reference: lagged (reference is 'base')")
        if self.replay and self.replay_fraction == 0:
            raise ConfigError("replay: true with replay_fraction: 0 never replays; set replay_fraction > 0")
        if not self.replay and self.replay_refresh_interval > 0:
            raise ConfigError("replay_refresh_interval needs replay: true")


@dataclass
class OptimizerArgs:
    """How much is trained and how: iterations and batches, AdamW and its schedule, gradient clipping, log-prob passes."""

    num_train_epochs: float = _f(10.0, "Passes over the training questions.")
    max_iterations: int | None = _f(None, "Stop after this many iterations (overrides num_train_epochs).")
    questions_per_iteration: int = _f(32, "Questions debated per iteration, over all processes.")
    debates_per_question: int = _f(1, "Debates sampled per training question (>= 2 for baseline: group).")
    gradient_accumulation_steps: int = _f(
        1, "Split each process's update batch into this many micro-batches (same update, less memory)."
    )
    learning_rate: float = _f(1e-5, "AdamW learning rate (peak, after warm-up).")
    weight_decay: float = _f(0.0, "AdamW weight decay.")
    adam_beta1: float = _f(0.9, "AdamW beta1.")
    adam_beta2: float = _f(0.999, "AdamW beta2.")
    adam_epsilon: float = _f(1e-8, "AdamW epsilon.")
    warmup_ratio: float = _f(
        0.1,
        "Linear learning-rate warm-up as a fraction of the run's optimizer steps (paper: 500 steps of a "
        "long GPU run; a warm-up as long as the run would never reach the peak rate).",
    )
    warmup_steps: int = _f(0, "Warm-up as a number of optimizer steps; > 0 overrides warmup_ratio.")
    lr_scheduler_type: Literal["cosine", "linear", "constant"] = _f(
        "cosine", "Decay after warm-up (transformers' get_scheduler name; constant keeps the warm-up)."
    )
    max_grad_norm: float = _f(1.0, "Clip each agent's gradient norm to this (0: no clipping).")
    logprob_batch_size: int = _f(8, "Rows (sequences) per forward pass at most when scoring log-probs.")
    logprob_token_budget: int = _f(
        4096,
        "Positions per forward pass at most when scoring log-probs (rows x longest row; rows are sorted by "
        "length, so padding stays small; a longer row runs alone). Lower it to save memory.",
    )

    def check(self) -> None:
        """The rules on these fields alone (ConfigError naming the field)."""
        _check_ranges(
            self,
            positive=(
                "questions_per_iteration",
                "debates_per_question",
                "gradient_accumulation_steps",
                "logprob_batch_size",
                "logprob_token_budget",
            ),
            nonnegative=("warmup_steps", "weight_decay", "max_grad_norm"),
            fractions=("warmup_ratio", "adam_beta1", "adam_beta2"),
        )
        for name in ("learning_rate", "adam_epsilon"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ConfigError(f"{name} must be a finite number > 0, got {value}")
        if self.max_iterations is not None and self.max_iterations < 1:
            raise ConfigError(f"max_iterations must be >= 1, got {self.max_iterations}")
        if self.max_iterations is None and not (
            self.num_train_epochs > 0 and math.isfinite(self.num_train_epochs)
        ):
            raise ConfigError(
                f"num_train_epochs must be a finite number > 0 (or set max_iterations), got "
                f"{self.num_train_epochs}"
            )
        debates = self.questions_per_iteration * self.debates_per_question
        if self.gradient_accumulation_steps > debates:
            raise ConfigError(
                f"gradient_accumulation_steps={self.gradient_accumulation_steps} splits an update of "
                f"{debates} debates (questions_per_iteration x debates_per_question) into more micro-batches "
                f"than it has debates; lower it or raise questions_per_iteration"
            )

    def warmup_for(self, total_steps: int) -> int:
        """Warm-up optimizer steps of a run of ``total_steps``: ``warmup_steps`` if > 0, else
        floor(warmup_ratio x total_steps). A warm-up that would last the whole run is a ConfigError."""
        steps = self.warmup_steps or math.floor(self.warmup_ratio * total_steps)
        if steps and steps >= total_steps:
            raise ConfigError(
                f"warmup_steps={steps} is not shorter than the run's {total_steps} optimizer steps: the "
                f"learning rate would never leave warm-up; lower warmup_steps or use warmup_ratio"
            )
        return steps


@dataclass
class RunArgs:
    """The run around training: warm-up and held-out questions, evaluations, checkpoints, tracking, seed."""

    warmup_fraction: float = _f(
        0.1,
        "Share of the training questions held out for warm-up calibration of the reward coefficients "
        "(never trained on; disjoint from evaluation). 0 needs all five coefficients given explicitly.",
    )
    eval_questions: int = _f(100, "Held-out questions per evaluation (0: no evaluation).")
    eval_question_seed: int | None = _f(
        None,
        "Seed of the held-out questions a generated task (arithmetic) draws (default: seed). Fix it to give "
        "every training seed the same test set.",
    )
    eval_seed: int = _f(
        0,
        "Seed of the held-out evaluation's sampling, set anew before every evaluation (hf backend), so "
        "every evaluation of a run draws the same random numbers; training's own stream resumes untouched.",
    )
    eval_steps: int = _f(50, "Evaluate every this many iterations (0: only before and after training).")
    eval_at_start: bool = _f(True, "Evaluate the initial policies before training (the 'before' numbers).")
    eval_callbacks: list[str] = _f(
        [],
        "Extra evaluations run at every evaluation: 'module:function' taking (trainer, iteration) -> dict.",
    )
    attack_eval: Literal["none", "autotransform", "autoinject"] = _f(
        "none",
        "At every evaluation also debate the held-out questions under this attack (logged as "
        "eval/attack_<name>/m<m>/...; see docs/attacks.md).",
    )
    attack_eval_m: list[int] = _f(
        [1], "Attack evaluation: numbers of compromised agents, the last m each time."
    )
    attack_eval_attacker: str = _f(
        "base",
        "Attack evaluation: who writes the attack: base (the team's base model), builtin (no LLM) or a "
        "model (loaded with the hf backend).",
    )
    output_dir: str = _f("runs/udpo", "Run directory: checkpoints, metrics.jsonl, trajectories, evaluations.")
    save_steps: int = _f(50, "Write a checkpoint every this many iterations (and at the end).")
    save_total_limit: int | None = _f(None, "Keep only the newest this many checkpoints (default: all).")
    resume: str | None = _f(None, "Continue from a checkpoint folder, or 'latest' in output_dir.")
    report_to: list[str] = _f(["jsonl"], "Trackers: jsonl (metrics.jsonl only), wandb, tensorboard, or none.")
    run_name: str | None = _f(None, "Name of the run in wandb / tensorboard (default: output_dir's name).")
    seed: int = _f(0, "Seed of question order, sampling and initialization.")
    progress: bool = _f(True, "Show tqdm progress bars.")

    def check(self) -> None:
        """The rules on these fields alone (ConfigError naming the field)."""
        _check_ranges(
            self,
            positive=("save_steps",),
            nonnegative=("eval_questions", "eval_steps"),
            fractions=("warmup_fraction",),
            optional_positive=("save_total_limit",),
            nonempty=("output_dir",),
        )
        for name in ("seed", "eval_seed", "eval_question_seed"):
            if getattr(self, name) is not None and not 0 <= getattr(self, name) < 2**31:
                raise ConfigError(f"{name} must be in [0, 2**31), got {getattr(self, name)}")
        if self.resume is not None and not self.resume.strip():
            raise ConfigError("resume may not be empty: a checkpoint folder, or 'latest' in output_dir")
        unknown = [r for r in self.report_to if r not in TRACKERS]
        if unknown:
            raise ConfigError(f"report_to: unknown tracker(s) {unknown}; choose from {', '.join(TRACKERS)}")
        if "none" in self.report_to and len(self.report_to) > 1:
            raise ConfigError(f"report_to: 'none' cannot be combined with other trackers ({self.report_to})")
        for spec in self.eval_callbacks:
            if spec.count(":") != 1 or not all(spec.split(":")):
                raise ConfigError(f"eval_callbacks entry {spec!r} must look like 'package.module:function'")
        if self.attack_eval != "none":
            if self.eval_questions == 0:
                raise ConfigError(f"attack_eval: {self.attack_eval} needs eval_questions > 0")
            if not self.attack_eval_attacker:
                raise ConfigError("attack_eval_attacker must be 'base', 'builtin' or a model name")


@dataclass
class TrainConfig(RunArgs, OptimizerArgs, AlgorithmArgs, RewardArgs, DebateArgs, ModelArgs):
    """Everything a training run needs (every field of ``udpo train --help`` and of a recipe), in six
    groups, each a dataclass that checks its own fields (``check``): :class:`ModelArgs`,
    :class:`DebateArgs`, :class:`RewardArgs`, :class:`AlgorithmArgs`, :class:`OptimizerArgs`,
    :class:`RunArgs`. :meth:`validate` runs the six checks, then the rules that span groups.

    Defaults follow the paper (appendix A.1) where it says something: AdamW, lr 1e-5, 32 debates
    per update, cosine decay, gradient-norm clip 1.0, 10 epochs; the warm-up is 10% of the run's steps
    (``warmup_ratio``: the paper's 500 steps exceed a whole run of some tasks).
    """

    def __post_init__(self) -> None:
        _coerce_types(self)
        self.validate()

    def validate(self) -> None:
        """Raise ConfigError for out-of-range values and incompatible combinations."""
        for group in GROUPS:
            group.check(self)
        self._check_across()

    def _check_across(self) -> None:
        """The rules that span groups: per-agent lists against ``n_agents``, what an algorithm,
        backend or protocol cannot do, what calibration and evaluation need."""
        n = self.n_agents
        if self.max_iterations is not None:
            self.warmup_for(self.max_iterations * self.update_epochs)  # a warm-up as long as the run
        for name in COEFFICIENTS:
            value = getattr(self, name)
            if value is not None and len(value) not in (1, n):
                raise ConfigError(
                    f"{name} needs 1 value (all agents) or n_agents={n} values, got {len(value)}"
                )
        if self.agent_models is not None and len(self.agent_models) != n:
            raise ConfigError(f"agent_models needs n_agents={n} entries, got {len(self.agent_models)}")
        if self.algorithm != "udpo":
            udpo_only = {
                "replay": self.replay,
                "ablations": self.ablations,
                "reward_functions": self.reward_functions,
                "ratio_level: token": self.ratio_level == "token",
            }
            given = [name for name, on in udpo_only.items() if on]
            if given:
                raise ConfigError(
                    f"algorithm: {self.algorithm} trains on the team reward with per-token ratios and GAE; "
                    f"{', '.join(given)} belong to udpo"
                )
            if self.eta is not None and len(self.eta) != 1:
                raise ConfigError(
                    f"algorithm: {self.algorithm} takes one eta (its KL weight), got {self.eta}"
                )
        if self.adversary_budget < 0 or self.adversary_budget >= max(n, 1):
            raise ConfigError(
                f"adversary_budget must be in 0..n_agents-1 = 0..{n - 1}, got {self.adversary_budget}"
            )
        minimum = self.max_tokens * (self.rounds * n + 1)
        if self.backend == "vllm" and minimum > self.vllm_max_model_len:
            raise ConfigError(
                f"vllm_max_model_len={self.vllm_max_model_len} cannot hold a debate of n_agents={n}, "
                f"rounds={self.rounds}, max_tokens={self.max_tokens}: the last round's prompt carries the "
                f"agent's {self.rounds} earlier answers and {self.rounds} x {n - 1} peer answers "
                f"({minimum} tokens at max_tokens each, before the question); raise vllm_max_model_len or "
                f"lower max_tokens"
            )
        if self.critic_warmup_epochs > 0 and self.warmup_fraction == 0:
            raise ConfigError(
                "critic_warmup_epochs > 0 fits the critic on warm-up debates: set warmup_fraction > 0"
            )
        if (
            self.warmup_fraction == 0
            and not self.coefficients_explicit
            and self.algorithm == "udpo"
            and self.calibration_file is None
        ):
            missing = ", ".join(k for k in COEFFICIENTS if getattr(self, k) is None)
            raise ConfigError(
                f"warmup_fraction: 0 leaves no warm-up debates to calibrate {missing}; "
                f"set warmup_fraction > 0 or give all of {', '.join(COEFFICIENTS)}"
            )
        if self.train_split == self.eval_split and self.eval_questions > 0:
            raise ConfigError(
                f"train_split and eval_split are both {self.train_split!r}: evaluation must be held out; "
                f"pick another eval_split (or eval_questions: 0)"
            )
        if self.baseline == "group" and self.debates_per_question < 2:
            raise ConfigError(
                "baseline: group averages over the debates of one question; "
                "set debates_per_question >= 2 or use baseline: batch"
            )
        protocol = self.protocol_config()
        if protocol.name in ("dig", "digra") and self.backend != "hf" and protocol.entropy_model is None:
            raise ConfigError(
                f"protocol: {protocol.name} scores entropies from logits, which backend {self.backend!r} "
                f"does not give; set protocol_options: {{entropy_model: <hf model>}} or backend: hf"
            )
        if self.attack_eval != "none":
            bad = [m for m in self.attack_eval_m if not 1 <= m < n]
            if bad or not self.attack_eval_m:
                raise ConfigError(
                    f"attack_eval_m: each m must be in 1..n_agents-1 = 1..{n - 1} (one agent stays honest), "
                    f"got {self.attack_eval_m}"
                )

    def check_paths(self) -> None:
        """Check the settings that name things on disk, before anything loads: ``output_dir`` can be a
        run folder, ``resume`` names a checkpoint (``latest``: output_dir holds one), and every model name
        can name a model (:func:`udpo.env.models.check_model`). Raises ConfigError naming the setting.

        Called by :func:`parse_config` and by the trainer before it loads a model (the disk can change
        between the two)."""
        from udpo.env.models import ModelNotFoundError, check_model
        from udpo.training import checkpoint_store as ckpt

        out = Path(self.output_dir).expanduser()
        for folder in (out, *out.parents):
            if folder.exists():
                if not folder.is_dir():
                    raise ConfigError(f"output_dir {self.output_dir}: {folder} is a file, not a folder")
                break
        if self.resume is not None:
            try:
                ckpt.resolve(out, self.resume)
            except ckpt.CheckpointError as e:
                raise ConfigError(f"resume: {e}") from None
        if self.calibration_file is not None and not Path(self.calibration_file).expanduser().is_file():
            raise ConfigError(
                f"calibration_file {self.calibration_file}: no such file (a run's RUN/calibration.json)"
            )
        models = {
            "model": self.model,
            **{f"agent_models[{i}]": m for i, m in enumerate(self.agent_models or [])},
        }
        if self.attack_eval != "none" and self.attack_eval_attacker not in ("base", "builtin"):
            models["attack_eval_attacker"] = self.attack_eval_attacker
        for name, model in models.items():
            try:
                check_model(model)
            except ModelNotFoundError as e:
                raise ConfigError(f"{name}: {e}") from None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


#: the field groups, in the order their checks run (and their fields are listed)
GROUPS = (ModelArgs, DebateArgs, RewardArgs, AlgorithmArgs, OptimizerArgs, RunArgs)


def _check_ranges(
    config: Any,
    *,
    positive: Sequence[str] = (),
    nonnegative: Sequence[str] = (),
    fractions: Sequence[str] = (),
    optional_positive: Sequence[str] = (),
    nonempty: Sequence[str] = (),
    entries: Sequence[str] = (),
) -> None:
    """ConfigError for the first field out of its range: integers >= 1 (``positive``; ``optional_positive``
    when not None), finite numbers >= 0, fractions in [0, 1), non-empty strings, lists with entries."""
    for name in positive:
        if getattr(config, name) < 1:
            raise ConfigError(f"{name} must be >= 1, got {getattr(config, name)}")
    for name in nonnegative:
        value = getattr(config, name)
        if not (value >= 0 and math.isfinite(value)):
            raise ConfigError(f"{name} must be a finite number >= 0, got {value}")
    for name in fractions:
        if not 0 <= getattr(config, name) < 1:
            raise ConfigError(f"{name} must be in [0, 1), got {getattr(config, name)}")
    for name in optional_positive:
        value = getattr(config, name)
        if value is not None and value < 1:
            raise ConfigError(f"{name} must be >= 1, got {value}")
    for name in nonempty:
        if not getattr(config, name).strip():
            raise ConfigError(f"{name} may not be empty")
    for name in entries:
        value = getattr(config, name)
        if value is not None and (not value or not all(v.strip() for v in value)):
            raise ConfigError(f"{name} needs at least one entry and no empty entries, got {value}")


# ---------------------------------------------------------------------------------------------
def _types() -> dict[str, Any]:
    return typing.get_type_hints(TrainConfig)


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    """(inner type, whether None is allowed) of ``X | None``."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0], len(args) < len(typing.get_args(tp))
    return tp, False


def _coerce(name: str, value: Any, tp: Any) -> Any:
    """``value`` as type ``tp`` (YAML reads 1e-5 as a string; ints stand in for floats) or ConfigError."""
    inner, optional = _unwrap_optional(tp)
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{name} may not be null")
    origin = typing.get_origin(inner)
    if origin is Literal:
        choices = typing.get_args(inner)
        if value not in choices:
            raise ConfigError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")
        return value
    if origin is list:
        (item,) = typing.get_args(inner)
        if isinstance(value, str | int | float) and not isinstance(value, bool):
            value = [value]  # a single value where a list is expected
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{name} must be a list, got {type(value).__name__} {value!r}")
        return [_coerce(f"{name}[{k}]", v, item) for k, v in enumerate(value)]
    if inner is dict:
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except (json.JSONDecodeError, RecursionError) as e:
                raise ConfigError(f"{name} must be a mapping (JSON on the command line): {e}") from None
        if not isinstance(value, dict):
            raise ConfigError(f"{name} must be a mapping, got {type(value).__name__} {value!r}")
        return value
    if inner is bool:
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
            return value.lower() in ("true", "yes", "1")
        if not isinstance(value, bool):
            raise ConfigError(f"{name} must be true or false, got {value!r}")
        return value
    if inner in (int, float):
        if isinstance(value, bool):
            raise ConfigError(f"{name} must be a number, got {value!r}")
        try:
            number = float(value) if inner is float else int(value)
        except (TypeError, ValueError, OverflowError):
            raise ConfigError(
                f"{name} must be {'a number' if inner is float else 'an integer'}, got {value!r:.80}"
            ) from None
        if inner is int and isinstance(value, float) and value != number:
            raise ConfigError(f"{name} must be an integer, got {value!r}")
        return number
    if inner is str:
        if not isinstance(value, str):
            raise ConfigError(f"{name} must be a string, got {type(value).__name__} {value!r}")
        return value
    return value


def _coerce_types(config: TrainConfig) -> None:
    hints = _types()
    for f in fields(config):
        setattr(config, f.name, _coerce(f.name, getattr(config, f.name), hints[f.name]))


def unknown_key_error(keys: Sequence[str], where: str) -> ConfigError:
    known = [f.name for f in fields(TrainConfig)]
    parts = []
    for key in keys:
        close = difflib.get_close_matches(key, known, n=1)
        parts.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    return ConfigError(
        f"{where}: unknown config key(s) {', '.join(parts)}; "
        f"see `udpo train --help` or docs/training.md for the fields"
    )


class _NoAliases(Exception):
    """A YAML alias (``*name``) in a recipe; carries where it is."""


def _recipe_loader():
    """PyYAML's safe loader without aliases: ``*name`` can expand a few lines into billions of values
    (a "billion laughs" recipe would hang the parser), and a recipe never needs them."""
    import yaml

    class RecipeLoader(yaml.SafeLoader):
        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                raise _NoAliases(self.peek_event().start_mark)
            return super().compose_node(parent, index)

    return RecipeLoader


def read_yaml(path: str | Path, what: str = "a recipe") -> Any:
    """The YAML of a recipe (or a compare config: ``what``), parsed with aliases refused (see
    ``_recipe_loader``) and a byte-order mark accepted; a ConfigError names the file and line."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        return yaml.load(path.read_text(encoding="utf-8-sig"), Loader=_recipe_loader())
    except _NoAliases as e:
        raise ConfigError(
            f"{path}:{e.args[0].line + 1}: YAML aliases (*name) are not allowed in {what}; write the "
            f"value out"
        ) from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        what = " ".join(str(x) for x in (e.context, e.problem) if x)
        raise ConfigError(f"{where}: not valid YAML ({what})") from None
    except (yaml.YAMLError, UnicodeDecodeError, RecursionError) as e:
        raise ConfigError(f"{path}: not valid YAML ({' '.join(str(e).split())[:300]})") from None


def apply_env(recipe: dict[str, Any]) -> None:
    """Set the recipe's ``env:`` variables in this process (before torch reads them)."""
    for key, value in recipe.get("env", {}).items():
        os.environ[key] = str(value)


def load_yaml(path: str | Path) -> dict[str, Any]:
    """The mapping of a recipe file, with unknown keys reported by name (``env:`` sets variables, see
    :func:`apply_env`). An empty file means all defaults."""
    path = Path(path)
    data = read_yaml(path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a recipe must be a mapping of field: value, got {type(data).__name__}")
    known = {f.name for f in fields(TrainConfig)} | {"env"}
    unknown = [k for k in data if k not in known]
    if unknown:
        raise unknown_key_error(unknown, str(path))
    hints = _types()
    for key, value in data.items():
        if key != "env":
            _coerce(f"{path}: {key}", value, hints[key])
    env = data.get("env", {})
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str | int | float | bool) for k, v in env.items()
    ):
        raise ConfigError(f"{path}: env must be a mapping of variable names to values, got {env!r:.80}")
    return data


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows a field's default once: only where its help does not already say it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "default" in text or action.default is None or isinstance(action, argparse._StoreFalseAction):
            return text  # a --no_FIELD switch: its default is that of --FIELD
        return super()._get_help_string(action)


def parse_config(
    argv: Sequence[str] | None = None, prog: str | None = None, require_config: bool = False
) -> TrainConfig:
    """``--config FILE`` plus ``--field value`` overrides (the command line wins) -> TrainConfig.

    The recipe is read once, by :func:`load_yaml`; its ``env:`` variables are set, its values become the
    parser's defaults. The result is validated (``TrainConfig.validate``) and its paths checked
    (``TrainConfig.check_paths``) before anything loads. ``--help`` prints every field and exits.
    ``require_config``: refuse to run without ``--config`` (the training entry points: a run of every
    default is rarely what was meant).
    """
    from trl import TrlParser

    args = list(sys.argv[1:] if argv is None else argv)
    recipe: dict[str, Any] = {}
    given = "--config" in args
    if given:
        at = args.index("--config")
        if at + 1 >= len(args):
            raise ConfigError("--config needs a YAML file path")
        recipe = load_yaml(args[at + 1])
        del args[at : at + 2]
    flags = [a.split("=", 1)[0][2:].replace("-", "_") for a in args if a.startswith("--")]
    known = {f.name for f in fields(TrainConfig)} | {"help"} | {f"no_{f.name}" for f in fields(TrainConfig)}
    unknown = [f for f in flags if f not in known]
    if unknown:
        raise unknown_key_error(unknown, "command line")
    if require_config and not given and "help" not in flags and "-h" not in args:
        raise ConfigError(
            "no --config given: name a recipe, e.g. --config recipes/quickstart.yaml, then --field value "
            "overrides (an empty recipe file trains with every default)"
        )
    apply_env(recipe)
    recipe.pop("env", None)
    parser = TrlParser(dataclass_types=[TrainConfig], prog=prog, formatter_class=_HelpFormatter)
    recipe_action = parser.add_argument(
        "--config",
        metavar="RECIPE.yaml",
        help="YAML recipe of config fields (recipes/); the --field options below override it",
    )
    for actions in (parser._actions, parser._optionals._group_actions):  # listed first, after --help
        actions.remove(recipe_action)
        actions.insert(1, recipe_action)
    for action in parser._actions:  # HfArgumentParser gives --no_FIELD the help of --FIELD
        negated = [o for o in action.option_strings if o.startswith("--no_")]
        if negated:
            action.help = f"turn --{negated[0][5:]} off"
    parser.set_defaults_with_config(**recipe)
    try:
        config, *_ = parser.parse_args_into_dataclasses(args)  # *_: the namespace holding --config
    except ConfigError:
        raise
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if config.reward_weights and not config.reward_functions:
        raise ConfigError(
            f"reward_weights needs one weight per reward_functions entry (0), got {len(config.reward_weights)}"
        )
    config.check_paths()
    return config


def reference_markdown() -> str:
    """The config reference (field, default, meaning) generated from the dataclasses, one table per group."""
    parts = []
    for group in GROUPS:
        rows = [
            f"**`{group.__name__}`**: {group.__doc__}",
            "",
            "| field | default | meaning |",
            "|---|---|---|",
        ]
        for f in fields(group):
            default = f.default_factory() if f.default_factory is not MISSING else f.default  # type: ignore[misc]
            shown = "null" if default is None else default
            rows.append(f"| `{f.name}` | `{shown}` | {f.metadata['help']} |")
        parts.append("\n".join(rows))
    return "\n\n".join(parts)


if __name__ == "__main__":
    print(reference_markdown())
