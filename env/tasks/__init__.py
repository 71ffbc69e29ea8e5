"""Task registry: ``get_task(name)`` for the built-in tasks (gsm8k, truthfulqa, commonsenseqa, arithmetic,
du-arithmetic, realmistake), the tasks a user registered (:func:`register_task`: a Task subclass,
instance or factory), and ``module:attr`` names of a Task subclass or instance anywhere on the import
path, found by :func:`udpo.env.imports.resolve` (a factory must be registered: a name never calls a
function, so ``task: os:system`` with ``task_options`` runs nothing).

A user's own data needs no subclass: :class:`~udpo.env.tasks.custom.DatasetTask` turns records (dicts, a
``datasets.Dataset`` or a JSONL file per split) into a task. The built-in tasks are examples of
subclassing :class:`Task` when the prompt or the parser must be one's own.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from ..imports import describe, resolve
from .base import Answer, Question, Task

_TASKS = {
    "gsm8k": ("udpo.env.tasks.gsm8k", "GSM8K"),
    "truthfulqa": ("udpo.env.tasks.truthfulqa", "TruthfulQA"),
    "commonsenseqa": ("udpo.env.tasks.commonsenseqa", "CommonsenseQA"),
    "arithmetic": ("udpo.env.tasks.arithmetic", "Arithmetic"),
    "du-arithmetic": ("udpo.env.tasks.du_arithmetic", "DuArithmetic"),
    "realmistake": ("udpo.env.tasks.realmistake", "RealMistake"),
}
#: the built-in tasks
TASK_NAMES = tuple(_TASKS)
#: tasks added at run time: name -> a Task subclass, a Task instance or a factory returning one
_REGISTERED: dict[str, type[Task] | Task | Callable[..., Task]] = {}


def register_task(name: str, task: type[Task] | Task | Callable[..., Task]) -> None:
    """Make ``name`` a task name that configs, recipes and ``get_task`` accept. ``task``: a Task subclass
    (built with the config's ``task_options``), a Task instance (used as is, no options), or a factory.
    A built-in name cannot be replaced; registering a name again replaces the earlier entry."""
    if not isinstance(name, str) or not name or ":" in name:
        raise ValueError(f"a task name must be a non-empty string without ':', got {name!r}")
    if name in _TASKS:
        raise ValueError(f"{name!r} is a built-in task; register yours under another name")
    if not (isinstance(task, Task) or callable(task)):
        raise TypeError(
            f"register_task({name!r}, ...) needs a Task subclass, instance or factory, got {task!r:.80}"
        )
    _REGISTERED[name] = task


def task_names() -> tuple[str, ...]:
    """Every name ``get_task`` accepts without an import path: built-in, then registered."""
    return TASK_NAMES + tuple(_REGISTERED)


def _not_a_task(found: Any) -> str | None:
    """The check of a task named by import path: a Task subclass (built with the options only once it
    passed) or a Task instance (used as it is)."""
    if isinstance(found, Task) or (isinstance(found, type) and issubclass(found, Task)):
        return None
    return (
        f"{describe(found)}, not a subclass of udpo.env.tasks.Task (a factory function must be registered "
        f"with udpo.env.tasks.register_task)"
    )


def _entry(name: str) -> type[Task] | Task | Callable[..., Task]:
    if name in _TASKS:
        return resolve("task", ":".join(_TASKS[name]), _not_a_task)
    if name in _REGISTERED:
        return _REGISTERED[name]
    if ":" in name:
        return resolve("task", name, _not_a_task)
    raise ValueError(
        f"unknown task {name!r}; choose one of {', '.join(task_names())}, register yours with "
        f"udpo.env.tasks.register_task, or name it as package.module:TaskClass"
    )


def task_parameters(name: str) -> list[str]:
    """The keyword options (``task_options``) that task ``name`` takes."""
    entry = _entry(name)
    if isinstance(entry, Task):
        return []
    target = entry.__init__ if isinstance(entry, type) else entry
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [n for n, p in inspect.signature(target).parameters.items() if n != "self" and p.kind in named]


def get_task(name: str, **kwargs) -> Task:
    """The task ``name`` (built-in, registered, or ``module:attr``), built with its keyword options."""
    entry = _entry(name)
    if isinstance(entry, Task):
        if kwargs:
            raise ValueError(
                f"task {name!r} is a ready-made object and takes no options, got {sorted(kwargs)}"
            )
        return entry
    task = entry(**kwargs)
    if not isinstance(task, Task):
        raise TypeError(f"task {name!r} built a {type(task).__name__}, not a udpo Task")
    return task


__all__ = [
    "Answer",
    "Question",
    "Task",
    "TASK_NAMES",
    "get_task",
    "register_task",
    "task_names",
    "task_parameters",
]
