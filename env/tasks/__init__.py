"""Task registry: ``get_task(name)`` for gsm8k, truthfulqa, commonsenseqa, arithmetic, du-arithmetic, realmistake."""

from __future__ import annotations

import importlib

from .base import Answer, Question, Task

_TASKS = {
    "gsm8k": ("udpo.env.tasks.gsm8k", "GSM8K"),
    "truthfulqa": ("udpo.env.tasks.truthfulqa", "TruthfulQA"),
    "commonsenseqa": ("udpo.env.tasks.commonsenseqa", "CommonsenseQA"),
    "arithmetic": ("udpo.env.tasks.arithmetic", "Arithmetic"),
    "du-arithmetic": ("udpo.env.tasks.du_arithmetic", "DuArithmetic"),
    "realmistake": ("udpo.env.tasks.realmistake", "RealMistake"),
}
TASK_NAMES = tuple(_TASKS)


def get_task(name: str, **kwargs) -> Task:
    """The task ``name`` (one of TASK_NAMES), built with its keyword options."""
    if name not in _TASKS:
        raise ValueError(f"unknown task {name!r}; choose one of {', '.join(TASK_NAMES)}")
    module, cls = _TASKS[name]
    return getattr(importlib.import_module(module), cls)(**kwargs)


__all__ = ["Answer", "Question", "Task", "TASK_NAMES", "get_task"]
