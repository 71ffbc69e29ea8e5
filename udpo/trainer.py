"""The training loop shared by every algorithm (UDPO, and the MAPPO / RMAAC baselines).

One iteration, as in the paper's Algorithm 1::

    rollout   debate this iteration's questions with the current adapters (each process a shard)
    reward    gather the debates; per-agent rewards r_i and advantages A_i over the whole batch
    update    per agent i (its adapter alone active): log-probs, the algorithm's loss, backward;
              gradients summed over processes, clipped per agent, one AdamW step
    sync      hand the new adapters to the rollout engine (hf: nothing, it is the live model;
              vllm: adapter files and new LoRA ids, the base model stays loaded)

Before the first iteration: warm-up calibration of the per-agent reward coefficients on held-out
training questions (skipped when all are given), and a held-out Standard-MAD evaluation. Every
``eval_steps`` iterations the evaluation runs again (plus the configured eval callbacks); every
``save_steps`` a checkpoint is written (udpo.checkpoint) so a killed run resumes exactly.

Files in the run directory::

    config.json, calibration.json, metrics.jsonl
    trajectories/warmup.jsonl, trajectories/train.jsonl          (append-only)
    eval/iter_000000/{trajectories.jsonl, summary.json}, ...
    checkpoints/iter_000010/..., checkpoints/latest
"""

from __future__ import annotations

import importlib
import math
import os
import random
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from udpo import checkpoint as ckpt
from udpo import distributed as dist
from udpo.algorithms.base import RolloutBatch, fill_behavior_logprobs
from udpo.algorithms.udpo import compute_rewards
from udpo.config import COEFFICIENTS, ConfigError, TrainConfig
from udpo.env.backends.base import Backend, SamplingParams
from udpo.env.debate import AgentSpec, DebateConfig, DebateEnv
from udpo.env.protocols import Protocol, build_protocol
from udpo.env.tasks import get_task
from udpo.env.tasks.base import Question
from udpo.env.trajectory import Trajectory, TrajectoryWriter
from udpo.evaluate import summarize, write_json
from udpo.reward_functions import load_reward_functions
from udpo.team import save_team
from udpo.tracking import Timer, Tracker, accelerate_trackers, progress_bar

#: eval callback: (trainer, iteration) -> metrics to log beside the Standard-MAD evaluation
EvalCallback = Callable[["Trainer", int], dict[str, Any]]
TRAIN_FILE = "trajectories/train.jsonl"
WARMUP_FILE = "trajectories/warmup.jsonl"
METRICS_FILE = "metrics.jsonl"
APPEND_ONLY = (TRAIN_FILE, METRICS_FILE)


class TrainingError(RuntimeError):
    """Training cannot go on (non-finite loss, out of memory, a run directory in the way)."""


@contextmanager
def explain_oom(config: TrainConfig) -> Iterator[None]:
    """Re-raise a CUDA out-of-memory error with the settings that lower memory use."""
    try:
        yield
    except torch.cuda.OutOfMemoryError as e:
        raise TrainingError(
            f"out of GPU memory ({str(e).splitlines()[0] if str(e) else 'no details'}). To fit: lower "
            f"questions_per_iteration (now {config.questions_per_iteration}) or max_tokens (now "
            f"{config.max_tokens}); raise gradient_accumulation_steps (now {config.gradient_accumulation_steps}) "
            f"or lower logprob_token_budget (now {config.logprob_token_budget}); set gradient_checkpointing: true "
            f"(now {str(config.gradient_checkpointing).lower()}); with backend: vllm set a lower "
            f"vllm_gpu_memory_utilization (now {config.vllm_gpu_memory_utilization or 'unset: 0.9'})"
        ) from e


def deepspeed_launch() -> bool:
    """True under ``accelerate launch`` with a DeepSpeed config (accelerate sets ACCELERATE_USE_DEEPSPEED)."""
    return os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() in ("1", "true")


def load_callbacks(specs: Sequence[str]) -> list[EvalCallback]:
    """Import eval callbacks named ``package.module:function``."""
    out = []
    for spec in specs:
        module, _, name = spec.partition(":")
        try:
            out.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError) as e:
            raise ValueError(f"eval_callbacks: cannot import {spec!r}: {e}") from None
    return out


def attack_callbacks(config: TrainConfig) -> list[EvalCallback]:
    """The attack evaluation that ``attack_eval`` / ``attack_eval_m`` / ``attack_eval_attacker`` ask for."""
    if config.attack_eval == "none":
        return []
    from udpo.attack_eval import attack_eval_callback
    from udpo.env.attacks import AttackConfig

    attack = AttackConfig(name=config.attack_eval, attacker=config.attack_eval_attacker, seed=config.seed)
    return [attack_eval_callback(attack, m_values=config.attack_eval_m)]


class QuestionSchedule:
    """Which training questions iteration k debates: consecutive slices of a per-epoch shuffle.

    A pure function of (seed, k), so a resumed run debates exactly the questions it would have.
    """

    def __init__(self, questions: Sequence[Question], per_iteration: int, seed: int):
        self.questions = list(questions)
        self.per_iteration = per_iteration
        self.seed = seed

    def epoch_order(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.questions))

    def for_iteration(self, k: int) -> list[Question]:
        n, start = len(self.questions), (k - 1) * self.per_iteration
        out = []
        for pos in range(start, start + self.per_iteration):
            out.append(self.questions[int(self.epoch_order(pos // n)[pos % n])])
        return out

    def epoch_of(self, k: int) -> float:
        return k * self.per_iteration / len(self.questions)


def split_warmup(
    questions: Sequence[Question], fraction: float, seed: int
) -> tuple[list[Question], list[Question]]:
    """(warm-up, training) questions: a seeded ``fraction`` held out for calibration, disjoint from training."""
    if fraction == 0:
        return [], list(questions)
    order = np.random.default_rng([seed, 10_007]).permutation(len(questions))
    n_warm = max(1, round(fraction * len(questions)))
    if n_warm >= len(questions):
        raise ValueError(
            f"warmup_fraction {fraction} of {len(questions)} training questions leaves none to train on"
        )
    return [questions[i] for i in order[:n_warm]], [questions[i] for i in order[n_warm:]]


class Trainer:
    """Trains a team of LoRA agents on one task with one algorithm; see the module docstring.

    eval_callbacks: extra evaluations run at every evaluation, each ``(trainer, iteration) -> dict``
    (e.g. an attack evaluation); added to those named by ``config.eval_callbacks``.
    backend: a running rollout engine of kind ``config.backend`` to use instead of starting one (e.g.
    one vLLM engine shared by several runs); the trainer registers its adapters there but never closes it.
    """

    def __init__(
        self, config: TrainConfig, eval_callbacks: Sequence[EvalCallback] = (), backend: Backend | None = None
    ):
        from accelerate import Accelerator
        from accelerate.utils import DistributedType, set_seed

        self.config = config
        self.run_dir = Path(config.output_dir)
        use_bf16 = (
            config.bf16
            if config.bf16 is not None
            else torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        )
        if deepspeed_launch() and not torch.cuda.is_available():
            # accelerate (1.15) turns a DeepSpeed launch into plain DDP when cpu=True, and with cpu=False
            # the processes never form a group: each would train alone on the same output_dir
            raise TrainingError(
                "DeepSpeed needs CUDA GPUs: accelerate forms no DeepSpeed process group on a CPU-only machine. "
                "On CPU, launch without the DeepSpeed config (torchrun or accelerate launch: DDP over gloo)"
            )
        self.accelerator = Accelerator(
            cpu=not torch.cuda.is_available(),  # on CPU, torchrun processes form a gloo group only with cpu=True
            mixed_precision="bf16" if use_bf16 else "no",
            log_with=accelerate_trackers(config.report_to) or None,
            project_dir=str(self.run_dir),
            step_scheduler_with_optimizer=False,  # the schedule counts optimizer steps, whatever the process count
        )
        self.deepspeed = self.accelerator.distributed_type == DistributedType.DEEPSPEED
        self.rank, self.world = self.accelerator.process_index, self.accelerator.num_processes
        self.main = self.accelerator.is_main_process
        self.eval_callbacks = [
            *load_callbacks(config.eval_callbacks),
            *attack_callbacks(config),
            *eval_callbacks,
        ]
        self._check_run_dir()
        self.reward_functions = load_reward_functions(config.reward_functions, config.reward_weights)

        self._load_questions()
        set_seed(config.seed)  # identical adapter initialization on every process
        self._build_policy()
        set_seed(config.seed + self.rank)  # different sampling per process from here on
        self._build_optimizer()
        self.algorithm = None  # built once the coefficients are known (calibration or checkpoint)
        self.replay = None

        # rollout engine, tracking ----------------------------------------------------------------
        self._own_backend = backend is None
        self.backend = backend if backend is not None else self._make_backend()
        self.tracker: Tracker | None = None
        self.coefficients = None
        self.calibration: dict[str, Any] | None = None
        self.iteration = 0
        self.optimizer_steps = 0
        self.history: dict[str, dict[str, Any]] = {}  # "before" / "after" evaluation summaries
        self._sync_dirs: list[Path] = []

    # ------------------------------------------------------------------------------------------
    # setup helpers
    # ------------------------------------------------------------------------------------------
    def _load_questions(self) -> None:
        """Training, warm-up and evaluation questions, and the iteration schedule."""
        config = self.config
        self.task = get_task(config.task, **(config.task_options or {}))
        train_all = self.task.load(
            config.train_split, config.data_path, limit=config.max_train_questions, seed=config.seed
        )
        self.eval_set = (
            self.task.load(config.eval_split, config.data_path, limit=config.eval_questions, seed=config.seed)
            if config.eval_questions
            else []
        )
        fraction = 0.0 if config.coefficients_explicit else config.warmup_fraction
        self.warmup_set, self.train_set = split_warmup(train_all, fraction, config.seed)
        self.schedule = QuestionSchedule(self.train_set, config.questions_per_iteration, config.seed)
        self.total_iterations = config.max_iterations or math.ceil(
            config.num_train_epochs * len(self.train_set) / config.questions_per_iteration
        )
        self.warmup_steps = config.warmup_for(self.total_iterations * config.update_epochs)
        self._check_context([*self.train_set, *self.warmup_set, *self.eval_set])
        debates = config.questions_per_iteration * config.debates_per_question
        if debates < self.world * config.gradient_accumulation_steps:
            raise ValueError(
                f"questions_per_iteration x debates_per_question = {debates} debates cannot be shared by "
                f"{self.world} processes with gradient_accumulation_steps={config.gradient_accumulation_steps} "
                f"micro-batches each; raise questions_per_iteration"
            )

    def _check_context(self, questions: Sequence[Question]) -> None:
        """Refuse, before any model loads, a debate whose last round could outgrow the engine's context
        (the prompt carries every earlier answer of the agent and its peers at up to max_tokens each)."""
        from transformers import AutoConfig, AutoTokenizer

        from udpo.env.backends.chat import chat_prompt_ids
        from udpo.env.debate import worst_case_prompt_tokens
        from udpo.env.models import resolve_model

        cfg = self.config
        if cfg.backend == "openai" or not questions:
            return  # a remote server's context is its own business
        longest = sorted(questions, key=lambda q: len(self.task.prompt(q)), reverse=True)[:5]
        config = self.debate_config([AgentSpec(profile=p) for p in self.agent_profiles()])
        for base in dict.fromkeys(cfg.agent_models or [cfg.model]):
            path = resolve_model(base)
            tokenizer = AutoTokenizer.from_pretrained(path)
            if cfg.backend == "vllm":
                limit, name = cfg.vllm_max_model_len, "vllm_max_model_len"
            else:
                limit = getattr(AutoConfig.from_pretrained(path), "max_position_embeddings", None)
                name = f"{base}'s max_position_embeddings"
            if not limit:
                continue
            encode = partial(chat_prompt_ids, tokenizer, template_kwargs=cfg.chat_template_kwargs)
            for q in longest:
                need = worst_case_prompt_tokens(
                    self.task, q, config, encode, reads_pool=cfg.protocol == "interventions"
                )
                if need > limit:
                    raise ConfigError(
                        f"a debate of question {q.id} can reach {need} tokens (n_agents={cfg.n_agents}, "
                        f"rounds={cfg.rounds}, max_tokens={cfg.max_tokens}: the last round carries every earlier "
                        f"answer), more than {name}={limit}; lower max_tokens or rounds"
                        + (", or raise vllm_max_model_len" if cfg.backend == "vllm" else "")
                    )

    def _build_policy(self) -> None:
        """The team (one base, one adapter per agent), identical on every process."""
        from udpo.policy import LoraSettings, MultiAgentPolicy

        config = self.config
        with explain_oom(config):
            self.policy = MultiAgentPolicy(
                model=config.model,
                n_agents=config.n_agents,
                lora=LoraSettings(
                    config.lora_r, config.lora_alpha, config.lora_dropout, config.lora_target_modules
                ),
                shared_adapter=config.shared_adapter,
                agent_models=config.agent_models,
                dtype=config.dtype,
                device=str(self.accelerator.device),
                reference=config.reference,
            )
        if config.gradient_checkpointing:
            for model in self.policy.models.values():
                model.gradient_checkpointing_enable()
                model.enable_input_require_grads()
        self.params = self.policy.trainable_parameters()
        dist.broadcast_parameters(self.params)
        self.adapters = list(dict.fromkeys(self.policy.adapter_names))  # distinct adapters, agent order

    def _build_optimizer(self) -> None:
        """AdamW with one parameter group per adapter; linear warm-up, then the configured decay."""
        from transformers import get_scheduler

        config = self.config
        self.optimizer = torch.optim.AdamW(
            [
                {"params": self.policy.parameters_of(self.policy.adapter_names.index(a)), "adapter": a}
                for a in self.adapters
            ],
            lr=config.learning_rate,
            betas=(config.adam_beta1, config.adam_beta2),
            eps=config.adam_epsilon,
            weight_decay=config.weight_decay,
        )
        name = "constant_with_warmup" if config.lr_scheduler_type == "constant" else config.lr_scheduler_type
        self.scheduler = get_scheduler(
            name,
            self.optimizer,
            num_warmup_steps=self.warmup_steps,
            num_training_steps=self.total_iterations * config.update_epochs,
        )
        if self.deepspeed:
            self._prepare_deepspeed()

    def _check_run_dir(self) -> None:
        """Before anything loads: the paths the config names, the checkpoint to resume (whole), and a
        run directory that holds a run only with ``resume``. A directory whose run was stopped before
        its first checkpoint holds nothing to resume: a new start replaces what that attempt wrote."""
        cfg = self.config
        cfg.check_paths()
        if cfg.resume is not None:
            self._verify_checkpoint(ckpt.resolve(self.run_dir, cfg.resume))
        elif ckpt.list_checkpoints(self.run_dir):
            raise TrainingError(
                f"output_dir {self.run_dir} already holds a run (checkpoints); pass --resume latest to "
                f"continue it, or choose a new output_dir"
            )
        elif (self.run_dir / METRICS_FILE).exists() and not self._interrupted_start():
            raise TrainingError(
                f"output_dir {self.run_dir} holds a {METRICS_FILE} that is not a UDPO run's; choose a new "
                f"output_dir"
            )

    def _interrupted_start(self) -> bool:
        """Whether the run directory's metrics are a UDPO run's (every line a record with a "kind")."""
        try:
            whole = (self.run_dir / METRICS_FILE).read_bytes().split(b"\n")[:-1]  # not a line cut short
        except OSError:
            return False
        return all(b'"kind"' in line and b'"iteration"' in line for line in whole if line.strip())

    def _verify_checkpoint(self, path: Path) -> None:
        ckpt.verify(
            path,
            replay=self.config.replay,
            reference=self.config.reference == "lagged",
            deepspeed=self.deepspeed,
        )

    def _make_algorithm(self, coefficients):
        """The configured algorithm with the run's per-agent coefficients."""
        cfg = self.config
        if cfg.algorithm != "udpo":
            raise ValueError(f"algorithm {cfg.algorithm!r} is not implemented yet; use algorithm: udpo")
        from udpo.algorithms.udpo import UDPO, UDPOConfig

        return UDPO(
            coefficients,
            UDPOConfig(
                clip_eps=cfg.clip_eps,
                ratio_level=cfg.ratio_level,
                baseline=cfg.baseline,
                dual_clip=cfg.dual_clip,
            ),
        )

    def _make_backend(self) -> Backend:
        cfg = self.config
        if cfg.backend == "hf":
            return self.policy.rollout_backend(
                max_batch=max(cfg.debate_batch_size * cfg.n_agents, 1),
                chat_template_kwargs=cfg.chat_template_kwargs,
            )
        from udpo.env.backends import make_backend
        from udpo.env.models import resolve_model

        if cfg.backend == "vllm":
            backend = make_backend(
                "vllm",
                model=resolve_model(cfg.model),
                max_loras=cfg.vllm_max_loras or len(self.adapters),
                max_lora_rank=max(16, cfg.lora_r),
                gpu_memory_utilization=cfg.vllm_gpu_memory_utilization,
                kv_cache_gib=cfg.vllm_kv_cache_gib,
                max_model_len=cfg.vllm_max_model_len,
                seed=cfg.seed + self.rank,
                chat_template_kwargs=cfg.chat_template_kwargs,
            )
        else:  # an OpenAI-compatible vLLM server that loads adapters at run time from this file system
            backend = make_backend(
                "openai", base_url=cfg.base_url, chat_template_kwargs=cfg.chat_template_kwargs
            )
        return backend

    def _prepare_deepspeed(self) -> None:
        """DeepSpeed (ZeRO-2/3) owns the optimizer step: it needs the model, optimizer and scheduler."""
        if len(self.policy.models) != 1:
            raise ValueError("DeepSpeed training supports one base model; agent_models lists several")
        (base,) = self.policy.models
        # every backward (one per agent and micro-batch) accumulates; DeepSpeed steps after the last one
        self.accelerator.gradient_accumulation_steps = (
            self.config.n_agents * self.config.gradient_accumulation_steps
        )
        model, self.optimizer, self.scheduler = self.accelerator.prepare(
            self.policy.models[base], self.optimizer, self.scheduler
        )
        self._ds_model = model

    def agent_specs(self) -> list[AgentSpec]:
        """The debate's agents: profile, adapter (served name) and base model of each."""
        cfg, names = self.config, self.policy.adapter_names
        return [
            AgentSpec(
                profile=profile, adapter=names[i], model=cfg.agent_models[i] if cfg.agent_models else None
            )
            for i, profile in enumerate(self.agent_profiles())
        ]

    def agent_profiles(self) -> list[str | None]:
        """Each agent's system prompt (None: the task's default): ``profiles`` repeated over the N agents."""
        profiles = self.config.profiles or [None]
        return [profiles[i % len(profiles)] for i in range(self.config.n_agents)]

    def debate_config(self, agents: list[AgentSpec] | None = None) -> DebateConfig:
        """The run's debate settings, for its own agents or for the given N (before the policy exists)."""
        cfg = self.config
        sampling = SamplingParams(temperature=cfg.temperature, top_p=cfg.top_p, max_tokens=cfg.max_tokens)
        agents = agents if agents is not None else self.agent_specs()
        return DebateConfig(
            n_agents=cfg.n_agents,
            rounds=cfg.rounds,
            sampling=sampling,
            agents=agents,
            batch_size=cfg.debate_batch_size,
        )

    def debate_protocol(self) -> Protocol:
        """The protocol of rollouts and evaluations (``protocol``, ``protocol_options``), built on first use."""
        if self.__dict__.get("_protocol") is None:
            self._protocol = build_protocol(self.config.protocol_config(), self.task, self.backend)
        return self._protocol

    # ------------------------------------------------------------------------------------------
    # debates
    # ------------------------------------------------------------------------------------------
    def debate(
        self, questions: Sequence[Question], meta: dict[str, Any], progress: bool = False
    ) -> list[Trajectory]:
        """Debate ``questions`` (all processes together, each a shard); every process gets all of them."""
        idx = dist.shard(len(questions), self.rank, self.world)
        env = DebateEnv(
            self.task, self.backend, self.debate_config(), protocol=self.debate_protocol(), meta=meta
        )
        with explain_oom(self.config):
            local = env.run([questions[i] for i in idx], progress=progress and self.main)
        return dist.gather_in_order(local, idx, len(questions))

    @contextmanager
    def _eval_rng(self) -> Iterator[None]:
        """Run a block on random generators seeded with ``eval_seed`` (+ rank), then give training its own
        generators back as they were: evaluations compare on the same draws and leave training unchanged."""
        devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
        py, np_state = random.getstate(), np.random.get_state()
        with torch.random.fork_rng(devices=devices):
            seed = self.config.eval_seed + self.rank
            torch.manual_seed(seed)
            random.seed(seed)
            np.random.seed(seed)
            try:
                yield
            finally:
                random.setstate(py)
                np.random.set_state(np_state)

    def evaluate(self, iteration: int) -> dict[str, Any]:
        """Held-out Standard-MAD evaluation with the current adapters, then the eval callbacks, all on the
        generators of ``_eval_rng``.

        Writes eval/iter_<k>/{trajectories.jsonl, summary.json}; returns the summary (plus callback
        results under their function names)."""
        with self._eval_rng():
            trajectories = self.debate(
                self.eval_set, {"phase": "eval", "iteration": iteration}, self.config.progress
            )
            summary = summarize(trajectories)
            if self.main:
                out = self.run_dir / "eval" / ckpt.checkpoint_name(iteration)
                shutil.rmtree(out, ignore_errors=True)  # left by a run that died after this point
                with TrajectoryWriter(out / "trajectories.jsonl") as writer:
                    writer.write(trajectories)
                write_json(out / "summary.json", {**summary, "iteration": iteration})
            for callback in self.eval_callbacks:  # on the evaluation's generators too
                summary[callback.__name__] = callback(self, iteration)
        return summary

    # ------------------------------------------------------------------------------------------
    # warm-up calibration
    # ------------------------------------------------------------------------------------------
    def calibrate(self) -> dict[str, Any]:
        """Per-agent coefficients: calibrated on warm-up debates (SPEC section 4), then explicit config
        values override and ``ablations`` zero their terms; written to RUN_DIR/calibration.json."""
        from udpo.rewards import calibrate

        cfg = self.config
        if self.warmup_set:
            trajectories = self.debate(self.warmup_set, {"phase": "warmup"}, cfg.progress)
            if self.main:
                (self.run_dir / WARMUP_FILE).unlink(missing_ok=True)
                with TrajectoryWriter(self.run_dir / WARMUP_FILE) as writer:
                    writer.write(trajectories)
            result = calibrate(
                [t.answers for t in trajectories],
                [t.gold for t in trajectories],
                kappa=cfg.kappa,
                lam=cfg.lam,
                base_weights=cfg.base_weights,
                lambda_base=cfg.lambda_base,
                eta_base=cfg.eta_base,
            )
            record = result.to_dict()
            coefficients = dict(record["coefficients"])
            record["warmup"]["summary"] = summarize(trajectories)
        else:
            record, coefficients = {"coefficients": {}}, {}
        overrides = {}
        for name in COEFFICIENTS:
            value = getattr(cfg, name)
            if value is not None:
                overrides[name] = [float(v) for v in (value * cfg.n_agents if len(value) == 1 else value)]
        coefficients.update(overrides)
        if cfg.ablations:
            from udpo.algorithms.udpo import Coefficients

            coefficients = Coefficients.from_dict(coefficients).without(*cfg.ablations).to_dict()
        record["coefficients"] = coefficients
        record["explicit"] = sorted(overrides)
        record["ablations"] = list(cfg.ablations)
        return record

    def _use_calibration(self, record: dict[str, Any]) -> None:
        """Build the algorithm (and the replay buffer, whose priority uses the base weights) from a
        calibration record."""
        from udpo.algorithms.udpo import Coefficients

        cfg = self.config
        self.calibration = record
        self.coefficients = Coefficients.from_dict(record)
        self.algorithm = self._make_algorithm(self.coefficients)
        if cfg.replay:
            from udpo.replay import ReplayBuffer

            bases = record.get("base_weights", {})
            base = cfg.base_weights or tuple(
                bases.get(k, 1 / 3) for k in ("alpha_base", "beta_base", "gamma_base")
            )
            self.replay = ReplayBuffer(cfg.replay_capacity, cfg.replay_eta, cfg.replay_beta, base)

    # ------------------------------------------------------------------------------------------
    # one iteration
    # ------------------------------------------------------------------------------------------
    def rollout_batch(self, trajectories: list[Trajectory], weights: Sequence[float] | None = None):
        """Rewards and per-agent turns of a list of debates as the algorithm's RolloutBatch."""
        rewards, terms = compute_rewards(
            trajectories, self.coefficients, self.config.reward_scope, self.reward_functions
        )
        return RolloutBatch.from_trajectories(
            trajectories,
            rewards=rewards,
            terms=terms,
            weights=None if weights is None else torch.as_tensor(weights, dtype=torch.float32),
        )

    def run_iteration(self, k: int) -> dict[str, Any]:
        """Rollout, reward, update, sync for iteration ``k``; returns its metrics."""
        cfg, timer = self.config, Timer()
        questions = [q for q in self.schedule.for_iteration(k) for _ in range(cfg.debates_per_question)]
        with timer("rollout"):
            fresh = self.debate(questions, {"phase": "train", "iteration": k})
        tokens = sum(len(turn.completion_ids) for t in fresh for row in t.turns for turn in row)
        if self.main:
            with TrajectoryWriter(self.run_dir / TRAIN_FILE) as writer:
                writer.write(fresh)
        with timer("reward"):
            trajectories, weights, n_replayed = self._with_replay(fresh, k)
            batch = self.rollout_batch(trajectories, weights)
            if cfg.behavior_logprobs == "rollout":
                fill_behavior_logprobs(batch, self.policy, **self.scoring())  # engines that return none
            advantages = self.algorithm.advantages(batch)
        with timer("update"), explain_oom(cfg):
            update_stats = self.update(batch, advantages, fresh_count=len(fresh), iteration=k)
        with timer("sync"):
            self.sync_adapters(k)
            if cfg.reference == "lagged" and k % cfg.ref_update_interval == 0:
                self.policy.refresh_reference()
        times = timer.pop()
        metrics: dict[str, Any] = {
            "epoch": round(self.schedule.epoch_of(k), 4),
            "lr": self.scheduler.get_last_lr()[0],
            **{f"train/{key}": v for key, v in summarize(fresh).items() if key != "n_questions"},
            **self.algorithm.batch_metrics(batch, advantages),
            **(self.replay.stats() if self.replay is not None else {}),
            **update_stats,
            "debates": len(fresh),
            "replayed": n_replayed,
            "tokens": tokens,
            "tokens_per_s": tokens / max(times["rollout"], 1e-9),
            **{f"time/{name}": round(s, 4) for name, s in times.items()},
        }
        return metrics

    def _with_replay(
        self, fresh: list[Trajectory], k: int
    ) -> tuple[list[Trajectory], list[float] | None, int]:
        """The update batch: the fresh debates plus, with replay on, debates drawn from the buffer."""
        cfg = self.config
        if self.replay is None:
            return fresh, None, 0
        if cfg.replay_refresh_interval and k % cfg.replay_refresh_interval == 0 and len(self.replay):
            stored = set(self.replay.question_ids())
            questions = [q for q in self.train_set if q.id in stored]
            self.replay.add(self.debate(questions, {"phase": "replay_refresh", "iteration": k}), replace=True)
        n_replay = round(len(fresh) * cfg.replay_fraction / (1 - cfg.replay_fraction))
        rng = np.random.default_rng([cfg.seed, k, 7])  # the same draw on every process
        replayed, weights = self.replay.sample(min(n_replay, len(self.replay)), rng)
        self.replay.add(fresh)
        return [*fresh, *replayed], [1.0] * len(fresh) + weights.tolist(), len(replayed)

    # ------------------------------------------------------------------------------------------
    # the update
    # ------------------------------------------------------------------------------------------
    def micro_batches(self, local: list[int]) -> list[list[int]]:
        """This process's debates split into ``gradient_accumulation_steps`` micro-batches."""
        ga = self.config.gradient_accumulation_steps
        if len(local) < ga:
            raise ValueError(
                f"gradient_accumulation_steps={ga} is more than this process's {len(local)} debates per "
                f"update; lower it or raise questions_per_iteration"
            )
        return [chunk.tolist() for chunk in np.array_split(np.asarray(local), ga)]

    def scoring(self) -> dict[str, Any]:
        """How the policy scores log-probs in training: the sampling temperature and the pass sizes."""
        cfg = self.config
        return {
            "temperature": cfg.temperature,
            "batch_size": cfg.logprob_batch_size,
            "token_budget": cfg.logprob_token_budget,
        }

    def update(self, batch, advantages: torch.Tensor, fresh_count: int, iteration: int) -> dict[str, float]:
        """``update_epochs`` optimizer steps on the batch; returns per-agent loss statistics.

        The reference log-probs of this process's debates come first, from no-grad passes (with
        ``reference: base`` all agents share them: one model, adapters off). Then per epoch, agent and
        micro-batch: the agent's log-probs with gradients, its loss, backward. In epoch 0 the adapters have
        not moved, so with ``behavior_logprobs: recompute`` those log-probs are also the fresh debates'
        behavior log-probs: they are written into the stored trajectories (what replay keeps) and shared
        with the other processes.
        """
        cfg, total = self.config, len(batch.trajectories)
        local = dist.shard(total, self.rank, self.world)
        chunks = self.micro_batches(local)
        self.policy.forward_stats.reset()
        with self.accelerator.autocast():
            reference = self._reference_logprobs(batch, local)
        recompute = cfg.behavior_logprobs == "recompute" and fresh_count > 0
        stats: dict[str, list[float]] = {}
        for epoch in range(cfg.update_epochs):
            for agent in range(cfg.n_agents):
                for chunk in chunks:
                    sub = batch.select(chunk)
                    prompts, completions = sub.agent_sequences(agent)
                    with self.accelerator.autocast():
                        flat = self.policy.token_logprobs(agent, prompts, completions, **self.scoring())
                    if epoch == 0 and recompute:
                        _set_behavior(sub, agent, [m for m, g in enumerate(chunk) if g < fresh_count], flat)
                    loss, info = self.algorithm.loss(
                        sub,
                        agent,
                        sub.per_debate(agent, flat),
                        [reference[agent, g] for g in chunk]
                        if self.algorithm.needs_reference(agent)
                        else None,
                        advantages[chunk, agent],
                    )
                    if not torch.isfinite(loss):
                        self._fail_non_finite(iteration, f"loss of agent {agent} is {loss.item()}", info)
                    self._backward(loss * len(chunk) / total)
                    for key, value in info.items():
                        stats.setdefault(f"agent_{agent}/{key}", []).append(float(value))
                    stats.setdefault(f"agent_{agent}/loss", []).append(float(loss.detach()))
            if epoch == 0 and recompute and self.world > 1:
                _share_behavior(batch, [g for g in local if g < fresh_count])
            stats.update(self._optimizer_step(iteration))
        means = {key: float(np.mean(v)) for key, v in stats.items()}
        means["update/padding"] = self.policy.forward_stats.padding
        means = dist.mean_over_processes(means)
        for key in {k.split("/", 1)[1] for k in means if k.startswith("agent_")}:
            values = [means[f"agent_{i}/{key}"] for i in range(cfg.n_agents) if f"agent_{i}/{key}" in means]
            means[f"update/{key}"] = float(np.mean(values))
        return means

    @torch.no_grad()
    def _reference_logprobs(self, batch, debates: list[int]) -> dict[tuple[int, int], torch.Tensor]:
        """(agent, batch position) -> the agent's reference log-probs in that debate, for ``debates`` and every
        agent whose loss needs them, from one :meth:`~udpo.policy.MultiAgentPolicy.reference_logprobs` call."""
        agents = [i for i in range(self.config.n_agents) if self.algorithm.needs_reference(i)]
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
            # DeepSpeed divides by its accumulation steps and averages over processes; undo both so the
            # gradient is the same batch mean as on the plain path
            with self.accelerator.accumulate(self._ds_model):
                self.accelerator.backward(loss * self.accelerator.gradient_accumulation_steps * self.world)
        else:
            loss.backward()

    def _optimizer_step(self, iteration: int) -> dict[str, list[float]]:
        """Sum gradients over processes, clip each adapter's norm, step; returns the norms."""
        cfg, norms = self.config, {}
        if not self.deepspeed:
            dist.sum_gradients(self.params)
            for group in self.optimizer.param_groups:
                limit = cfg.max_grad_norm if cfg.max_grad_norm > 0 else float("inf")
                norm = torch.nn.utils.clip_grad_norm_(group["params"], limit)
                norms[group["adapter"]] = float(norm)
            bad = [a for a, n in norms.items() if not math.isfinite(n)]
            if bad:
                self._fail_non_finite(iteration, f"gradient norm of adapter(s) {bad} is not finite", {})
            self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.optimizer_steps += 1
        return {f"grad_norm/{a}": [n] for a, n in norms.items()}

    def _fail_non_finite(self, iteration: int, what: str, info: dict[str, Any]) -> None:
        """Stop: save the last good state (the one before this iteration) and raise a clear error."""
        self.optimizer.zero_grad(set_to_none=True)
        saved = ckpt.checkpoints_dir(self.run_dir) / ckpt.checkpoint_name(iteration - 1)
        if not (saved / ckpt.STATE).is_file():
            saved = self.save_checkpoint(iteration - 1)
        details = ", ".join(f"{k}={float(v):.4g}" for k, v in info.items())
        raise TrainingError(
            f"non-finite value at iteration {iteration}: {what}{f' ({details})' if details else ''}. "
            f"The state before this iteration is in {saved}. Lower learning_rate, check the rewards, or raise "
            f"max_grad_norm clipping; continue with --resume {saved}"
        )

    # ------------------------------------------------------------------------------------------
    # adapter sync
    # ------------------------------------------------------------------------------------------
    def sync_adapters(self, k: int) -> None:
        """Give the rollout engine the current adapters (hf: nothing to do, it serves the live model)."""
        if self.config.backend == "hf":
            return
        folder = self.run_dir / "sync" / f"rank{self.rank}" / ckpt.checkpoint_name(k)
        paths = self.policy.save_adapters(folder)
        for name, path in paths.items():
            self.backend.load_adapter(name, path)
        self._sync_dirs.append(folder)
        while len(self._sync_dirs) > 2:  # the engine may still read the previous files
            shutil.rmtree(self._sync_dirs.pop(0), ignore_errors=True)

    # ------------------------------------------------------------------------------------------
    # checkpoints
    # ------------------------------------------------------------------------------------------
    def save_checkpoint(self, iteration: int) -> Path:
        """Write checkpoint ``iteration`` atomically (all processes call this)."""
        rng_states = dist.gather_objects(ckpt.rng_state())
        final = ckpt.checkpoints_dir(self.run_dir) / ckpt.checkpoint_name(iteration)
        staging = ckpt.staging_dir(self.run_dir, iteration) if self.main else None
        dist.barrier()
        if self.deepspeed:
            self.accelerator.save_state(
                str(ckpt.checkpoints_dir(self.run_dir) / f".staging-{final.name}" / "deepspeed")
            )
        if self.main:
            assert staging is not None
            cfg = self.config
            save_team(self.policy, staging, cfg.task, [s.profile for s in self.agent_specs()], iteration)
            if cfg.reference == "lagged":
                self.policy.save_adapters(staging / "reference", reference=True)
            if not self.deepspeed:
                ckpt.save_state(staging / "optimizer", self.optimizer.state_dict())
                ckpt.save_state(staging / "scheduler", self.scheduler.state_dict())
            ckpt.save_state(staging / "rng", rng_states)
            if self.replay is not None:
                ckpt.save_state(staging / "replay", self.replay.state_dict())
            ckpt.write_json(staging / "calibration.json", self.calibration)
            state = {
                "iteration": iteration,
                "optimizer_steps": self.optimizer_steps,
                "total_iterations": self.total_iterations,
                "world_size": self.world,
                "files": ckpt.file_marks(self.run_dir, list(APPEND_ONLY)),
                "history": self.history,
                "config": cfg.to_dict(),
            }
            ckpt.write_json(staging / ckpt.STATE, state)
            ckpt.commit(self.run_dir, staging, iteration)
            ckpt.prune(self.run_dir, cfg.save_total_limit)
        dist.barrier()
        return final

    def load_checkpoint(self, path: Path) -> None:
        """Restore everything ``save_checkpoint`` wrote and rewind the append-only files.

        Nothing in a checkpoint is unpickled (see udpo.checkpoint); a file that does not fit this run
        is a CheckpointError naming it."""
        self._verify_checkpoint(path)
        state = ckpt.read_state(path)
        ignored = {
            "resume",
            "max_iterations",
            "num_train_epochs",
            "eval_steps",
            "save_steps",
            "progress",
            "report_to",
        }
        changed = sorted(
            k
            for k, v in state.get("config", {}).items()
            if k not in ignored and getattr(self.config, k, v) != v
        )
        if changed and self.main:
            print(f"note: resuming {path} with changed settings: {', '.join(changed)}", file=sys.stderr)
        if state["world_size"] != self.world:
            print(
                f"note: checkpoint written by {state['world_size']} processes, resuming with {self.world}; "
                f"sampling differs from an uninterrupted run",
                file=sys.stderr,
            )
        with _names_file(path / "adapters"):
            self.policy.load_adapters(path / "adapters")
        if self.config.reference == "lagged":
            with _names_file(path / "reference"):
                self.policy.load_adapters(path / "reference", reference=True)
        if self.deepspeed:
            self.accelerator.load_state(str(path / "deepspeed"))
        else:
            with _names_file(path / "optimizer.json"):
                self.optimizer.load_state_dict(ckpt.load_state(path / "optimizer"))
            with _names_file(path / "scheduler.json"):
                self.scheduler.load_state_dict(ckpt.load_state(path / "scheduler"))
        with _names_file(path / "calibration.json"):
            self._use_calibration(ckpt.read_json(path / "calibration.json"))  # builds the replay buffer
        if self.replay is not None:
            with _names_file(path / "replay.json"):
                self.replay.load_state_dict(ckpt.load_state(path / "replay"))
        with _names_file(path / "rng.json"):
            rng_states = ckpt.load_state(path / "rng")
            ckpt.set_rng_state(rng_states[self.rank % len(rng_states)])
        self.iteration = state["iteration"]
        self.optimizer_steps = state["optimizer_steps"]
        self.history = state.get("history", {})
        dist.barrier()
        if self.main:
            ckpt.rewind_files(self.run_dir, state["files"])
            for folder in (self.run_dir / "eval").glob("iter_*"):
                if int(folder.name.split("_")[1]) > self.iteration:
                    shutil.rmtree(folder)
        dist.barrier()
        self.sync_adapters(self.iteration)

    # ------------------------------------------------------------------------------------------
    # the run
    # ------------------------------------------------------------------------------------------
    def train(self) -> dict[str, Any]:
        """Run (or resume) training to ``total_iterations``; returns the before/after evaluations."""
        cfg = self.config
        if self.main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        dist.barrier()
        resumed = None
        if cfg.resume is not None:
            resumed = ckpt.resolve(self.run_dir, cfg.resume)
            self.load_checkpoint(resumed)
        elif self.main:  # a start stopped before checkpoint 0 left its metrics (see _check_run_dir)
            ckpt.rewind_files(self.run_dir, {rel: {"lines": 0, "bytes": 0} for rel in APPEND_ONLY})
        self.tracker = Tracker(
            self.run_dir, self.accelerator, cfg.report_to, cfg.run_name or self.run_dir.name, cfg.to_dict()
        )
        if self.main:
            write_json(self.run_dir / "config.json", cfg.to_dict())
            print(
                f"torch threads per process: {torch.get_num_threads()} (UDPO_NUM_THREADS=k chooses)",
                file=sys.stderr,
            )
        if resumed is None:
            self.sync_adapters(0)
            record = self.calibrate()
            self._use_calibration(record)
            if self.main:
                write_json(self.run_dir / "calibration.json", record)
            self._log_calibration(record)
            if cfg.eval_at_start and self.eval_set:
                self.history["before"] = self._evaluate_and_log(0)
            self.save_checkpoint(0)
        bar = progress_bar(self.total_iterations, self.iteration, cfg.progress and self.main)
        try:
            for k in range(self.iteration + 1, self.total_iterations + 1):
                metrics = self.run_iteration(k)
                self.iteration = k
                record = self.tracker.log(metrics, k)
                bar.update(1)
                bar.set_postfix(
                    acc=f"{record.get('train/accuracy', 0):.2f}", r=f"{record['reward/mean']:.3f}"
                )
                last = k == self.total_iterations
                if self.eval_set and ((cfg.eval_steps and k % cfg.eval_steps == 0) or last):
                    self.history["after"] = self._evaluate_and_log(k)
                if k % cfg.save_steps == 0 or last:
                    self.save_checkpoint(k)
        finally:
            bar.close()
        final = self.run_dir / "eval" / ckpt.checkpoint_name(self.iteration) / "summary.json"
        if self.eval_set and self.iteration and dist.any_true(self.main and not final.exists()):
            # resumed at the end without the last evaluation (a run stopped early at a checkpoint)
            self.history["after"] = self._evaluate_and_log(self.iteration)
        self.tracker.close()
        return {"run_dir": str(self.run_dir), "iterations": self.iteration, **self.history}

    def _evaluate_and_log(self, k: int) -> dict[str, Any]:
        start = time.perf_counter()
        summary = self.evaluate(k)
        summary["seconds"] = round(time.perf_counter() - start, 3)
        assert self.tracker is not None
        self.tracker.log(summary, k, kind="eval")
        return summary

    def _log_calibration(self, record: dict[str, Any]) -> None:
        if self.main:
            coefs = record["coefficients"]
            lines = [f"  {name:8s}" + " ".join(f"{v:7.4f}" for v in coefs[name]) for name in COEFFICIENTS]
            print(
                "reward coefficients per agent ("
                + (", ".join(record["explicit"]) or "none")
                + " explicit"
                + "".join(f", w/o {a}" for a in record.get("ablations", []))
                + "):",
                *lines,
                sep="\n",
                file=sys.stderr,
            )
        assert self.tracker is not None
        flat = {
            f"{name}/agent_{i}": v
            for name in COEFFICIENTS
            for i, v in enumerate(record["coefficients"][name])
        }
        self.tracker.log({"coefficients": flat}, 0, kind="calibration")

    def close(self) -> None:
        """Stop the rollout engine the trainer started (a backend passed in stays open) and the
        protocol's own models (an entropy_model)."""
        if self.__dict__.get("_protocol") is not None:
            self._protocol.close()
        if self._own_backend:
            self.backend.close()


# -----------------------------------------------------------------------------------------------
@contextmanager
def _names_file(path: Path) -> Iterator[None]:
    """Re-raise what goes wrong while loading a checkpoint file as a CheckpointError naming the file."""
    try:
        yield
    except ckpt.CheckpointError:
        raise
    except Exception as e:  # a damaged or foreign file fails in many ways inside torch, PEFT, safetensors
        raise ckpt.CheckpointError(f"{path}: does not fit this run ({ckpt.brief(e, 300)})") from None


def _set_behavior(batch, agent: int, debates: list[int], flat: list[torch.Tensor]) -> None:
    """Make ``flat`` (per-round tensors ordered as ``batch.agent_sequences(agent)``) the behavior log-probs
    of ``debates`` (positions in ``batch``), in the batch and in the stored trajectories."""
    starts = np.cumsum([0, *(len(row[agent].completion_ids) for row in batch.turns)])
    for m in debates:
        for r, lp in enumerate(flat[starts[m] : starts[m + 1]]):
            batch.set_behavior_logprobs(m, agent, r, lp.detach().float().cpu().tolist())


def _share_behavior(batch, local: list[int]) -> None:
    """Give every process the behavior log-probs each recomputed for its own ``local`` debates, so every
    process's stored trajectories (and replay buffer) hold the same numbers."""
    mine = {m: [row.behavior_logprobs for row in batch.turns[m]] for m in local}
    for theirs in dist.gather_objects(mine):
        for m, agents in theirs.items():
            if m not in mine:
                for agent, rounds in enumerate(agents):
                    for r, values in enumerate(rounds):
                        batch.set_behavior_logprobs(m, agent, r, values)


def train(config: TrainConfig, eval_callbacks: Sequence[EvalCallback] = ()) -> dict[str, Any]:
    """Build a Trainer for ``config``, run it, print the before/after evaluation; returns the summaries."""
    trainer = Trainer(config, eval_callbacks)
    try:
        result = trainer.train()
    finally:
        trainer.close()
    if trainer.main:
        print(format_result(result))
    return result


def format_result(result: dict[str, Any]) -> str:
    """Held-out accuracy and U metrics before and after training, as a small table."""
    rows = [f"run: {result['run_dir']} ({result['iterations']} iterations)"]
    keys = ("accuracy", "u_intra", "u_inter", "u_sys")
    rows.append(f"{'':8s}" + "".join(f"{k:>10s}" for k in keys))
    for when in ("before", "after"):
        if when in result:
            rows.append(f"{when:8s}" + "".join(f"{result[when][k]:10.3f}" for k in keys))
    return "\n".join(rows)
