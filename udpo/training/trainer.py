"""The training loop shared by every algorithm (UDPO, and the MAPPO / RMAAC baselines).

One iteration, as in the paper's Algorithm 1::

    rollout   debate this iteration's questions with the current adapters (each process a shard)
    reward    gather the debates; per-agent rewards r_i and advantages over the whole batch
    update    per agent i (its adapter alone active): log-probs, the algorithm's loss, backward;
              a critic's loss (mappo, rmaac); gradients summed over processes, clipped per adapter,
              one AdamW step
    sync      hand the new adapters to the rollout engine (hf: nothing, it is the live model;
              vllm: adapter files and new LoRA ids, the base model stays loaded)

Before the first iteration: warm-up calibration of UDPO's per-agent reward coefficients on held-out
training questions (skipped when all are given, and by the baselines), and a held-out Standard-MAD
evaluation. Every ``eval_steps`` iterations the evaluation runs again (plus the configured eval
callbacks); every ``save_steps`` a checkpoint is written so a killed run resumes exactly.

The run's surroundings are a :class:`~udpo.training.run_env.RunEnvironment`; the parts this loop calls
(built by :mod:`udpo.training.parts`) live in :mod:`udpo.training`; each algorithm's math in
:mod:`udpo.algorithms`.

What the run writes where in its folder: :class:`udpo.env.run_folder.RunFolder`.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from udpo.algorithms.base import Advantages, Algorithm, RolloutBatch, fill_behavior_logprobs, record_behavior
from udpo.algorithms.reward_functions import RewardFunction
from udpo.config import TrainConfig
from udpo.config.groups import AlgorithmArgs, ModelArgs, RewardArgs, RunArgs
from udpo.env.backends.base import Backend
from udpo.env.debate import DebateConfig
from udpo.env.jsonl import write_json
from udpo.env.protocols import Protocol
from udpo.env.run_folder import RunFolder
from udpo.env.summary import summarize
from udpo.env.tasks.base import Question
from udpo.env.trajectory import Trajectory, TrajectoryWriter
from udpo.training import calibration, checkpointing, dynamic_sampling
from udpo.training import checkpoint_store as ckpt
from udpo.training import distributed as dist
from udpo.training.callbacks import EvalCallback, UDPOCallback, eval_callbacks_for, split_callbacks
from udpo.training.data import QuestionSchedule, split_warmup
from udpo.training.errors import TrainingError, explain_oom, non_finite_error
from udpo.training.memory import PhasePeaks
from udpo.training.parts import algorithm_parts, build_parts
from udpo.training.replay import RunReplay
from udpo.training.run_env import RunEnvironment
from udpo.training.state import TrainingState
from udpo.training.tracking import Timer, Tracker, format_result, progress_bar
from udpo.training.update import UpdateResult

__all__ = [
    "EvalCallback",
    "QuestionSchedule",
    "Trainer",
    "TrainingError",
    "UDPOCallback",
    "explain_oom",
    "split_warmup",
    "train",
]


class Trainer:
    """Trains a team of LoRA agents on one task with one algorithm; see the module docstring.

    ``env``: the run's surroundings (:class:`~udpo.training.run_env.RunEnvironment`). Parts, built with the
    configuration resolved whole (:mod:`udpo.training.parts`; ``config`` is the resolved one): ``data``
    (questions, schedule), ``policy`` (the team), ``critic`` (mappo, rmaac), ``updater`` (optimizer, one
    update), ``rollouts`` (the debate engine), ``evaluation`` (held-out); ``algorithm`` and ``replay``
    once the coefficients are known (calibration or checkpoint).

    eval_callbacks: extra evaluations run at every evaluation, each ``(trainer, iteration) -> dict``
    (e.g. an attack evaluation); added to those named by ``config.eval_callbacks``. A callback may use
    ``trainer.config, run_dir, folder, task, eval_set, backend, main, debate_config(), debate_protocol()``
    (``folder``: the run folder's files, :class:`~udpo.env.run_folder.RunFolder`).
    backend: a running rollout engine of kind ``config.backend`` to use instead of starting one (e.g.
    one vLLM engine shared by several runs); the trainer registers its adapters there but never closes it.
    callbacks: :class:`~udpo.training.callbacks.UDPOCallback` objects (hooks), ``transformers.TrainerCallback``
    objects (:class:`~udpo.training.callbacks.TransformersCallbacks`), or eval callbacks. A hook that sets
    ``should_training_stop`` ends the run at the end of the iteration, with a checkpoint.
    model, tokenizer: a loaded base model (and its tokenizer) instead of loading ``config.model``, whose
    value must be the model's name (``udpo.UDPOTrainer`` sets it). lora: adapter settings instead of the
    config's ``lora_*`` fields (a PEFT LoraConfig, :meth:`udpo.training.policy.LoraSettings.from_peft`).
    reward_functions: the user reward terms instead of loading ``config.reward_functions``.

    A trainer holds the run folder's lock and, for vllm, an engine: use it as a context manager
    (``with Trainer(config) as trainer: trainer.train()``) or call :meth:`close`.
    """

    def __init__(
        self,
        config: TrainConfig,
        eval_callbacks: Sequence[EvalCallback] = (),
        backend: Backend | None = None,
        *,
        callbacks: Sequence[UDPOCallback | EvalCallback | Any] = (),
        model: Any = None,
        tokenizer: Any = None,
        lora: Any = None,
        reward_functions: Sequence[RewardFunction] | None = None,
    ):
        self.run_dir = Path(config.output_dir)
        self.callbacks, more_evals = split_callbacks(callbacks)
        self.should_training_stop = False  # set by a callback: the run ends at the end of the iteration
        evals = eval_callbacks_for(config.group(RunArgs), [*eval_callbacks, *more_evals])
        self.env = env = RunEnvironment(config.group(ModelArgs), config.group(RunArgs))
        self.folder = env.folder  # the run folder's files
        self.accelerator, self.main, self.rank, self.world = env.accelerator, env.main, env.rank, env.world
        with env.closed_on_failure():
            parts = build_parts(
                config,
                env,
                backend,
                eval_callbacks=evals,
                model=model,
                tokenizer=tokenizer,
                lora=lora,
                reward_functions=reward_functions,
            )
        self.config = parts.config  # resolved: the one configuration of the run from here on
        self.reward_functions, self.data = parts.reward_functions, parts.data
        self.task, self.eval_set, self.schedule = self.data.task, self.data.eval_set, self.data.schedule
        self.policy, self.critic = parts.policy, parts.critic
        self.updater, self.rollouts, self.evaluation = parts.updater, parts.rollouts, parts.evaluation
        self.update_plan = parts.update_plan  # the update's sizes and their estimate (benchmarks read it)
        # built once the coefficients are known (calibration or checkpoint)
        self.algorithm: Algorithm | None = None
        self.replay: RunReplay | None = None
        self.tracker: Tracker  # opened by train()
        self.state = TrainingState()  # where the run stands; what a checkpoint gives back on resume

    # ------------------------------------------------------------------------------------------
    # the run: Algorithm 1, top to bottom
    # ------------------------------------------------------------------------------------------
    def train(self) -> dict[str, Any]:
        """Run (or resume) training to ``total_iterations``; returns the before/after evaluations.

        Algorithm 1: the start (calibration, the evaluation before training, checkpoint 0), or a
        checkpoint resumed; then for k = 1..K one iteration (:meth:`run_iteration`), logged, saved and
        evaluated when due."""
        resumed = self._open_run()
        # the iteration bar first, so that the debates' progress line (warm-up, evaluations, rollouts)
        # goes below it
        bar = progress_bar(
            self.data.total_iterations, self.state.iteration, self.config.progress and self.main
        )
        try:
            if resumed is None:
                self._start(bar)
            elif self.evaluation.due(k := self.state.iteration) and self.state.last_evaluation != k:
                # stopped while evaluating at its checkpoint (or resumed past the end of a shortened run)
                self.state.history["after"] = self._evaluate_and_log(k)
                checkpointing.record_evaluation(self.state, k, self.folder, self.main)
            for k in range(self.state.iteration + 1, self.data.total_iterations + 1):
                metrics = self.run_iteration(k)
                if self._end_iteration(k, metrics, bar):
                    break
        finally:
            bar.close()
        self.tracker.close()
        result = {"run_dir": str(self.run_dir), "iterations": self.state.iteration, **self.state.history}
        self._call("on_train_end", result)
        return result

    def _open_run(self) -> Path | None:
        """The run folder, the checkpoint resumed (None: a start), the trackers and config.json; then the
        ``on_train_begin`` hooks."""
        cfg = self.config
        if self.main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        dist.barrier()
        resumed = ckpt.resolve(self.run_dir, cfg.resume) if cfg.resume is not None else None
        if resumed is not None:
            self._resume(resumed)
        elif self.main:  # a start stopped before checkpoint 0 left its metrics (checkpointing.check_run_dir)
            ckpt.rewind_files(self.run_dir, {rel: {"lines": 0, "bytes": 0} for rel in RunFolder.APPEND_ONLY})
        self.tracker = self.env.start_tracking(cfg.to_dict())
        self.should_training_stop = False
        self._call("on_train_begin")
        return resumed

    def _start(self, bar: tqdm) -> None:
        """Before iteration 1 (Algorithm 1, lines 0-2): the reward coefficients calibrated on the warm-up
        debates (the critic fitted to them, with ``critic_warmup_epochs``), the evaluation before
        training, and checkpoint 0."""
        cfg, tracker = self.config, self.tracker
        self.rollouts.sync_adapters(0)
        record, warmup = self.calibrate()
        self.use_calibration(record)
        if self.main:
            write_json(self.folder.calibration, record)
            bar.write(calibration.describe(record), file=sys.stderr)
        tracker.log({"coefficients": calibration.flat_coefficients(record)}, 0, kind="calibration")
        if self.critic is not None and warmup:  # critic_warmup_epochs: a warm start
            fitted = self.updater.warm_start_critic(
                self._algorithm(), self.rollout_batch(warmup), cfg.critic_warmup_epochs, self._fail_non_finite
            )
            tracker.log(fitted, 0, kind="critic_warmup")
        if cfg.eval_at_start and self.eval_set:
            self.state.history["before"] = self._evaluate_and_log(0)
        self.save_checkpoint(0)

    def run_iteration(self, k: int) -> dict[str, Any]:
        """Rollout, reward, update, sync for iteration ``k`` (Algorithm 1, lines 4-19); returns its metrics.

        The rollout draws the iteration's questions from the run's stream where the last iteration left it
        and, with dynamic sampling, keeps drawing until the update holds ``questions_per_iteration``
        informative questions or the cap is reached (:func:`~udpo.training.dynamic_sampling.draw_informative`).
        """
        cfg, timer, peaks = self.config, Timer(), PhasePeaks()
        algorithm = self._algorithm()
        adversary = algorithm.adversary_stage(self.task)  # rmaac perturbs what agents read in training
        protocol = self.debate_protocol().with_stages(adversary) if adversary is not None else None
        start = self.state.questions_drawn  # the stream position where iteration k starts
        with timer("rollout"), peaks("rollout"):
            draw = dynamic_sampling.draw_informative(
                cfg.questions_per_iteration,
                cfg.debates_per_question,
                lambda offset, n: self.schedule.take(start + offset, n),
                lambda qs: self.debate(qs, {"phase": "train", "iteration": k}, protocol=protocol),
                lambda debates: algorithm.rewards(debates)[0],
                dynamic=cfg.dynamic_sampling,
                max_extra=dynamic_sampling.extra_cap(
                    cfg.questions_per_iteration, cfg.dynamic_sampling_max_extra
                ),
            )
        debated, fresh = draw.debated, draw.kept
        kept = {id(t) for t in fresh}
        for t in debated:
            if id(t) not in kept:
                t.meta["dropped"] = True  # an uninformative question's debate, not in the update
        tokens = sum(len(turn.completion_ids) for t in debated for row in t.turns for turn in row)
        if self.main:
            with TrajectoryWriter(self.folder.train) as writer:
                writer.write(debated)
        metrics: dict[str, Any] = {
            "epoch": round(self.schedule.epoch_at(start + draw.questions), 4),
            "lr": self.updater.scheduler.get_last_lr()[0],
            **{f"train/{key}": v for key, v in summarize(debated).items() if key != "n_questions"},
        }
        if fresh and self.updater.can_update(len(fresh)):
            metrics.update(self._update_on(k, fresh, algorithm, timer, peaks))
        else:  # dynamic sampling's cap reached with too few informative debates to share: no step
            metrics.update({"update/skipped": 1, "replayed": 0})
        with timer("sync"):
            self.rollouts.sync_adapters(k)
            if cfg.reference == "lagged" and k % cfg.ref_update_interval == 0:
                self.policy.refresh_reference()
        times = timer.pop()
        return {
            **metrics,
            **draw.metrics(),
            "questions_drawn": start + draw.questions,
            "debates": len(debated),
            "tokens": tokens,
            "tokens_per_s": tokens / max(times["rollout"], 1e-9),
            **peaks.metrics(),
            **{f"time/{name}": round(s, 4) for name, s in times.items()},
        }

    def _update_on(
        self, k: int, fresh: list[Trajectory], algorithm: Algorithm, timer: Timer, peaks: PhasePeaks
    ) -> dict[str, Any]:
        """Reward and update iteration ``k`` on the ``fresh`` debates its update keeps (with replayed ones);
        returns the metrics of the reward terms, advantages, replay and update."""
        cfg = self.config
        with timer("reward"):
            trajectories, weights, n_replayed = (
                (fresh, None, 0)
                if self.replay is None
                else self.replay.update_batch(fresh, k, self.data.train_set, self.debate)
            )
            if cfg.behavior_logprobs == "rollout":  # engines that return none
                fill_behavior_logprobs(trajectories, self.policy, **self.updater.scoring())
            batch = self.rollout_batch(trajectories, weights)
            advantages = algorithm.advantages(batch)
        with timer("update"), explain_oom(cfg), peaks("update"):
            result = self.update(batch, advantages, fresh_count=len(fresh), iteration=k)
        record_behavior(fresh, result.behavior)  # the fresh debates are the batch's first
        if self.replay is not None:
            self.replay.add(fresh)  # with the behavior log-probs their update used
        own = batch.select(range(len(fresh)))  # the fresh debates: the within-question differences
        shares = dynamic_sampling.reward_shares(algorithm.reward_parts(own), own.group_ids)
        return {
            **algorithm.batch_metrics(batch, advantages),
            "groups/zero_advantage_agents": dynamic_sampling.zero_advantage_agents(
                own.rewards, own.group_ids
            ),
            **{f"reward_share/{name}": round(v, 6) for name, v in shares.items()},
            **(self.replay.stats() if self.replay is not None else {}),
            **result.metrics,
            "replayed": n_replayed,
            "update/skipped": 0,
        }

    def _end_iteration(self, k: int, metrics: dict[str, Any], bar: tqdm) -> bool:
        """Log iteration ``k``, then checkpoint and evaluate it when due; True when the run stops here
        (a callback asked for it)."""
        self.state.iteration = k
        self.state.questions_drawn = metrics["questions_drawn"]
        record = self.tracker.log(metrics, k)
        self._call("on_iteration_end", k, record)
        bar.update(1)
        bar.set_postfix(
            acc=f"{record.get('train/accuracy', 0):.2f}", r=f"{record.get('reward/mean', math.nan):.3f}"
        )
        stop = self.should_training_stop  # asked for by a callback: this iteration is the last
        saved = k % self.config.save_steps == 0 or k == self.data.total_iterations or stop
        if saved:  # before the evaluation: a run killed while evaluating keeps its iterations
            self.save_checkpoint(k)
        if self.evaluation.due(k) or (stop and bool(self.eval_set)):
            self.state.history["after"] = self._evaluate_and_log(k)
            if saved:
                checkpointing.record_evaluation(self.state, k, self.folder, self.main)
        if not self.should_training_stop:  # asked for now, or by the evaluation's callbacks
            return False
        if not saved:
            self.save_checkpoint(k)
        return True

    def _evaluate_and_log(self, k: int) -> dict[str, Any]:
        start = time.perf_counter()
        summary = self.evaluate(k)
        summary["seconds"] = round(time.perf_counter() - start, 3)
        self.tracker.log(summary, k, kind="eval")
        self.state.last_evaluation = k
        self._call("on_evaluate", k, summary)
        return summary

    # ------------------------------------------------------------------------------------------
    # what the loop calls
    # ------------------------------------------------------------------------------------------
    def use_calibration(self, record: dict[str, Any]) -> None:
        """Build the algorithm (and the replay buffer, whose priority uses the base weights) from a
        calibration record."""
        self.state.calibration = record
        self.algorithm, self.replay = algorithm_parts(self.config, record, self.critic, self.reward_functions)

    def _algorithm(self) -> Algorithm:
        """The algorithm, once :meth:`use_calibration` has built it."""
        if self.algorithm is None:
            raise RuntimeError("no algorithm yet: use_calibration() builds it (calibration or checkpoint)")
        return self.algorithm

    def calibrate(self) -> tuple[dict[str, Any], list[Trajectory]]:
        """The calibration record of this run and its warm-up debates
        (:func:`udpo.training.calibration.calibrate`)."""
        cfg = self.config
        return calibration.calibrate(
            cfg.group(RewardArgs),
            cfg.group(AlgorithmArgs),
            self.data.warmup_set,
            self.debate,
            self.run_dir,
            self.main,
            n_agents=cfg.n_agents,
            rounds=cfg.rounds,
        )

    def debate(
        self, questions: Sequence[Question], meta: dict[str, Any], protocol: Protocol | None = None
    ) -> list[Trajectory]:
        with explain_oom(self.config):
            return self.rollouts.debate(questions, meta, protocol=protocol)

    def rollout_batch(
        self, trajectories: list[Trajectory], weights: Sequence[float] | None = None
    ) -> RolloutBatch:
        """The algorithm's rewards and the per-agent turns of a list of debates (:meth:`Algorithm.batch`)."""
        return self._algorithm().batch(trajectories, weights)

    def update(
        self, batch: RolloutBatch, advantages: Advantages, fresh_count: int, iteration: int
    ) -> UpdateResult:
        """One update on ``batch`` (:meth:`udpo.training.update.Updater.update`)."""
        return self.updater.update(
            self._algorithm(), batch, advantages, fresh_count, iteration, self._fail_non_finite
        )

    def evaluate(self, iteration: int) -> dict[str, Any]:
        """The held-out evaluation at ``iteration`` on the evaluation's generators, then the eval callbacks
        (:class:`~udpo.training.evaluation.HeldOutEvaluation`), each called with this trainer: writes the
        evaluation's folder; returns the summary."""
        return self.evaluation.run(
            iteration, self.debate, self.rollouts.eval_rng(), lambda callback: callback(self, iteration)
        )

    def _fail_non_finite(self, iteration: int, what: str, info: dict[str, Any]) -> None:
        """Stop: save the last good state (the one before this iteration) and raise a clear error."""
        self.updater.zero_grad()
        saved = self.folder.checkpoint(iteration - 1)
        if not (saved / ckpt.STATE).is_file():
            saved = self.save_checkpoint(iteration - 1)
        raise non_finite_error(iteration, what, info, saved)

    def _call(self, hook: str, *args: Any) -> None:
        """Call ``hook`` of every UDPOCallback."""
        for callback in self.callbacks:
            getattr(callback, hook)(self, *args)

    # ------------------------------------------------------------------------------------------
    # checkpoints
    # ------------------------------------------------------------------------------------------
    def save_checkpoint(self, iteration: int) -> Path:
        path = checkpointing.save(self.state, iteration, self._checkpoint_parts())
        self._call("on_save", iteration, path)
        return path

    def _resume(self, path: Path) -> None:
        """Restore checkpoint ``path`` (:func:`udpo.training.checkpointing.load`), build the algorithm and
        the replay buffer from its calibration, fill the buffer, and hand the adapters to the engine."""
        self.state = checkpointing.load(path, self._checkpoint_parts())
        with checkpointing.names_file(path / ckpt.CALIBRATION):
            self.use_calibration(self.state.calibration or {})
        if self.replay is not None:
            with checkpointing.names_file(path / "replay.json"):
                self.replay.load_state_dict(self.state.replay or {})
        self.state.replay = None  # the buffer holds it now
        self.rollouts.sync_adapters(self.state.iteration)

    def _checkpoint_parts(self) -> checkpointing.RunParts:
        """The run and the parts a checkpoint is written from and read into."""
        return checkpointing.RunParts(
            config=self.config,
            folder=self.folder,
            rank=self.env.rank,
            world=self.env.world,
            policy=self.policy,
            updater=self.updater,
            critic=self.critic,
            replay=self.replay,
            total_iterations=self.data.total_iterations,
            team=self.team_settings(),
            deepspeed=self.env.deepspeed,
        )

    def team_settings(self) -> dict[str, Any]:
        """What team.json records besides the adapters and iteration (:meth:`Rollouts.team_settings`)."""
        return self.rollouts.team_settings()

    # ------------------------------------------------------------------------------------------
    # what eval callbacks and tests use
    # ------------------------------------------------------------------------------------------
    @property
    def backend(self) -> Backend:
        return self.rollouts.backend

    @property
    def params(self) -> list[torch.nn.Parameter]:
        return self.updater.params

    @property
    def calibration(self) -> dict[str, Any] | None:
        """The calibration record the algorithm was built from (``state.calibration``)."""
        return self.state.calibration

    @property
    def iteration(self) -> int:
        """The last finished iteration (``state.iteration``)."""
        return self.state.iteration

    def debate_config(self) -> DebateConfig:
        return self.rollouts.debate_config()

    def debate_protocol(self) -> Protocol:
        return self.rollouts.protocol()

    def close(self) -> None:
        """Stop the rollout engine the trainer started (a backend passed in stays open) and the protocol's
        own models (an entropy_model), then close the environment (the lock, accelerate's state). Twice is fine."""
        self.rollouts.close()
        self.env.close()

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def train(config: TrainConfig, eval_callbacks: Sequence[EvalCallback] = ()) -> dict[str, Any]:
    """Build a Trainer for ``config``, run it, print the before/after evaluation; returns the summaries."""
    with Trainer(config, eval_callbacks) as trainer:
        result = trainer.train()
    if trainer.main:
        print(format_result(result))
    return result
