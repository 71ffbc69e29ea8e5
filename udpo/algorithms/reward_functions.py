"""Your own reward terms beside UDPO's uncertainty rewards, in the spirit of TRL's reward functions.

A reward function takes one debate and one agent index and returns a number::

    def confident(trajectory: Trajectory, agent: int) -> float:
        return float("I am sure" in trajectory.turns[agent][-1].text)

A recipe names such callables as ``package.module:function`` with one weight each::

    reward_functions: [my_rewards:confident, udpo.algorithms.reward_functions:boxed_answer]
    reward_weights: [0.5, 1.0]

and agent i's reward becomes ``r_i = alpha_i r_intra + beta_i r_inter + gamma_i r_sys + lambda_i r_task
+ sum_k w_k f_k(tau, i)``. Every term is logged as ``reward/<module:function>``. The functions must be
pure (read the trajectory, change nothing) and return a finite number; anything else stops training
with an error naming the function, the question and the agent. ``udpo.rewards`` stays free of them:
they are applied here, where trajectories become an algorithm's batch.

Examples that ship: :func:`boxed_answer`, :func:`parsed_answer` and :func:`concise`;
``udpo.rewards.diverse_agent_entropy:dae_certainty_reward`` scores the debate's DiverseAgentEntropy.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from udpo.env.imports import load_callable
from udpo.env.trajectory import Trajectory

#: (trajectory, agent) -> reward
RewardFn = Callable[[Trajectory, int], float]


@dataclass(frozen=True)
class RewardFunction:
    """A user reward term: ``name`` as the recipe wrote it (``module:function``), the callable, its weight."""

    name: str
    fn: RewardFn
    weight: float = 1.0

    def scores(self, trajectories: Sequence[Trajectory], n_agents: int) -> np.ndarray:
        """[M, N] values of the function for every debate and agent, checked to be finite numbers."""
        out = np.zeros((len(trajectories), n_agents))
        for m, t in enumerate(trajectories):
            for i in range(n_agents):
                value = self.fn(t, i)
                if isinstance(value, bool) or not isinstance(value, int | float | np.number):
                    raise ValueError(
                        f"reward function {self.name} returned {type(value).__name__} {value!r:.80} for question "
                        f"{t.question_id}, agent {i}; it must return a number"
                    )
                if not math.isfinite(value):
                    raise ValueError(
                        f"reward function {self.name} returned {value} for question {t.question_id}, agent {i}"
                    )
                out[m, i] = float(value)
        return out


def load_reward_functions(
    specs: Sequence[str | RewardFn], weights: Sequence[float] = ()
) -> list[RewardFunction]:
    """Reward terms from ``module:function`` specs or callables (named ``module:qualname``); weights
    default to 1 each. A spec names a function or a class whose instances are called (built without
    arguments), from outside the standard library (:func:`udpo.env.imports.load_callable`). Errors name
    the spec."""
    if weights and len(weights) != len(specs):
        raise ValueError(f"{len(weights)} reward_weights for {len(specs)} reward_functions")
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
        out.append(RewardFunction(spec, fn, float(weights[k]) if weights else 1.0))
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
