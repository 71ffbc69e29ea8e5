"""How many threads torch's CPU kernels use, chosen from the cores this process may really have.

torch starts one intra-op thread per core. When those cores are also busy with other work (another
training run, the ranks of the same ``torchrun``, a vLLM engine), its OpenMP threads wait on each other
at every parallel region and an operation can take ten times as long (docs/training.md, "Threads").
:func:`configure_threads` sets ``torch.set_num_threads`` to

    threads = max(1, (cores - busy) // processes)

- ``cores``: the CPUs this process may run on (``os.sched_getaffinity``, so ``taskset`` and container
  limits count);
- ``busy``: CPUs kept busy by other work when the process starts, rounded: the smaller of the
  one-minute load average and the CPUs busy during a quarter-second sample of ``/proc/stat`` while
  this process sleeps. Both must see the work: the load average trails the machine by about a minute
  (it still counts an install that just ended), a short sample can miss a process that pauses;
- ``processes``: this run's processes on the machine (``LOCAL_WORLD_SIZE`` under torchrun and accelerate,
  else 1).

An explicit choice wins and is left alone: ``UDPO_NUM_THREADS=k`` (applied as is), or ``OMP_NUM_THREADS``
/ ``MKL_NUM_THREADS`` already set in the environment (torch read them at import).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass

ENV = "UDPO_NUM_THREADS"
EXPLICIT = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


@dataclass(frozen=True)
class ThreadChoice:
    """The intra-op thread count set (or kept) and why."""

    threads: int
    reason: str


def available_cores() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def choose_threads(cores: int, busy: float, processes: int) -> int:
    """``max(1, (cores - round(busy)) // processes)``; busy is clamped to [0, cores]."""
    if cores < 1 or processes < 1:
        raise ValueError(f"cores and processes must be >= 1, got {cores} and {processes}")
    busy_cores = min(cores, max(0, round(busy)))
    return max(1, (cores - busy_cores) // processes)


def configure_threads(environ: Mapping[str, str] | None = None) -> ThreadChoice:
    """Set torch's intra-op threads for this process (see the module docstring); returns the choice."""
    import torch

    env = os.environ if environ is None else environ
    if ENV in env:
        try:
            threads = int(env[ENV])
        except ValueError:
            raise ValueError(f"{ENV} must be a whole number of threads, got {env[ENV]!r}") from None
        if threads < 1:
            raise ValueError(f"{ENV} must be >= 1, got {threads}")
        torch.set_num_threads(threads)
        return ThreadChoice(threads, f"{ENV}={threads}")
    for name in EXPLICIT:
        if name in env:
            return ThreadChoice(torch.get_num_threads(), f"{name}={env[name]} (set by the user)")
    cores = available_cores()
    processes = int(env.get("LOCAL_WORLD_SIZE", "1") or 1)
    busy = min(_load_average(), _busy_now())
    threads = choose_threads(cores, busy, processes)
    torch.set_num_threads(threads)
    return ThreadChoice(
        threads,
        f"{cores} cores, about {min(cores, max(0, round(busy)))} busy with other work, {processes} process(es) of this "
        f"run; set {ENV} to choose",
    )


def _load_average() -> float:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return 0.0


def _busy_now(window: float = 0.25) -> float:
    """CPUs busy over ``window`` seconds (from /proc/stat; the load average where it is missing)."""

    def sample() -> tuple[int, int]:
        with open("/proc/stat", encoding="ascii") as fh:
            values = [int(v) for v in fh.readline().split()[1:]]
        idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
        return sum(values[:8]), idle  # user nice system idle iowait irq softirq steal

    try:
        total0, idle0 = sample()
        time.sleep(window)
        total1, idle1 = sample()
    except (OSError, ValueError, IndexError):
        return _load_average()
    elapsed = total1 - total0
    if elapsed <= 0:
        return _load_average()
    return (elapsed - (idle1 - idle0)) / elapsed * (os.cpu_count() or 1)
