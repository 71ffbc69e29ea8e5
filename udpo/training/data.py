"""A run's questions: training (in a per-epoch shuffled order), warm-up (calibration) and held-out
evaluation, and the number of iterations they make."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import partial

import numpy as np

from udpo.config import ConfigError
from udpo.config.groups import DebateArgs, ModelArgs, OptimizerArgs, RunArgs, mapping
from udpo.env.debate import AgentSpec, DebateConfig
from udpo.env.tasks import get_task
from udpo.env.tasks.base import Question, Task


class QuestionSchedule:
    """Which training questions iteration k debates: consecutive slices of the run's question stream, the
    training questions in a per-epoch shuffled order, epoch after epoch.

    Position p of the stream is a pure function of (seed, p), so a resumed run debates exactly the questions
    it would have. Without dynamic sampling iteration k debates positions (k - 1) x per_iteration onwards
    (:meth:`for_iteration`); dynamic sampling's extra draws take the next positions (:meth:`take`), and the
    run's state keeps how far the stream was drawn (``TrainingState.questions_drawn``).
    """

    def __init__(self, questions: Sequence[Question], per_iteration: int, seed: int):
        self.questions = list(questions)
        self.per_iteration = per_iteration
        self.seed = seed

    def epoch_order(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.questions))

    def take(self, start: int, count: int) -> list[Question]:
        """The ``count`` questions at stream positions ``start``, ``start + 1``, ..."""
        n, out = len(self.questions), []
        for pos in range(start, start + count):
            out.append(self.questions[int(self.epoch_order(pos // n)[pos % n])])
        return out

    def for_iteration(self, k: int) -> list[Question]:
        """Iteration k's planned questions when every earlier iteration drew exactly ``per_iteration``."""
        return self.take((k - 1) * self.per_iteration, self.per_iteration)

    def epoch_at(self, drawn: int) -> float:
        """Passes over the training questions once ``drawn`` stream positions are used."""
        return drawn / len(self.questions)

    def epoch_of(self, k: int) -> float:
        return self.epoch_at(k * self.per_iteration)


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


@dataclass
class TrainingData:
    """task; train_set, warmup_set, eval_set; schedule of train_set; total_iterations."""

    task: Task
    train_set: list[Question]
    warmup_set: list[Question]
    eval_set: list[Question]
    schedule: QuestionSchedule
    total_iterations: int

    @property
    def questions(self) -> list[Question]:
        """Every question of the run: training, warm-up and evaluation."""
        return [*self.train_set, *self.warmup_set, *self.eval_set]


def load_training_data(
    debate: DebateArgs, optim: OptimizerArgs, run: RunArgs, *, calibrates: bool
) -> TrainingData:
    """The run's questions (the task and splits of ``debate``; the evaluation set, seed and warm-up share
    of ``run``; the iterations ``optim`` makes of them). ``calibrates``: whether a warm-up share is held
    out (not when every coefficient is given); every algorithm holds out the same warm-up questions, so
    all train on the same ones. How the processes share each iteration's debates is checked with the
    update's sizes (:func:`udpo.training.autosize.check_sizes`)."""
    task = get_task(debate.task, **mapping(debate.task_options))
    train_all = task.load(
        debate.train_split, debate.data_path, limit=debate.max_train_questions, seed=run.seed
    )
    eval_set = (
        task.load(
            debate.eval_split,
            debate.data_path,
            limit=run.eval_questions,
            seed=run.seed if run.eval_question_seed is None else run.eval_question_seed,
        )
        if run.eval_questions
        else []
    )
    eval_set = repeat_debates(eval_set, run.eval_debates_per_question)
    warmup_set, train_set = split_warmup(train_all, run.warmup_fraction if calibrates else 0.0, run.seed)
    total = optim.max_iterations or math.ceil(
        optim.num_train_epochs * len(train_set) / optim.questions_per_iteration
    )
    return TrainingData(
        task=task,
        train_set=train_set,
        warmup_set=warmup_set,
        eval_set=eval_set,
        schedule=QuestionSchedule(train_set, optim.questions_per_iteration, run.seed),
        total_iterations=total,
    )


def repeat_debates(questions: list[Question], k: int) -> list[Question]:
    """Each question ``k`` times in a row, to be debated ``k`` times: the first keeps its id, the others get
    ``#d<j>`` (j = 1..k-1), so every debate has its own id and the same problem text."""
    return [q if j == 0 else replace(q, id=f"{q.id}#d{j}") for q in questions for j in range(k)]


def agent_profiles(debate: DebateArgs) -> list[str | None]:
    """Each agent's system prompt (None: the task's default): ``profiles`` repeated over the N agents."""
    profiles: list[str | None] = [*debate.profiles] if debate.profiles else [None]
    return [profiles[i % len(profiles)] for i in range(debate.n_agents)]


def debate_config(debate: DebateArgs, agents: list[AgentSpec]) -> DebateConfig:
    """The run's debate settings for ``agents``."""
    from udpo.env.backends.base import SamplingParams

    sampling = SamplingParams(
        temperature=debate.temperature, top_p=debate.top_p, max_tokens=debate.max_tokens
    )
    return DebateConfig(
        n_agents=debate.n_agents,
        rounds=debate.rounds,
        sampling=sampling,
        agents=agents,
        debate_batch_size=debate.debate_batch_size,
    )


def check_context(
    model: ModelArgs, debate: DebateArgs, task: Task, questions: Sequence[Question]
) -> list[int] | None:
    """Refuse, before any model loads, a debate whose last round could outgrow the engine's context
    (the prompt carries every earlier answer of the agent and its peers at up to max_tokens each). Returns
    each round's longest request, completion included, over the longest questions and the team's tokenizers
    (:func:`udpo.env.debate.worst_case_round_tokens`): the rows the update's memory plan sizes for; None for a
    remote backend (no local tokenizer) or no questions."""
    from transformers import AutoConfig, AutoTokenizer

    from udpo.env.backends.chat import chat_prompt_ids
    from udpo.env.debate import worst_case_round_tokens
    from udpo.env.models import resolve_model

    if model.backend_capabilities.remote or not questions:
        return None  # a server's context is its own business
    longest = sorted(questions, key=lambda q: len(task.prompt(q)), reverse=True)[:5]
    settings = debate_config(debate, [AgentSpec(profile=p) for p in agent_profiles(debate)])
    widths = [0] * (debate.rounds + 1)
    for base in dict.fromkeys(model.agent_models or [model.model]):
        path = resolve_model(base)
        tokenizer = AutoTokenizer.from_pretrained(path)
        limit: int | None
        fixed = model.backend_capabilities.fixed_context  # vLLM: the context it starts with
        if fixed:
            limit, name = model.vllm_max_model_len, "vllm_max_model_len"
        else:
            limit = getattr(AutoConfig.from_pretrained(path), "max_position_embeddings", None)
            name = f"{base}'s max_position_embeddings"
        encode = partial(
            chat_prompt_ids, tokenizer, template_kwargs=mapping(debate.chat_template_kwargs) or None
        )
        for q in longest:
            rounds = worst_case_round_tokens(
                task, q, settings, encode, reads_pool=debate.protocol == "interventions"
            )
            widths = [max(a, b) for a, b in zip(widths, rounds, strict=True)]
            need = rounds[-1]
            if limit and need > limit:
                raise ConfigError(
                    f"a debate of question {q.id} can reach {need} tokens (n_agents={debate.n_agents}, "
                    f"rounds={debate.rounds}, max_tokens={debate.max_tokens}: the last round carries every "
                    f"earlier answer), more than {name}={limit}; lower max_tokens or rounds"
                    + (", or raise vllm_max_model_len" if fixed else "")
                )
    return widths
