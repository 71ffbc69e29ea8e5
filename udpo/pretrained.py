"""A trained debate team as one object: load it, let it debate, evaluate it, save it::

    from udpo import Team

    team = Team.from_pretrained("runs/mine")        # a run folder, a checkpoint or a `udpo export` folder
    result = team.debate(["Which colour do you get by mixing blue and yellow paint?"])
    print(result.answers, team.evaluate(test_rows)["accuracy"])
    team.save_pretrained("team/")                   # the layout `udpo export` writes

A ``UDPOTrainer`` hands over the team it trains as ``trainer.team``. Underneath are the paths ``udpo eval
--checkpoint`` takes: :meth:`~udpo.training.policy.MultiAgentPolicy.from_team` builds the base model with one
LoRA adapter per agent, :meth:`~udpo.training.policy.MultiAgentPolicy.rollout_backend` serves them, and
:class:`~udpo.env.debate.DebateEnv` runs the debates.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from udpo.env.backends.base import SamplingParams
from udpo.env.debate import DebateConfig, DebateEnv
from udpo.env.protocols import Protocol, Stage
from udpo.env.summary import summarize
from udpo.env.tasks import Question, Task, get_task, task_names
from udpo.env.tasks.base import Answer
from udpo.env.tasks.custom import DatasetTask
from udpo.env.trajectory import Trajectory
from udpo.training.export import export_team, find_checkpoint, shown
from udpo.training.policy import MultiAgentPolicy
from udpo.training.team import TeamManifest, save_team

if TYPE_CHECKING:
    from udpo.training.trainer import Trainer

log = logging.getLogger(__name__)

__all__ = ["DebateResult", "Team"]

#: what a question given to :meth:`Team.debate` may be
QuestionLike = str | Mapping[str, Any] | Question
#: the summary values that need gold answers
GOLD_METRICS = ("accuracy", "wrong_majority", "wrong_unanimous")


@dataclass
class DebateResult:
    """The debates of :meth:`Team.debate`, one per question in the order given; ``trajectories`` hold
    every turn (each agent's messages, text and parsed answer per round)."""

    trajectories: list[Trajectory]

    def __len__(self) -> int:
        return len(self.trajectories)

    @property
    def answers(self) -> list[Answer]:
        """The team's answer to each question: the majority vote of the last round (None: no answer won)."""
        return [t.prediction for t in self.trajectories]

    @property
    def votes(self) -> list[list[Answer]]:
        """Each agent's last-round answer, per question (None: unparsed)."""
        return [[row[-1] for row in t.answers] for t in self.trajectories]

    @property
    def correct(self) -> list[bool | None]:
        """Whether the team's answer is the gold answer, per question; None where a question has none."""
        return [t.correct if t.gold is not None else None for t in self.trajectories]

    @property
    def accuracy(self) -> float | None:
        """The share of questions answered correctly; None unless every question has a gold answer."""
        return self.summary()["accuracy"]

    def summary(self) -> dict[str, Any]:
        """Accuracy, the mean U_intra, U_inter and U_sys, the unparsed rate and the consensus-on-wrong
        shares (:func:`udpo.env.summary.summarize`); without gold answers the values that need them are None."""
        summary = summarize(self.trajectories)
        if any(t.gold is None for t in self.trajectories):
            summary.update(dict.fromkeys(GOLD_METRICS))
        return summary


class Team:
    """N agents, each a LoRA adapter on a base model, with the debate settings they were trained with.

    policy: the agents (:class:`~udpo.training.policy.MultiAgentPolicy`). manifest: what ``team.json``
    says of them (profiles, task, debate settings). task: the task questions are prompted and parsed
    with when :meth:`debate` is given none (None: not known here). Build one with :meth:`from_pretrained`
    or take ``trainer.team``.
    """

    def __init__(self, policy: MultiAgentPolicy, manifest: TeamManifest, task: Task | None = None):
        if policy.n_agents != manifest.n_agents:
            raise ValueError(f"a policy of {policy.n_agents} agents for a manifest of {manifest.n_agents}")
        self.policy, self.manifest, self.task = policy, manifest, task

    @classmethod
    def from_pretrained(
        cls,
        folder: str | os.PathLike,
        *,
        task: Task | str | None = None,
        dtype: str = "auto",
        device: str | None = None,
    ) -> Team:
        """The team saved in ``folder``: a run folder (its latest checkpoint), a checkpoint folder or an
        export (``udpo export``, :meth:`save_pretrained`). Every adapter is checked before the base model
        loads. task: a Task or a task name; default the task team.json names when it is built in or
        registered in this process (an import path there is not imported: pass ``task=``). dtype: "auto" is
        chosen for generation (:func:`udpo.env.backends.machine.choose_dtype`: on a CPU with bf16 matrix
        units the faster of bf16 and fp32 for the base model's shape, probed once and cached), logged and
        kept in ``team.policy.dtype_choice``."""
        source = find_checkpoint(folder)
        manifest = TeamManifest.load(source)
        manifest.check_adapters(source)
        if task is None and manifest.task in task_names():
            task = manifest.task
        policy = MultiAgentPolicy.from_team(source, dtype=dtype, device=device, work="generate")
        log.info("team %s: %s", shown(source), policy.dtype_choice.describe())
        return cls(policy, manifest, get_task(task) if isinstance(task, str) else task)

    @classmethod
    def from_trainer(cls, trainer: Trainer) -> Team:
        """The team a trainer trains, its adapters live (what ``trainer.team`` gives)."""
        manifest = TeamManifest.from_policy(
            trainer.policy, iteration=trainer.iteration, **trainer.team_settings()
        )
        return cls(trainer.policy, manifest, trainer.task)

    @property
    def n_agents(self) -> int:
        return self.manifest.n_agents

    @property
    def base_model(self) -> str:
        return self.manifest.base_model

    def save_pretrained(
        self,
        folder: str | os.PathLike,
        *,
        merge: bool = False,
        overwrite: bool = False,
        base_model: str | Mapping[str, str] | None = None,
    ) -> Path:
        """Write the team to ``folder`` as ``udpo export`` does (``team.json`` and ``adapters/<name>`` with
        model cards; with ``merge`` also ``merged/<name>``, full models), through the same code: a folder
        that holds a run or anything but an earlier export is refused, and ``overwrite`` replaces only an
        export. base_model: the name the adapters give their base instead of the default (``udpo export
        --base-model``; see :func:`udpo.training.export.export_team`)."""
        out = Path(folder)
        parent = out.resolve().parent
        parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".team-", dir=parent) as written:
            save_team(
                self.policy,
                written,
                task=self.manifest.task,
                profiles=[a.profile for a in self.manifest.agents],
                iteration=self.manifest.iteration,
                debate=self.manifest.debate,
            )
            export_team(
                written,
                out,
                merge=merge,
                overwrite=overwrite,
                base_models=base_model,
                command=f"Team.save_pretrained({shown(out)!r}{', merge=True' if merge else ''})",
            )
        return out

    def debate(
        self,
        questions: QuestionLike | Sequence[QuestionLike],
        *,
        task: Task | str | None = None,
        rounds: int | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        protocol: Protocol | Sequence[Stage] | None = None,
        debate_batch_size: int = DebateConfig.debate_batch_size,
        seed: int | None = None,
        progress: bool = True,
    ) -> DebateResult:
        """Debate ``questions`` (or one question), all of one kind:

        - strings: questions without gold answers, prompted and parsed by ``task`` (default the team's,
          else a text :class:`~udpo.env.tasks.custom.DatasetTask`);
        - dicts with ``question`` and ``answer`` (``options``, ``id`` optional): read by ``task`` when it is
          a DatasetTask (default: the team's if it is one, else a DatasetTask whose answer format is
          inferred from the answers);
        - :class:`~udpo.env.tasks.Question` objects (``task.load(...)``): debated under ``task`` (default
          the team's).

        rounds, max_tokens, temperature, top_p: default the settings the team was trained with, else
        2 rounds and :class:`~udpo.env.backends.base.SamplingParams`' defaults. protocol: a Protocol or
        stages (default Standard MAD). debate_batch_size: questions debated together. seed: seeds Python,
        NumPy and torch first, for a repeatable sample. progress: a line that moves with the debates.
        """
        task, items = self._questions(questions, task)
        settings = {"rounds": rounds, "max_tokens": max_tokens, "temperature": temperature, "top_p": top_p}
        chosen = {**self.manifest.debate, **{k: v for k, v in settings.items() if v is not None}}
        sampling = SamplingParams(
            **{k: chosen[k] for k in ("temperature", "top_p", "max_tokens") if k in chosen}
        )
        config = DebateConfig(
            n_agents=self.n_agents,
            rounds=chosen.get("rounds", DebateConfig.rounds),
            sampling=sampling,
            agents=self.manifest.agent_specs(),
            debate_batch_size=debate_batch_size,
        )
        if seed is not None:
            from transformers import set_seed

            set_seed(seed)
        with self.policy.rollout_backend(max_batch=debate_batch_size * self.n_agents) as backend:
            env = DebateEnv(task, backend, config, protocol=protocol)
            return DebateResult(env.run(items, progress=progress))

    def evaluate(
        self,
        data: Task | str | Sequence[QuestionLike] | None = None,
        *,
        task: Task | str | None = None,
        split: str = "test",
        limit: int | None = None,
        data_path: str | None = None,
        **debate_options: Any,
    ) -> dict[str, Any]:
        """Accuracy, U_intra, U_inter, U_sys, the unparsed rate and the consensus-on-wrong shares of the
        team on ``data``: a Task or task name (its ``split``, from ``data_path``; default the team's task)
        or questions with gold answers as :meth:`debate` takes them (``task`` reads them). ``limit``
        keeps the first questions; ``debate_options`` go to :meth:`debate`."""
        if data is None or isinstance(data, Task | str):
            if task is not None:
                raise ValueError("give the task once: as data or as task=")
            task = self._task(data)
            questions = task.load(split, data_path, limit=limit)
        else:
            task, questions = self._questions(data, task)
            questions = questions[:limit]
        ungraded = [q.id for q in questions if q.gold is None]
        if ungraded:
            raise ValueError(
                f"evaluate needs gold answers and {len(ungraded)} questions have none ({ungraded[0]}, ...); "
                f"debate() them instead"
            )
        return self.debate(questions, task=task, **debate_options).summary()

    def _task(self, task: Task | str | None) -> Task:
        """``task`` (a name is looked up), else the team's; an error saying what to pass when neither is known."""
        if isinstance(task, str):
            return get_task(task)
        if task is not None:
            return task
        if self.task is None:
            raise ValueError(
                f"the team's task {self.manifest.task!r} is not known in this process: pass task= (a Task "
                f"or a task name) or give the questions as dicts with their answers"
            )
        return self.task

    def _questions(
        self, questions: QuestionLike | Sequence[QuestionLike], task: Task | str | None
    ) -> tuple[Task, list[Question]]:
        """The task to debate under and ``questions`` as Question objects (see :meth:`debate`)."""
        items = [questions] if isinstance(questions, str | Mapping | Question) else list(questions)
        if not items:
            raise ValueError("no questions given")
        if all(isinstance(q, Question) for q in items):
            return self._task(task), items
        if all(isinstance(q, str) for q in items):
            known = task is not None or self.task is not None
            chosen = self._task(task) if known else DatasetTask(answer_format="text")
            return chosen, [Question(id=f"question-{k}", text=q, gold=None) for k, q in enumerate(items)]
        if all(isinstance(q, Mapping) for q in items):
            reader = self._task(task) if task is not None else self.task
            if not isinstance(reader, DatasetTask):
                if task is not None:
                    raise TypeError(
                        f"dict questions are read by a DatasetTask, and task is a {type(reader).__name__}: "
                        f"give Question objects (task.load(...)) or a DatasetTask"
                    )
                reader = DatasetTask()
            reader = reader.with_splits(debate=items)
            return reader, reader.load("debate")
        raise TypeError(
            "questions must be strings, dicts (question, answer, ...) or Question objects, one kind per call"
        )
