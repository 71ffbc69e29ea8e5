"""What runs a study's runs: one interface for the executors, so that the plan, its records and its tables
never depend on which one trained them.

- :class:`udpo.study.workers.LocalWorkers`: K processes on this machine (``udpo study PLAN --workers K``);
- :class:`udpo.study.ray_executor.RayCluster`: one Ray task per run on a Ray cluster (``--ray``).

(One process training the runs itself, the default, is :func:`udpo.study.runner.run_compare`.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from udpo.study.plan import CompareConfig


class Executor(Protocol):
    def run(self, config: CompareConfig, seeds: Sequence[int] | None = None) -> int:
        """Train every run of ``config`` (only ``seeds`` when given) that has no record yet, record each in
        ``results_dir`` as it finishes, and write the tables once the last is recorded (when the plan's
        ``tables_when_done``); returns the exit status (0: every run it trained was recorded)."""
        ...
