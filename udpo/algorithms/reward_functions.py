"""Your own reward terms beside UDPO's uncertainty rewards, in either of two forms, told apart by the
signature.

The per-trajectory form takes one debate and one agent index and returns a number::

    def confident(trajectory: Trajectory, agent: int) -> float:
        return float("I am sure" in trajectory.turns[agent][-1].text)

TRL's form (a ``GRPOTrainer`` reward function, used unchanged) takes keywords and returns one value per
completion; it is called once per batch of debates and per agent, with that agent's last prompts and
replies, every field of the records and ``agent``, ``round``, ``trajectories``
(:mod:`udpo.algorithms.trl_rewards`)::

    def format_reward(completions, **kwargs) -> list[float]:
        return [float(c[0]["content"].startswith("<think>")) for c in completions]

A function whose signature takes ``**kwargs`` or names ``prompts``, ``completions`` or ``completion_ids`` has
TRL's form; any other, the per-trajectory form.

A recipe names such callables as ``package.module:function`` with one weight each::

    reward_functions: [my_rewards:confident, udpo.algorithms.reward_functions:boxed_answer]
    reward_weights: [0.5, 1.0]

and agent i's reward becomes ``r_i = alpha_i r_intra + beta_i r_inter + gamma_i r_sys + lambda_i r_task
+ sum_k w_k f_k(tau, i)``. Every term is logged as ``reward/<module:function>``. The functions must be
pure (read the trajectory, change nothing) and return finite numbers (TRL's form may return None where it
does not apply: 0); anything else stops training with an error naming the function, the question and the
agent. ``udpo.rewards`` stays free of them: they are applied here, where trajectories become an
algorithm's batch.

Examples that ship: :func:`boxed_answer`, :func:`parsed_answer` and :func:`concise`;
``udpo.rewards.diverse_agent_entropy:dae_certainty_reward`` scores the debate's DiverseAgentEntropy.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from udpo.algorithms.trl_rewards import REWARD_FORMATS, batch_inputs, call_batched, is_async, takes_batches
from udpo.env.imports import load_callable
from udpo.env.trajectory import Trajectory

#: a reward function: ``(trajectory, agent) -> float``, or TRL's ``(prompts, completions, **kwargs) -> list``
RewardFn = Callable[..., Any]


@dataclass(frozen=True)
class RewardFunction:
    """A user reward term: ``name`` as the recipe wrote it (``module:function``), the callable, its weight;
    ``batched``: the callable has TRL's form (:func:`~udpo.algorithms.trl_rewards.takes_batches`), called
    with prompts and completions in ``reward_format``."""

    name: str
    fn: RewardFn
    weight: float = 1.0
    batched: bool = False
    reward_format: str = "conversational"

    def scores(self, trajectories: Sequence[Trajectory], n_agents: int) -> np.ndarray:
        """[M, N] values of the function for every debate and agent, checked to be finite numbers."""
        out = np.zeros((len(trajectories), n_agents))
        for i in range(n_agents):
            if self.batched:
                inputs = batch_inputs(trajectories, i, self.reward_format)
                values = call_batched(self.name, self.fn, inputs)
            else:
                values = [self.fn(t, i) for t in trajectories]
            for m, (t, value) in enumerate(zip(trajectories, values, strict=True)):
                out[m, i] = self._checked(value, t, i)
        return out

    def _checked(self, value: Any, trajectory: Trajectory, agent: int) -> float:
        if value is None and self.batched:  # TRL's "does not apply": no reward from this function
            return 0.0
        where = f"question {trajectory.question_id}, agent {agent}"
        if isinstance(value, bool) or not isinstance(value, int | float | np.number):
            raise ValueError(
                f"reward function {self.name} returned {type(value).__name__} {value!r:.80} for {where}; "
                f"it must return a number"
            )
        if not math.isfinite(value):
            raise ValueError(f"reward function {self.name} returned {value} for {where}")
        return float(value)


def load_reward_functions(
    specs: Sequence[str | RewardFn], weights: Sequence[float] = (), reward_format: str = "conversational"
) -> list[RewardFunction]:
    """Reward terms from ``module:function`` specs or callables (named ``module:qualname``); weights
    default to 1 each. A spec names a function or a class whose instances are called (built without
    arguments), from outside the standard library (:func:`udpo.env.imports.load_callable`). Each has the
    per-trajectory form or TRL's (module docstring); ``reward_format`` is how TRL's form sees prompts and
    completions. Errors name the spec."""
    if weights and len(weights) != len(specs):
        raise ValueError(f"{len(weights)} reward_weights for {len(specs)} reward_functions")
    if reward_format not in REWARD_FORMATS:
        raise ValueError(f"reward_format must be one of {', '.join(REWARD_FORMATS)}, got {reward_format!r}")
    out = []
    for k, spec in enumerate(specs):
        if callable(spec):
            fn, spec = spec, function_name(spec)
        elif not isinstance(spec, str):
            raise ValueError(
                f"reward_functions: {spec!r:.80} is neither a module:function name nor a callable"
            )
        else:
            fn = load_callable("reward_functions", spec)
        if is_async(fn):
            raise ValueError(
                f"reward_functions: {spec} is async; give a plain function (one that calls asyncio.run on it)"
            )
        weight = float(weights[k]) if weights else 1.0
        out.append(RewardFunction(spec, fn, weight, takes_batches(fn), reward_format))
    names = [f.name for f in out]
    if len(set(names)) < len(names):
        raise ValueError(
            f"reward_functions: two terms share a name ({', '.join(names)}); each logs as reward/<name>"
        )
    return out


def function_name(fn: Callable) -> str:
    """``module:qualname`` of a callable (its class's for a callable object), as metrics and config.json
    name it."""
    target = fn if hasattr(fn, "__qualname__") else type(fn)
    return f"{getattr(target, '__module__', '?')}:{target.__qualname__}"


# examples ---------------------------------------------------------------------------------------------
def boxed_answer(trajectory: Trajectory, agent: int) -> float:
    """Share of the agent's responses that put an answer in ``\\boxed{...}`` (a format bonus)."""
    turns = trajectory.turns[agent] if trajectory.turns else []
    return sum("\\boxed{" in t.text for t in turns) / len(turns) if turns else 0.0


def parsed_answer(trajectory: Trajectory, agent: int) -> float:
    """Share of debate rounds in which the agent's answer could be parsed (not ``None``)."""
    answers = trajectory.answers[agent]
    return sum(a is not None for a in answers) / len(answers)


def concise(trajectory: Trajectory, agent: int) -> float:
    """Minus the agent's mean response length in hundreds of tokens (a length penalty: shorter is better)."""
    turns = trajectory.turns[agent] if trajectory.turns else []
    return -sum(len(t.completion_ids) for t in turns) / (100 * len(turns)) if turns else 0.0
