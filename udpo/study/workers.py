"""Several processes sharing a study's runs (``udpo study PLAN --workers K``).

Each worker is ``udpo study PLAN`` itself (its command line comes from the CLI): it trains the runs no
other process is training (a worker locks a run's folder from its look at the run to the run's record,
:mod:`udpo.training.run_lock`), records each as it finishes, and the worker that records the last run
writes the tables. The thread count of each worker is set, not guessed: ``threads``
torch threads (``UDPO_NUM_THREADS``, and ``OMP_NUM_THREADS`` for the libraries beside torch), by default
the cores this process may use divided among the workers. When the workers' threads fit on those cores,
worker k is pinned to cores of its own (as ``taskset`` would), so two workers never share a core; on one
GPU the workers share the device and each keeps its own cores for the host side, and its share of the
card's memory: ``--gpu-memory-share`` (default ``1 / K``) handed to each worker as
``UDPO_GPU_MEMORY_SHARE``, which its trainer caps its allocator at and sizes its update within
(:mod:`udpo.gpu_share`). Each worker's output goes to ``output_dir/logs/worker_<k>.log``.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from udpo import gpu_share
from udpo.study.plan import CompareConfig
from udpo.threads import ENV


@dataclass(frozen=True)
class Worker:
    """One worker process's share of the machine: its torch threads, the cores it is pinned to (empty: not
    pinned) and its share of the GPU's memory (None: the whole card; ignored on a CPU)."""

    index: int
    threads: int
    cores: tuple[int, ...] = ()
    gpu_share: float | None = None

    def environment(self) -> dict[str, str]:
        return {
            **os.environ,
            ENV: str(self.threads),
            "OMP_NUM_THREADS": str(self.threads),
            **gpu_share.environment(self.gpu_share),
        }


def plan_workers(
    workers: int,
    threads: int | None = None,
    cores: Sequence[int] | None = None,
    share: float | None = None,
    environ: Mapping[str, str] | None = None,
) -> list[Worker]:
    """``workers`` workers with ``threads`` threads each (default: the cores divided among them, at least
    1), each pinned to ``threads`` cores of its own when they fit on ``cores`` (default: the cores this
    process may use), each with its share of the GPU's memory (:func:`udpo.gpu_share.worker_share`:
    ``share``, else ``UDPO_GPU_MEMORY_SHARE`` of ``environ``, else ``1 / workers``)."""
    card = gpu_share.worker_share(workers, share, environ)
    cores = sorted(os.sched_getaffinity(0)) if cores is None else list(cores)
    threads = max(1, len(cores) // workers) if threads is None else threads
    if threads < 1:
        raise ValueError(f"--threads must be >= 1, got {threads}")
    pinned = workers * threads <= len(cores)
    return [
        Worker(k, threads, tuple(cores[k * threads : (k + 1) * threads]) if pinned else (), card)
        for k in range(workers)
    ]


def run_workers(command: Sequence[str], workers: Sequence[Worker], log_dir: Path) -> int:
    """Start ``command`` once per worker (its threads set, pinned to its cores), wait for all; returns the
    first nonzero exit status (0 when every worker ends well). Ctrl-C stops the workers too (they resume
    from their checkpoints next time)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    procs = []
    for worker in workers:
        log = (log_dir / f"worker_{worker.index}.log").open("a", encoding="utf-8")
        procs.append(
            subprocess.Popen(
                list(command),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=worker.environment(),
                preexec_fn=(lambda cores=worker.cores: os.sched_setaffinity(0, cores))
                if worker.cores
                else None,
            )
        )
        log.close()  # the child has its own copy
        where = f"cores {','.join(map(str, worker.cores))}" if worker.cores else "not pinned"
        card = "" if worker.gpu_share is None else f", GPU memory share {worker.gpu_share:.3g} (on CUDA)"
        print(
            f"worker {worker.index}: pid {procs[-1].pid}, {worker.threads} thread(s), {where}{card}, "
            f"log {log.name}"
        )
    codes = []
    for proc in procs:
        while True:
            try:
                codes.append(proc.wait())
                break
            except KeyboardInterrupt:  # the workers got the same Ctrl-C; wait for them to stop
                continue
    return next((c for c in codes if c), 0)


@dataclass(frozen=True)
class LocalWorkers:
    """The local executor (:class:`udpo.study.executor.Executor`): ``workers`` processes of ``command``
    (the study's own command line, its seeds in it), logging to ``output_dir/logs/worker_<k>.log``; the
    worker that records the last run writes the tables."""

    command: Sequence[str]
    workers: Sequence[Worker]

    def run(self, config: CompareConfig, seeds: Sequence[int] | None = None) -> int:
        return run_workers(self.command, self.workers, Path(config.output_dir) / "logs")
