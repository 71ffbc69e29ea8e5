"""UDPO: train teams of LLM agents to debate well with Uncertainty-Driven Policy Optimization.

The public API (imported on first use, so ``import udpo`` stays light)::

    from udpo import UDPOConfig, UDPOTrainer            # train a team (also MAPPOConfig, RMAACConfig)
    from udpo import DatasetTask, Task, register_task   # your own questions, prompt and parser
    from udpo import UDPOCallback                       # hooks into the training loop (transformers' too)
    from udpo import Team                               # load a trained team, debate, evaluate, save

See docs/library.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: public name -> the module that defines it
_EXPORTS = {
    "UDPOConfig": "udpo.api",
    "MAPPOConfig": "udpo.api",
    "RMAACConfig": "udpo.api",
    "UDPOTrainer": "udpo.api",
    "UDPOCallback": "udpo.training.callbacks",
    "DatasetTask": "udpo.env.tasks.custom",
    "Task": "udpo.env.tasks",
    "Question": "udpo.env.tasks",
    "register_task": "udpo.env.tasks",
    "Trajectory": "udpo.env.trajectory",
    "Team": "udpo.pretrained",
}
__all__ = [
    "DatasetTask",
    "MAPPOConfig",
    "Question",
    "RMAACConfig",
    "Task",
    "Team",
    "Trajectory",
    "UDPOCallback",
    "UDPOConfig",
    "UDPOTrainer",
    "__version__",
    "register_task",
]

if TYPE_CHECKING:
    from udpo.api import MAPPOConfig, RMAACConfig, UDPOConfig, UDPOTrainer
    from udpo.env.tasks import Question, Task, register_task
    from udpo.env.tasks.custom import DatasetTask
    from udpo.env.trajectory import Trajectory
    from udpo.pretrained import Team
    from udpo.training.callbacks import UDPOCallback


#: names the API had before a rename, each with what to use now
_RENAMED = {
    "TrainerCallback": "udpo.UDPOCallback (transformers.TrainerCallback objects are taken as they are)",
}


def __getattr__(name: str) -> Any:
    if name in _RENAMED:
        raise AttributeError(f"udpo.{name} was renamed: use {_RENAMED[name]}")
    if name not in _EXPORTS:
        raise AttributeError(f"module 'udpo' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
