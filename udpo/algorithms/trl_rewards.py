"""Reward functions of TRL's form, ``f(prompts, completions, **kwargs) -> list[float]``, on debates.

TRL's ``GRPOTrainer`` calls each reward function once per batch, with keywords: ``prompts``, ``completions``,
``completion_ids`` and every dataset column but ``prompt`` / ``completion`` / ``completion_ids``, one value
per completion (trl/trainer/grpo_trainer.py, ``_calculate_rewards``). UDPO calls it once per batch of
debates and per agent ``i``, with keywords:

- ``prompts``: what agent ``i`` was asked in its last turn: the chat messages it read (conversational, the
  default: agents exchange chat messages) or the text of the last user message (``reward_format:
  standard``);
- ``completions``: its last replies, ``[{"role": "assistant", "content": text}]`` each (conversational) or
  the text (standard), as TRL passes them for each format;
- ``completion_ids``: those replies' token ids;
- every field of each debate's record (``Trajectory.meta["columns"]``: a DatasetTask's records), one value
  per debate (None where a record lacks the field), but ``prompt``, ``completion`` and ``completion_ids``,
  as TRL leaves them out;
- ``agent`` (``i``), ``round`` (per debate, the round of the reply scored) and ``trajectories`` (the debates).

It returns one value per debate: a number, or None where it does not apply (counted 0, as TRL's sum of the
functions' rewards skips it). TRL's ``trainer_state``, ``log_extra`` and ``log_metric`` are not passed.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from udpo.env.trajectory import Trajectory, Turn

#: how TRL-form functions see prompts and completions (TRL's two dataset formats)
REWARD_FORMATS = ("conversational", "standard")
#: the keywords UDPO passes besides the records' fields; a field of one of these names is an error
KEYWORDS = ("prompts", "completions", "completion_ids", "agent", "round", "trajectories")
#: record fields TRL does not pass as keywords (they are what ``prompts`` and ``completions`` hold)
_NOT_PASSED = ("prompt", "completion", "completion_ids")


def takes_batches(fn: Callable) -> bool:
    """Whether ``fn`` has TRL's form: its signature takes ``**kwargs`` (as TRL's trainer requires: it
    passes every dataset column) or names ``prompts``, ``completions`` or ``completion_ids``. Anything
    else is the per-trajectory form ``(trajectory, agent) -> float``."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # no signature to read (some builtins): the per-trajectory form
        return False
    return any(p.kind is p.VAR_KEYWORD or p.name in KEYWORDS[:3] for p in params)


def is_async(fn: Callable) -> bool:
    """Whether calling ``fn`` returns a coroutine (an ``async def`` function or ``__call__``)."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)


def batch_inputs(trajectories: Sequence[Trajectory], agent: int, reward_format: str) -> dict[str, Any]:
    """The keywords of one call for agent ``agent`` over ``trajectories`` (module docstring)."""
    last = [_last_turn(t, agent) for t in trajectories]
    if reward_format == "conversational":
        prompts: list[Any] = [[dict(m) for m in turn.messages] for turn in last]
        completions: list[Any] = [[{"role": "assistant", "content": turn.text}] for turn in last]
    else:
        prompts = [
            next((m["content"] for m in reversed(turn.messages) if m["role"] == "user"), "") for turn in last
        ]
        completions = [turn.text for turn in last]
    records = [t.meta.get("columns", {}) for t in trajectories]
    fields = list(dict.fromkeys(name for record in records for name in record if name not in _NOT_PASSED))
    clash = [name for name in fields if name in KEYWORDS]
    if clash:
        raise ValueError(
            f"the records have a field named {clash[0]!r}, a keyword UDPO passes to reward functions of TRL's "
            f"form ({', '.join(KEYWORDS)}): rename that field"
        )
    return {
        "prompts": prompts,
        "completions": completions,
        "completion_ids": [list(turn.completion_ids) for turn in last],
        **{name: [record.get(name) for record in records] for name in fields},
        "agent": agent,
        "round": [turn.round for turn in last],
        "trajectories": list(trajectories),
    }


def call_batched(name: str, fn: Callable, inputs: dict[str, Any]) -> list[Any]:
    """``fn(**inputs)`` (only the keywords it names when it takes no ``**kwargs``), checked to return
    one value per completion; errors name the function."""
    expected = len(inputs["trajectories"])
    params = inspect.signature(fn).parameters.values()
    if not any(p.kind is p.VAR_KEYWORD for p in params):
        named = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        missing = [
            p.name for p in params if p.name in named and p.default is p.empty and p.name not in inputs
        ]
        if missing:
            fields = [k for k in inputs if k not in KEYWORDS]
            raise ValueError(
                f"reward function {name} needs {', '.join(map(repr, missing))}: neither a keyword UDPO passes "
                f"({', '.join(KEYWORDS)}) nor a field of the records ({', '.join(fields) or 'none'})"
            )
        inputs = {k: v for k, v in inputs.items() if k in named}
    values = fn(**inputs)
    sized = hasattr(values, "__len__") and not isinstance(values, str | bytes | Mapping)  # a list, an array
    if not sized or len(values) != expected:
        got = f"{len(values)} values" if sized else f"{type(values).__name__} {values!r:.60}"
        raise ValueError(
            f"reward function {name} returned {got} for {expected} completions; a reward function of TRL's form "
            f"returns a list with one value per completion"
        )
    return list(values)


def _last_turn(trajectory: Trajectory, agent: int) -> Turn:
    if agent >= len(trajectory.turns) or not trajectory.turns[agent]:
        raise ValueError(
            f"question {trajectory.question_id}: agent {agent} has no turns recorded, which a reward function of "
            f"TRL's form needs"
        )
    return trajectory.turns[agent][-1]
