"""The six groups of training settings, each a dataclass of documented fields whose ``check`` validates
its own fields: :class:`ModelArgs`, :class:`DebateArgs`, :class:`RewardArgs`, :class:`AlgorithmArgs`,
:class:`OptimizerArgs`, :class:`RunArgs`. :class:`udpo.config.TrainConfig` joins them.

:class:`AlgorithmArgs` is the one home of the loss settings: every algorithm is given it and reads its
settings there, ``auto`` resolved there alone (``resolved_advantage_norm``, ``resolved_loss_aggregation``);
:data:`AlgorithmName` is the one spelling of the algorithms' names."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, get_args

from udpo.env.backends.base import SamplingParams
from udpo.env.debate import DebateConfig
from udpo.env.models import DEFAULT_MODEL

if TYPE_CHECKING:
    from udpo.env.backends.base import Capabilities

#: the algorithms a run can name, the one spelling of their names: the config checks ``algorithm`` against
#: it (before torch loads), the command line offers it, udpo.algorithms.ALGORITHMS registers a class under
#: each (a test keeps them equal) and the study's methods name them through it
AlgorithmName = Literal["udpo", "mappo", "rmaac"]
ALGORITHMS: tuple[AlgorithmName, ...] = get_args(AlgorithmName)
#: the values of the loss settings every algorithm shares (``auto`` resolved: :class:`AlgorithmArgs`)
AdvantageNorm = Literal["none", "batch", "agent"]
LossAggregation = Literal["sum", "mean"]
KLLoss = Literal["k3", "k2"]
ISCorrection = Literal["none", "tis", "mask"]
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


def mapping(value: dict | str | None) -> dict:
    """The value of a mapping field (``task_options``, ``chat_template_kwargs``, ``protocol_options``): {}
    for None; a JSON string (what the command line gives before ``TrainConfig`` coerces it) parsed."""
    parsed = json.loads(value) if isinstance(value, str) else value
    return dict(parsed or {})


def _check_spec_shapes(name: str, specs: Sequence[str]) -> None:
    """ConfigError unless every entry of field ``name`` looks like ``package.module:function`` (the shape
    alone: the names a recipe or the command line gives are imported and checked by
    ``TrainConfig.check_imports``)."""
    from udpo.env.imports import SpecError, split_spec

    try:
        for spec in specs:
            split_spec(name, spec)
    except SpecError as e:
        raise ConfigError(str(e)) from None


@dataclass
class ModelArgs:
    """The team's model and the engine that samples it: base model, dtype, LoRA, backend."""

    model: str = _f(DEFAULT_MODEL, "Base model: alias, local folder or Hub id.")
    agent_models: list[str] | None = _f(
        None, "Heterogeneous teams: one base model per agent (N entries); default: `model` for all."
    )
    dtype: str = _f(
        "auto",
        "Weights dtype: auto (bf16 on GPU; fp32 on CPUs without bf16 matrix units; on CPUs with them bf16 "
        "for training and, for generation alone (debate, eval, Team), the faster of bf16 and fp32 in a "
        "decode step of the model's shape, probed once and cached; UDPO_DTYPE=fp32 or bf16 forces it), "
        "bf16, fp16 or fp32.",
    )
    bf16: bool | None = _f(None, "bf16 autocast (default: on when the weights are bf16).")
    gradient_checkpointing: bool | None = _f(
        None,
        "Recompute activations in the backward pass to save memory. null (auto): on a GPU, on only where the "
        "update would not fit its free memory otherwise; off on a CPU.",
    )
    lora_r: int = _f(8, "LoRA rank.")
    lora_alpha: int = _f(16, "LoRA scaling numerator (scale = lora_alpha / lora_r).")
    lora_dropout: float = _f(0.0, "Dropout on the LoRA input.")
    lora_target_modules: list[str] = _f(
        ["q_proj", "k_proj", "v_proj", "o_proj"], "Modules that get adapters."
    )
    shared_adapter: bool = _f(False, "All agents share one adapter (parameter sharing) instead of one each.")
    backend: Literal["hf", "vllm", "openai"] = _f(
        "hf",
        "Inference engine. hf: transformers in this process (in training, the policy's own model: on-policy, "
        "no sync). vllm: a vLLM engine (in training it gets new LoRA ids after each update). openai: an "
        "OpenAI-compatible server at base_url (in training, one that can load LoRA adapters).",
    )
    base_url: str | None = _f(None, "Server URL for backend: openai.")
    hf_decode: Literal["auto", "eager", "stacked", "graph"] = _f(
        "auto",
        "hf backend's decode path: auto (graph on CUDA, eager elsewhere), eager (finished rows leave the "
        "batch), stacked (all rows in one fixed-shape step, adapters stacked) or graph (stacked, replayed "
        "as a CUDA graph; CUDA only).",
    )
    hf_decode_shapes: Literal["dynamic", "static"] = _f(
        "dynamic",
        "hf backend, graph decoding: dynamic compiles the decode step once for every batch and KV-cache "
        "bucket (a new bucket records a CUDA graph); static compiles each bucket's shape on its own (tens "
        "of seconds each at 1B).",
    )
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

    @property
    def backend_capabilities(self) -> Capabilities:
        """What the rollout engine ``backend`` can do, asked instead of its name."""
        from udpo.env.backends import backend_capabilities  # the registry alone: no engine is imported

        return backend_capabilities(self.backend)

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
        server = self.backend_capabilities.remote
        if server and not self.base_url:
            raise ConfigError(
                f"backend: {self.backend} needs base_url (an OpenAI-compatible server that loads LoRA adapters)"
            )
        if self.base_url and not server:
            raise ConfigError(
                f"base_url is only used by a server backend: openai (backend is {self.backend!r})"
            )


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
    n_agents: int = _f(DebateConfig.n_agents, "N: agents per debate.")
    rounds: int = _f(DebateConfig.rounds, "T: debate rounds after the independent round 0.")
    profiles: list[str] | None = _f(
        None, "Agent system prompts: one for every agent or N entries (default: the task's profile)."
    )
    temperature: float = _f(SamplingParams.temperature, "Sampling temperature of every debate (0: greedy).")
    top_p: float = _f(
        SamplingParams.top_p,
        "Nucleus sampling mass in (0, 1]. The trainer's log-probs are those of logits / temperature over the "
        "whole vocabulary, as in TRL and verl: below 1 they ignore the truncation.",
    )
    max_tokens: int = _f(SamplingParams.max_tokens, "Maximum new tokens per response.")
    debate_batch_size: int = _f(
        DebateConfig.debate_batch_size, "Questions debated together (one backend call per round)."
    )
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
        from udpo.env.imports import SpecError
        from udpo.env.tasks import get_task, task_parameters

        try:
            takes = task_parameters(self.task)
        except SpecError as e:  # names the field already
            raise ConfigError(str(e)) from None
        except (TypeError, ValueError) as e:
            raise ConfigError(f"task: {e}") from None
        options = mapping(self.task_options)
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
    correctness_floor: bool = _f(
        False,
        "Beyond the paper: once the coefficients are set (calibrated, calibration_file or explicit), raise "
        "each lambda_i to (1 + correctness_floor_margin) lambda*_i, lambda*_i the task weight above which a "
        "correct split out-earns a unanimous wrong debate for agent i (docs/metrics.md); udpo only.",
    )
    correctness_floor_margin: float = _f(
        0.1, "m of correctness_floor: lambda_i >= (1 + m) lambda*_i; m >= 0."
    )
    reward_functions: list[str] = _f(
        [],
        "Your own reward terms: 'package.module:function' callables (trajectory, agent) -> float, or TRL's "
        "reward functions (prompts, completions, **kwargs) -> list[float], each weighted by reward_weights and "
        "added to every r_i (see docs/library.md).",
    )
    reward_weights: list[float] = _f([], "One weight per reward_functions entry (default: 1 each).")
    reward_format: Literal["conversational", "standard"] = _f(
        "conversational",
        "How reward functions of TRL's form get each agent's prompt and reply: conversational (chat messages, "
        "as the agents exchange them) or standard (text), TRL's two dataset formats.",
    )
    task_reward: Literal["correct", "coin"] = _f(
        "correct",
        "r_task: correct (the vote is right), or coin: a fixed coin per (seed, question, draw) that ignores "
        "every answer, the negative control of a learning check (udpo.rewards.coin; udpo only).",
    )

    def check(self) -> None:
        """The rules on these fields alone (ConfigError naming the field)."""
        _check_ranges(self, nonnegative=("kappa", "lambda_base", "eta_base", "correctness_floor_margin"))
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
        _check_spec_shapes("reward_functions", self.reward_functions)
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

    algorithm: AlgorithmName = _f("udpo", "Advantage and loss: udpo (mappo, rmaac: baselines).")
    clip_eps: float = _f(0.2, "eps: the ratio is clipped to [1 - eps, 1 + eps].")
    ratio_level: Literal["trajectory", "token"] = _f(
        "trajectory", "Importance ratio per debate (paper) or per token (PPO/GRPO style)."
    )
    baseline: Literal["batch", "group"] = _f(
        "batch", "Advantage baseline b_i: batch mean of r_i, or mean over the debates of the same question."
    )
    advantage_norm: Literal["auto", AdvantageNorm] = _f(
        "auto",
        "Advantage normalisation, every algorithm: none; batch (mean 0, std 1 over the batch); agent (each "
        "agent's advantages by its own mean and std, as Dr. MAS: agents' reward scales differ). auto: batch "
        "for mappo and rmaac, none for udpo.",
    )
    loss_aggregation: Literal["auto", LossAggregation] = _f(
        "auto",
        "Length normalisation, every algorithm: an agent's surrogate and KL in one debate summed over its "
        "tokens (sum) or divided by their number (mean). auto: sum at ratio_level trajectory (udpo), mean "
        "at ratio_level token and for mappo and rmaac.",
    )
    kl_loss: KLLoss = _f(
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
    is_correction: ISCorrection = _f(
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

    @property
    def resolved_advantage_norm(self) -> AdvantageNorm:
        """``advantage_norm``, with ``auto`` resolved: ``batch`` for mappo and rmaac (MAPPO normalizes its
        advantages over the batch), ``none`` for udpo (the paper does not scale them)."""
        if self.advantage_norm != "auto":
            return self.advantage_norm
        return "none" if self.algorithm == "udpo" else "batch"

    @property
    def resolved_loss_aggregation(self) -> LossAggregation:
        """``loss_aggregation``, with ``auto`` resolved: ``sum`` beside udpo's trajectory ratio (the KL of
        trajectory distributions), ``mean`` beside per-token ratios (udpo at ``ratio_level: token``, GRPO's;
        mappo and rmaac)."""
        if self.loss_aggregation != "auto":
            return self.loss_aggregation
        return "sum" if self.algorithm == "udpo" and self.ratio_level == "trajectory" else "mean"


@dataclass
class OptimizerArgs:
    """How much is trained and how: iterations and batches, AdamW and its schedule, gradient clipping, log-prob passes."""

    num_train_epochs: float = _f(10.0, "Passes over the training questions.")
    max_iterations: int | None = _f(None, "Stop after this many iterations (overrides num_train_epochs).")
    questions_per_iteration: int = _f(
        8,
        "Questions an update is planned on, over all processes (8 x debates_per_question 4 = the paper's 32 "
        "debates per update). With dynamic_sampling, the informative questions an iteration debates until "
        "it has them.",
    )
    debates_per_question: int = _f(
        4,
        "Debates of each training question in an iteration, each with its own draws: the group whose "
        "rewards are compared (baseline: group averages over it; >= 2 for baseline: group). 1: a lone "
        "debate per question, as the paper samples (no group, nothing for dynamic_sampling to drop).",
    )
    dynamic_sampling: bool = _f(
        True,
        "Drop from the update every question whose debates gave each agent the same reward (no "
        "within-question signal: under baseline: group every advantage of it is 0) and debate further "
        "questions of the run's question stream until the update holds questions_per_iteration "
        "informative ones (DAPO's dynamic sampling; docs/training.md). Counted in groups/*, never hidden. "
        "Acts when debates_per_question >= 2.",
    )
    dynamic_sampling_max_extra: float = _f(
        2.0,
        "The cap on dynamic_sampling's extra questions per iteration, as a multiple of "
        "questions_per_iteration (2.0: at most 2 x questions_per_iteration more). At the cap the update "
        "proceeds with the informative questions it has (groups/cap_hit: 1); with none it is skipped.",
    )
    gradient_accumulation_steps: int | None = _f(
        None,
        "Split each process's update batch into this many micro-batches (same update, less memory). null "
        "(auto): on a GPU the fewest whose activations fit its free memory; 1 on a CPU.",
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
    logprob_token_budget: int | None = _f(
        None,
        "Positions per forward pass at most when scoring log-probs (rows x longest row; rows are sorted by "
        "length, so padding stays small; a longer row runs alone). Lower it to save memory. null (auto): on "
        "a GPU sized from its free memory (512 to 65536); 4096 on a CPU.",
    )

    def check(self) -> None:
        """The rules on these fields alone (ConfigError naming the field)."""
        _check_ranges(
            self,
            positive=(
                "questions_per_iteration",
                "debates_per_question",
                "logprob_batch_size",
            ),
            nonnegative=("warmup_steps", "weight_decay", "max_grad_norm"),
            fractions=("warmup_ratio", "adam_beta1", "adam_beta2"),
            optional_positive=("gradient_accumulation_steps", "logprob_token_budget"),
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
        if not (self.dynamic_sampling_max_extra >= 0 and math.isfinite(self.dynamic_sampling_max_extra)):
            raise ConfigError(
                f"dynamic_sampling_max_extra must be a finite number >= 0 (a multiple of "
                f"questions_per_iteration), got {self.dynamic_sampling_max_extra}"
            )
        debates = self.questions_per_iteration * self.debates_per_question
        if (self.gradient_accumulation_steps or 1) > debates:
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
    eval_debates_per_question: int = _f(
        1,
        "Debates of each held-out question per evaluation, each with its own draws (question ids get "
        "'#d<k>' from the second on; the study tables resample a problem's debates together).",
    )
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
    metric_for_best_model: str | None = _f(
        None,
        "The evaluation metric (accuracy, u_sys, ...) whose best value transformers callbacks find in "
        "TrainerState.best_metric, as transformers' TrainingArguments field (EarlyStoppingCallback reads it).",
    )
    greater_is_better: bool | None = _f(
        None,
        "Whether a higher metric_for_best_model is better (default: yes, unless its name ends in 'loss').",
    )
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
            positive=("save_steps", "eval_debates_per_question"),
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
        _check_spec_shapes("eval_callbacks", self.eval_callbacks)
        if self.metric_for_best_model is not None and self.eval_questions == 0:
            raise ConfigError("metric_for_best_model needs evaluations: eval_questions > 0")
        if self.greater_is_better is not None and self.metric_for_best_model is None:
            raise ConfigError("greater_is_better needs metric_for_best_model")
        if self.attack_eval != "none":
            if self.eval_questions == 0:
                raise ConfigError(f"attack_eval: {self.attack_eval} needs eval_questions > 0")
            if not self.attack_eval_attacker:
                raise ConfigError("attack_eval_attacker must be 'base', 'builtin' or a model name")
