"""Callbacks: user code the training loop calls at fixed points.

Two kinds of hook objects are taken, side by side:

- :class:`UDPOCallback` subclasses: each hook receives the trainer (``config``, ``run_dir``, ``policy``,
  ``task``, ``main``, ...). Every process calls the hooks: guard side effects (writing files, printing)
  with ``trainer.main``. A hook stops the run at the end of the iteration (with a checkpoint) by setting
  ``trainer.should_training_stop = True``.
- ``transformers.TrainerCallback`` objects (wandb's, MLflow's, ``EarlyStoppingCallback``, your own), called
  as transformers' Trainer calls them (:class:`TransformersCallbacks`, below).

A plain function ``(trainer, iteration) -> dict`` is an *eval callback* instead: it runs at every held-out
evaluation and its dict is logged beside it.

Earlier in development :class:`UDPOCallback` was called ``TrainerCallback``, the name of transformers' class with
other hooks; it was renamed, not aliased (no release had the old name).

transformers' callbacks get the events both trainers have, as transformers' Trainer sends them. One step
is one iteration (rollout, reward, update, sync). Each event gets ``(args, state, control)`` and the
keywords transformers passes (``model``: the team's PEFT model, ``processing_class``: its tokenizer,
``optimizer``, ``lr_scheduler``; the data loaders are None: debates are not batches of a loader):

- ``on_train_begin``: at the start of ``train`` (before calibration and the evaluation at iteration 0);
- ``on_step_end``, then ``on_log(logs=...)``: after each iteration, its metrics as logged
  (``reward/mean``, ``train/accuracy``, the per-agent terms, ``lr``, ``epoch``);
- ``on_save``: after each checkpoint;
- ``on_log(logs=...)``, then ``on_evaluate(metrics=...)``: after each held-out evaluation, its summary as
  ``eval_<name>`` (``eval_accuracy``, ``eval_u_sys``, ...), as transformers names evaluation metrics;
- ``on_train_end``.

``state`` is a ``transformers.TrainerState``: ``global_step`` the iteration, ``max_steps`` the run's
iterations, ``epoch``, ``log_history`` (every log, with its ``step``; a resumed run's from its
metrics.jsonl), ``is_world_process_zero`` / ``is_local_process_zero``, and ``best_metric``,
``best_global_step``, ``best_model_checkpoint`` after each evaluation when ``metric_for_best_model`` is set
(as transformers' Trainer tracks them). ``args`` is a ``transformers.TrainingArguments`` built from the
config (:func:`training_arguments`). ``control.should_training_stop`` ends the run at the end of the
iteration, with a checkpoint (and the final evaluation, if one is due); ``should_save``, ``should_evaluate``
and ``should_log`` are not read: the config's ``save_steps`` and ``eval_steps`` decide.
"""

from __future__ import annotations

import operator
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from udpo.training.tracking import flatten, read_metrics, scalars

if TYPE_CHECKING:
    from udpo.config import TrainConfig
    from udpo.config.groups import RunArgs
    from udpo.training.trainer import Trainer

#: eval callback: (trainer, iteration) -> metrics to log beside the Standard-MAD evaluation
EvalCallback = Callable[["Trainer", int], dict[str, Any]]


class UDPOCallback:
    """Hooks of the training loop; the defaults do nothing."""

    def on_train_begin(self, trainer: Trainer) -> None:
        """At the start of ``train``: before calibration and the first evaluation, or after resuming."""

    def on_iteration_end(self, trainer: Trainer, iteration: int, metrics: dict[str, Any]) -> None:
        """After iteration ``iteration``'s update and sync, with the metrics it logged."""

    def on_evaluate(self, trainer: Trainer, iteration: int, summary: dict[str, Any]) -> None:
        """After a held-out evaluation, with its summary (accuracy, U metrics, wrong_majority, ...)."""

    def on_save(self, trainer: Trainer, iteration: int, checkpoint: Path) -> None:
        """After checkpoint ``iteration`` was written to ``checkpoint``."""

    def on_train_end(self, trainer: Trainer, result: dict[str, Any]) -> None:
        """After the last iteration, with what ``train`` returns."""


def split_callbacks(callbacks: Sequence[Any]) -> tuple[list[UDPOCallback], list[EvalCallback]]:
    """(hook objects, eval callbacks) of a mixed list; ``transformers.TrainerCallback`` objects become one
    hook object that calls them (in their order). Anything else is a TypeError naming it."""
    hooks: list[UDPOCallback] = []
    evals: list[EvalCallback] = []
    transformers_callbacks: list[Any] = []
    # a transformers callback was built from an imported transformers: no need to import it here
    hf = sys.modules.get("transformers.trainer_callback")
    hf_class = hf.TrainerCallback if hf is not None else None
    for c in callbacks:
        if isinstance(c, UDPOCallback):
            hooks.append(c)
        elif hf_class is not None and isinstance(c, hf_class):
            transformers_callbacks.append(c)
        elif isinstance(c, type) and (issubclass(c, UDPOCallback) or (hf_class and issubclass(c, hf_class))):
            raise TypeError(f"callbacks: pass an instance of {c.__name__}, not the class")
        elif callable(c):
            evals.append(cast(EvalCallback, c))  # a function, or an object with __call__
        else:
            raise TypeError(
                f"callbacks: {c!r:.80} is neither a UDPOCallback, a transformers.TrainerCallback nor a "
                f"function (trainer, iteration)"
            )
    if transformers_callbacks:
        hooks.append(TransformersCallbacks(transformers_callbacks))
    return hooks, evals


def load_callbacks(specs: Sequence[str]) -> list[EvalCallback]:
    """Eval callbacks named ``package.module:function`` (or a class whose instances are called), found and
    checked by :func:`udpo.env.imports.load_callable`."""
    from udpo.env.imports import load_callable

    return [load_callable("eval_callbacks", spec) for spec in specs]


def attack_callbacks(run: RunArgs) -> list[EvalCallback]:
    """The attack evaluation that ``attack_eval`` / ``attack_eval_m`` / ``attack_eval_attacker`` ask for."""
    if run.attack_eval == "none":
        return []
    from udpo.analysis.attack_eval import attack_eval_callback
    from udpo.env.attacks import AttackConfig

    attack = AttackConfig(name=run.attack_eval, attacker=run.attack_eval_attacker, seed=run.seed)
    return [attack_eval_callback(attack, m_values=run.attack_eval_m)]


def eval_callbacks_for(run: RunArgs, given: Sequence[EvalCallback]) -> list[EvalCallback]:
    """A run's eval callbacks: those ``run.eval_callbacks`` names, the attack evaluation it asks for, then
    the ``given`` ones."""
    return [*load_callbacks(run.eval_callbacks), *attack_callbacks(run), *given]


def training_arguments(config: TrainConfig, total_iterations: int, world: int, evaluates: bool) -> Any:
    """The ``transformers.TrainingArguments`` that stand for ``config``: output_dir, run_name, seed,
    learning_rate, weight_decay, max_grad_norm, max_steps (the run's iterations), logging every step,
    eval_strategy / eval_steps (``no`` without periodic evaluations), save_steps, metric_for_best_model,
    greater_is_better, per_device_train_batch_size (debates per iteration and process), disable_tqdm;
    report_to none (the run's trackers are its own). It uses the run's Accelerator as configured (left
    alone, transformers would reset accelerate's state when a callback asks for ``args.device``)."""
    from transformers import TrainingArguments

    periodic = evaluates and config.eval_steps > 0
    return TrainingArguments(
        output_dir=config.output_dir,
        run_name=config.run_name or Path(config.output_dir).name,
        seed=config.seed,
        learning_rate=config.learning_rate,
        weight_decay=config.weight_decay,
        max_grad_norm=config.max_grad_norm,
        max_steps=total_iterations,
        logging_strategy="steps",
        logging_steps=1,
        eval_strategy="steps" if periodic else "no",
        eval_steps=config.eval_steps if periodic else None,
        save_strategy="steps",
        save_steps=config.save_steps,
        metric_for_best_model=config.metric_for_best_model,
        greater_is_better=config.greater_is_better,
        per_device_train_batch_size=max(
            1, config.questions_per_iteration * config.debates_per_question // world
        ),
        report_to="none",
        disable_tqdm=not config.progress,
        accelerator_config={"use_configured_state": True},  # the run's Accelerator, left as it is
    )


class TransformersCallbacks(UDPOCallback):
    """Calls ``callbacks`` (``transformers.TrainerCallback`` objects, in order) at UDPO's hooks; see the
    module docstring."""

    def __init__(self, callbacks: list[Any]):
        self.callbacks = list(callbacks)
        self.args: Any = None
        self.state: Any = None
        self.control: Any = None

    def on_train_begin(self, trainer: Trainer) -> None:
        from transformers import TrainerControl, TrainerState

        cfg, total = trainer.config, trainer.data.total_iterations
        self.args = training_arguments(cfg, total, trainer.world, evaluates=bool(trainer.eval_set))
        self.state = TrainerState(
            global_step=trainer.iteration,
            max_steps=total,
            logging_steps=1,
            eval_steps=cfg.eval_steps,
            save_steps=cfg.save_steps,
            train_batch_size=self.args.per_device_train_batch_size,
            is_local_process_zero=trainer.accelerator.is_local_main_process,
            is_world_process_zero=trainer.main,
        )
        epoch = 0.0  # as logged by the last iteration (dynamic sampling's extra draws move it on)
        for record in read_metrics(trainer.run_dir):  # a resumed run: its logs so far
            if record["kind"] == "train":
                epoch = record.get("epoch", trainer.schedule.epoch_of(record["iteration"]))
            if record["kind"] in ("train", "eval"):
                logs = self._logs(record, record["kind"], epoch)
                self.state.log_history.append({**logs, "step": record["iteration"]})
                if record["kind"] == "eval":
                    self._track_best(logs, record["iteration"], trainer)
        self.state.epoch = round(epoch, 4)
        self.control = TrainerControl()
        self._event("on_train_begin", trainer)

    def on_iteration_end(self, trainer: Trainer, iteration: int, metrics: dict[str, Any]) -> None:
        self.state.global_step = iteration
        self.state.epoch = metrics.get("epoch", self.state.epoch)
        self._event("on_step_end", trainer)
        self._log(self._logs(metrics, "train", self.state.epoch), trainer)

    def on_save(self, trainer: Trainer, iteration: int, checkpoint: Path) -> None:
        if self.state.best_global_step == iteration:  # evaluated before its checkpoint (iteration 0)
            self.state.best_model_checkpoint = str(checkpoint)
        self._event("on_save", trainer)

    def on_evaluate(self, trainer: Trainer, iteration: int, summary: dict[str, Any]) -> None:
        metrics = self._logs(flatten(summary), "eval", self.state.epoch)
        self._log(metrics, trainer)
        self._event("on_evaluate", trainer, metrics=metrics)
        self._track_best(metrics, iteration, trainer)

    def on_train_end(self, trainer: Trainer, result: dict[str, Any]) -> None:
        self._event("on_train_end", trainer)

    # ------------------------------------------------------------------------------------------
    @staticmethod
    def _logs(record: dict[str, Any], kind: str, epoch: float) -> dict[str, float]:
        """A record's numbers as transformers logs them: evaluations prefixed ``eval_``, with the epoch."""
        values = scalars(record)
        if kind == "eval":
            values = {f"eval_{k}": v for k, v in values.items()}
        return {**values, "epoch": round(epoch, 4)}

    def _log(self, logs: dict[str, float], trainer: Trainer) -> None:
        self.state.log_history.append({**logs, "step": self.state.global_step})
        self._event("on_log", trainer, logs=logs)

    def _track_best(self, metrics: dict[str, float], iteration: int, trainer: Trainer) -> None:
        """best_metric, best_global_step and best_model_checkpoint, as transformers' Trainer keeps them."""
        name = self.args.metric_for_best_model
        if name is None:
            return
        value = metrics.get(name if name.startswith("eval_") else f"eval_{name}")
        if value is None:
            return
        better = operator.gt if self.args.greater_is_better else operator.lt
        if self.state.best_metric is None or better(value, self.state.best_metric):
            self.state.best_metric, self.state.best_global_step = value, iteration
            saved = trainer.folder.checkpoint(iteration)
            self.state.best_model_checkpoint = str(saved) if saved.is_dir() else None

    def _event(self, event: str, trainer: Trainer, **kwargs: Any) -> None:
        """Call ``event`` of every callback as transformers' CallbackHandler does (a callback may return a
        new control); a stop asked for reaches the trainer."""
        policy = trainer.policy
        for callback in self.callbacks:
            result = getattr(callback, event)(
                self.args,
                self.state,
                self.control,
                model=policy.models[policy.base_model],
                processing_class=policy.tokenizer,
                optimizer=trainer.updater.optimizer,
                lr_scheduler=trainer.updater.scheduler,
                train_dataloader=None,
                eval_dataloader=None,
                **kwargs,
            )
            if result is not None:
                self.control = result
        if self.control.should_training_stop:
            trainer.should_training_stop = True
