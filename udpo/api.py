"""The Python API, shaped like TRL's trainers: a config dataclass, and a trainer that takes a model, datasets,
reward functions, a PEFT ``LoraConfig`` and callbacks::

    from peft import LoraConfig
    from udpo import UDPOConfig, UDPOTrainer

    train = [{"question": "Tom has 3 apples and buys 4 more. How many does he have?", "answer": "7"}, ...]
    args = UDPOConfig(output_dir="runs/mine", n_agents=3, rounds=2, max_iterations=50)
    with UDPOTrainer(
        model="smollm2-135m-instruct",
        args=args,
        train_dataset=train,                       # list of dicts, datasets.Dataset, or a JSONL path
        eval_dataset=test,
        reward_funcs=[my_reward],                  # (trajectory, agent) -> float, beside UDPO's rewards
        peft_config=LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"),
    ) as trainer:
        trainer.train()

``UDPOConfig`` is the training config (every field of ``udpo train --help`` and the recipes); ``MAPPOConfig``
and ``RMAACConfig`` are the same with the baselines' ``algorithm``. The trainer is
:class:`udpo.training.trainer.Trainer`, given its inputs as Python objects: see :class:`UDPOTrainer`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from udpo.algorithms.reward_functions import RewardFn, load_reward_functions
from udpo.config import AlgorithmName, TrainConfig, _f
from udpo.env.backends.base import Backend
from udpo.env.tasks import Task, register_task
from udpo.env.tasks.custom import DatasetTask, Records
from udpo.training.callbacks import EvalCallback, UDPOCallback
from udpo.training.trainer import Trainer

if TYPE_CHECKING:
    from udpo.pretrained import Team

__all__ = ["MAPPOConfig", "RMAACConfig", "UDPOConfig", "UDPOTrainer"]

_ALGORITHM_HELP = "udpo (uncertainty-driven rewards), or the baselines mappo and rmaac."


@dataclass
class UDPOConfig(TrainConfig):
    """Every setting of a training run (the fields of ``udpo train --help``), UDPO by default."""

    algorithm: AlgorithmName = _f("udpo", _ALGORITHM_HELP)


@dataclass
class MAPPOConfig(TrainConfig):
    """The training config with ``algorithm: mappo`` (a centralized critic on the team reward)."""

    algorithm: AlgorithmName = _f("mappo", _ALGORITHM_HELP)


@dataclass
class RMAACConfig(TrainConfig):
    """The training config with ``algorithm: rmaac`` (MAPPO's critic plus a state adversary)."""

    algorithm: AlgorithmName = _f("rmaac", _ALGORITHM_HELP)


class UDPOTrainer(Trainer):
    """Train a debate team from Python objects; ``args.algorithm`` picks UDPO, MAPPO or RMAAC.

    model: a model name (alias, folder, Hub id) or a loaded transformers causal LM (loaded with
        ``from_pretrained``: its ``name_or_path`` names it; the hf backend trains and samples that very
        object, vllm loads the weights from ``name_or_path``). Default: ``args.model``.
    args: a :class:`UDPOConfig` (or any ``TrainConfig``); default ``UDPOConfig()``.
    train_dataset, eval_dataset: your questions, as a list of dicts, a ``datasets.Dataset`` or a JSONL
        path, each record with ``question`` and ``answer`` (the answer format inferred from them: options
        make it choice, numbers number, anything else text; ``task=DatasetTask(answer_format=...,
        parse=..., ...)`` chooses), or a Task object as ``train_dataset`` (its splits ``args.train_split``
        / ``args.eval_split``). Without them the questions come from ``task`` or ``args.task``.
    task: a Task object (a :class:`~udpo.env.tasks.custom.DatasetTask`, with or without records, or your
        subclass of :class:`~udpo.env.tasks.Task`) or a task name; registered under ``task.name`` so
        recipes and config.json name it.
    reward_funcs: extra reward terms, callables ``(trajectory, agent) -> float`` or TRL's reward functions
        ``(prompts, completions, **kwargs) -> list[float]`` (told apart by the signature:
        :mod:`udpo.algorithms.reward_functions`), or ``module:function`` names, added after
        ``args.reward_functions``; ``args.reward_weights`` weighs the whole list.
    peft_config: a PEFT ``LoraConfig`` for every agent's adapter (default: ``args.lora_*``).
    callbacks: :class:`~udpo.training.callbacks.UDPOCallback` objects, ``transformers.TrainerCallback``
        objects (:class:`~udpo.training.callbacks.TransformersCallbacks`: on_train_begin / end, on_step_end, on_log,
        on_save, on_evaluate, with a real ``TrainerState``) and eval callbacks.
    processing_class: the tokenizer of a model object (default: loaded from its ``name_or_path``).
    backend: a running rollout engine to share (see :class:`~udpo.training.trainer.Trainer`).

    Like the command line, it sets torch's CPU threads first (:mod:`udpo.threads`: ``UDPO_NUM_THREADS``,
    else from the cores other work leaves idle).
    """

    def __init__(
        self,
        model: Any = None,
        args: TrainConfig | None = None,
        train_dataset: Records | Task | None = None,
        eval_dataset: Records | None = None,
        reward_funcs: Sequence[RewardFn | str] | None = None,
        peft_config: Any = None,
        callbacks: Sequence[UDPOCallback | EvalCallback | Any] | None = None,
        task: Task | str | None = None,
        processing_class: Any = None,
        backend: Backend | None = None,
    ):
        from udpo.threads import configure_threads
        from udpo.training.policy import LoraSettings, model_name

        configure_threads()  # as the command line does: UDPO_NUM_THREADS, or what the idle cores allow
        args = args if args is not None else UDPOConfig()
        if not isinstance(args, TrainConfig):
            raise TypeError(f"args must be a UDPOConfig (a TrainConfig), got {type(args).__name__}")
        changes: dict[str, Any] = {}
        model_object = None
        if model is not None and not isinstance(model, str):
            model_object, changes["model"] = model, model_name(model)
        elif model is not None:
            changes["model"] = model
        changes.update(_task_settings(args, task, train_dataset, eval_dataset))
        lora = None
        if peft_config is not None:
            lora = LoraSettings.from_peft(peft_config)
            changes.update(
                lora_r=lora.r,
                lora_alpha=lora.alpha,
                lora_dropout=lora.dropout,
                lora_target_modules=list(lora.target_modules),
            )
        rewards = load_reward_functions(
            [*args.reward_functions, *(reward_funcs or [])], args.reward_weights, args.reward_format
        )
        changes["reward_functions"] = [r.name for r in rewards]
        config = dataclasses.replace(args, **changes)  # validated again, with the objects' settings
        super().__init__(
            config,
            backend=backend,
            callbacks=callbacks or (),
            model=model_object,
            tokenizer=processing_class,
            lora=lora,
            reward_functions=rewards,
        )

    @property
    def team(self) -> Team:
        """The team being trained, its adapters as they are now, as a :class:`udpo.Team`:
        ``trainer.team.debate(...)``, ``.evaluate(...)``, ``.save_pretrained(folder)``."""
        from udpo.pretrained import Team

        return Team.from_trainer(self)


def _task_settings(
    args: TrainConfig, task: Task | str | None, train: Records | None, evaluation: Records | None
) -> dict[str, Any]:
    """The config fields that name the run's task, registering a task object under its name."""
    if isinstance(train, Task):  # a task as the training data: its own splits
        if task is not None or evaluation is not None:
            raise ValueError(
                "train_dataset is a Task: its splits hold the data; give no task= or eval_dataset="
            )
        task, train = train, None
    if train is None and evaluation is not None:
        raise ValueError("eval_dataset without train_dataset: give the training questions too")
    if train is not None:
        if task is None:
            task = DatasetTask()
        if not isinstance(task, DatasetTask):
            raise TypeError(
                "train_dataset needs task=None or a DatasetTask (answer format, parser); "
                f"{type(task).__name__} loads its own questions"
            )
        if task.splits:
            raise ValueError(
                f"task {task.name} already holds records ({', '.join(task.splits)}); give the data once, "
                f"to the task or to the trainer"
            )
        task = task.with_splits(train=train, test=evaluation)
    if task is None:
        return {}
    if isinstance(task, str):
        return {"task": task}
    if not isinstance(task, Task):
        raise TypeError(f"task must be a Task object or a task name, got {type(task).__name__}")
    register_task(task.name, task)
    settings: dict[str, Any] = {"task": task.name, "task_options": None}
    if isinstance(task, DatasetTask):
        settings["train_split"] = "train" if "train" in task.splits else task.splits[0]
        settings["eval_split"] = "test" if "test" in task.splits else settings["train_split"]
        if "test" not in task.splits:
            settings["eval_questions"] = 0  # no held-out questions given: no evaluation
    else:
        settings.update(train_split=args.train_split, eval_split=args.eval_split)
    return settings
