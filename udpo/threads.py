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

The user's own choice wins: ``UDPO_NUM_THREADS=k`` (applied as is), accelerate's
``--num_cpu_threads_per_process k`` (applied as is), or ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` set in the
user's environment (left as torch read them at import).

A launcher's default is not a choice. ``torchrun`` sets ``OMP_NUM_THREADS=1`` in its workers when it was
unset in its own environment (and ``--nproc_per_node`` > 1); ``accelerate launch`` always sets
``OMP_NUM_THREADS`` in the processes it starts, to its flag's value, else to the variable of its own
environment, else to 1 (with ``--cpu`` and more than one physical core per process: that quotient). So a
child cannot tell from its own environment where the variable came from; its launcher's can. Rule
(:func:`user_choice`): this process was started by a launcher when it carries a variable the launcher sets
in its children (``TORCHELASTIC_RUN_ID``: torchrun, and accelerate's multi-process paths through it;
``ACCELERATE_DYNAMO_BACKEND``: ``accelerate launch``) that its parent process's environment lacks. The
parent is then the launcher, started from the user's shell, and its initial environment
(``/proc/<ppid>/environ``, which later changes to ``os.environ`` do not touch) and arguments
(``/proc/<ppid>/cmdline``) are what the user typed: ``OMP_NUM_THREADS`` is the user's when the launcher's
environment has it too, and accelerate's flag is the user's when its arguments carry it (its value is applied:
accelerate's DeepSpeed path does not pass it on). Where the parent cannot be read (no ``/proc``), a launched
process's ``OMP_NUM_THREADS=1`` counts as the launcher's default, any other value as the user's.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

ENV = "UDPO_NUM_THREADS"
OMP = "OMP_NUM_THREADS"
EXPLICIT = (OMP, "MKL_NUM_THREADS")
#: variables a launcher sets in the processes it starts: torchrun's workers (and accelerate's paths through
#: it) carry the first, the children of ``accelerate launch`` the second
LAUNCHER_MARKS = ("TORCHELASTIC_RUN_ID", "ACCELERATE_DYNAMO_BACKEND")
#: accelerate launch's thread flag, in both spellings its parser takes
ACCELERATE_FLAGS = ("--num_cpu_threads_per_process", "--num-cpu-threads-per-process")


@dataclass(frozen=True)
class ThreadChoice:
    """The intra-op thread count set (or kept) and why."""

    threads: int
    reason: str


@dataclass(frozen=True)
class Parent:
    """The process that started this one, as it was started: its environment and arguments (None where
    they cannot be read)."""

    environ: Mapping[str, str] | None
    argv: Sequence[str] | None


_chosen: ThreadChoice | None = None  # the last choice configure_threads made in this process


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


def parent_process() -> Parent:
    """This process's parent as the kernel started it (``/proc/<ppid>``: the environment it was given,
    whatever it set in ``os.environ`` later, and its arguments)."""

    def fields(name: str) -> list[str] | None:
        try:
            raw = Path(f"/proc/{os.getppid()}/{name}").read_bytes()
        except OSError:
            return None
        return [f.decode(errors="replace") for f in raw.split(b"\0") if f]

    environ = fields("environ")
    return Parent(
        None if environ is None else dict(e.partition("=")[::2] for e in environ), fields("cmdline")
    )


def launched(env: Mapping[str, str], parent: Parent) -> bool:
    """Started by a launcher: ``env`` carries a variable the launcher sets in its children that the
    parent's own environment lacks (the parent is then the launcher); where the parent's environment
    cannot be read, the variable alone."""
    return any(m in env and (parent.environ is None or m not in parent.environ) for m in LAUNCHER_MARKS)


def launcher_default(env: Mapping[str, str], parent: Parent) -> bool:
    """``OMP_NUM_THREADS`` here was set by this process's launcher, not by the user: the launcher's own
    environment lacks it (unreadable: the value is 1, both launchers' default)."""
    if OMP not in env or not launched(env, parent):
        return False
    return OMP not in parent.environ if parent.environ is not None else env[OMP].strip() == "1"


def accelerate_flag(argv: Sequence[str]) -> str | None:
    """The value of ``--num_cpu_threads_per_process`` in accelerate launch's arguments ``argv``, if given."""
    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if name in ACCELERATE_FLAGS:
            return value if eq else (argv[i + 1] if i + 1 < len(argv) else None)
    return None


def user_choice(env: Mapping[str, str], parent: Parent) -> tuple[int | None, str] | None:
    """The thread count the user chose (None: the one torch read at import) and where; None where the user
    chose none (see the module docstring)."""
    if ENV in env:
        return _count(env[ENV], ENV), f"{ENV}={env[ENV]}"
    flag = accelerate_flag(parent.argv or ()) if launched(env, parent) else None
    if flag is not None:
        return _count(flag, ACCELERATE_FLAGS[0]), f"{ACCELERATE_FLAGS[0]} {flag} of accelerate launch"
    for name in EXPLICIT:
        if name in env and not (name == OMP and launcher_default(env, parent)):
            return None, f"{name}={env[name]} (set by the user)"
    return None


def _count(value: str, source: str) -> int:
    try:
        threads = int(value)
    except ValueError:
        raise ValueError(f"{source} must be a whole number of threads, got {value!r}") from None
    if threads < 1:
        raise ValueError(f"{source} must be >= 1, got {threads}")
    return threads


def configure_threads(environ: Mapping[str, str] | None = None, parent: Parent | None = None) -> ThreadChoice:
    """Set torch's intra-op threads for this process (see the module docstring); returns the choice.
    ``environ`` and ``parent`` default to this process's environment and its parent process."""
    global _chosen
    import torch

    env = os.environ if environ is None else environ
    parent = parent_process() if parent is None else parent
    chosen = user_choice(env, parent)
    if chosen is not None:
        threads, reason = chosen
        if threads is None:
            threads = torch.get_num_threads()
        else:
            torch.set_num_threads(threads)
        _chosen = ThreadChoice(threads, reason)
        return _chosen
    cores = available_cores()
    processes = int(env.get("LOCAL_WORLD_SIZE", "1") or 1)
    busy = min(_load_average(), _busy_now())
    threads = choose_threads(cores, busy, processes)
    torch.set_num_threads(threads)
    default = f" ({OMP}={env[OMP]} was the launcher's default)" if OMP in env else ""
    _chosen = ThreadChoice(
        threads,
        f"{cores} cores, about {min(cores, max(0, round(busy)))} busy with other work, {processes} process(es) of this "
        f"run{default}; set {ENV} to choose",
    )
    return _chosen


def describe() -> str:
    """torch's intra-op threads now and how they were chosen, for a run's header."""
    import torch

    threads = torch.get_num_threads()
    if _chosen is not None and _chosen.threads == threads:
        return f"{threads} ({_chosen.reason})"
    return f"{threads} (torch's own count; {ENV}=k chooses)"


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
