"""The surroundings of a training run: its processes, its precision, its share of the GPU, its folder's
lock, its seeds and its trackers. The loop (:mod:`udpo.training.trainer`) and its parts read them here.

- processes: one ``accelerate`` ``Accelerator`` (a single process, ``torchrun`` / ``accelerate launch``,
  DeepSpeed), its device, this process's rank among ``world``; the process group is left at exit;
- precision: bf16 autocast in the update (``bf16``; accelerate's process-wide state held while the run
  lives, :mod:`udpo.training.accelerate_state`);
- GPU share: this process's share of its card when several runs share it (:mod:`udpo.gpu_share`);
- run lock: one writer per run folder (:mod:`udpo.training.run_lock`);
- seeds: the same on every process while the team is initialized, one per process for sampling;
- tracking: metrics.jsonl and the configured trackers (:class:`udpo.training.tracking.Tracker`), the
  resolved configuration in config.json, and the line naming torch's threads per process.

:meth:`RunEnvironment.close` lets go of the lock and of accelerate's state; so does a failure while the
environment, or a run started in it, is being built (:meth:`RunEnvironment.closed_on_failure`).
"""

from __future__ import annotations

import atexit
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from udpo import gpu_share, threads
from udpo.config.groups import ModelArgs, RunArgs
from udpo.env.backends.machine import pick_dtype
from udpo.env.jsonl import write_json
from udpo.env.run_folder import RunFolder
from udpo.training import accelerate_state, run_lock
from udpo.training import distributed as dist
from udpo.training.tracking import Tracker, accelerate_trackers


def deepspeed_launch() -> bool:
    """True under ``accelerate launch`` with a DeepSpeed config (accelerate sets ACCELERATE_USE_DEEPSPEED)."""
    return os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() in ("1", "true")


def process_group_settings() -> dict[str, Any]:
    """How the Accelerator forms the process group on this machine.

    GPUs: accelerate's defaults (NCCL). CPU: plain launches (torchrun, DDP) need ``cpu=True`` to form a
    gloo group; a DeepSpeed launch needs ``cpu=False`` with gloo named (with ``cpu=True`` accelerate turns
    it into DDP; without a backend each process forms a group of its own) and DeepSpeed's CPU accelerator.
    """
    if torch.cuda.is_available():
        return {}
    if not deepspeed_launch():
        return {"cpu": True}
    from accelerate.utils import InitProcessGroupKwargs

    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    return {"cpu": False, "kwargs_handlers": [InitProcessGroupKwargs(backend="gloo")]}


def bf16_autocast_default(dtype: str) -> bool:
    """bf16 autocast unless asked: on wherever the weights are bf16 (``dtype`` auto on a GPU with bf16 or
    a CPU with bf16 matrix units, or bf16 set), so the fp32 LoRA weights' matmuls run in bf16 too."""
    cuda = torch.cuda.is_available()
    if cuda and not torch.cuda.is_bf16_supported():
        return False
    return pick_dtype(dtype, "cuda" if cuda else "cpu") == torch.bfloat16


class RunEnvironment:
    """Where one training run lives; see the module docstring.

    model: the run's model settings (``dtype``, ``bf16``). run: its run settings (``output_dir``, ``seed``,
    ``report_to``, ``run_name``). Attributes: ``run_dir`` and its ``folder`` (the run folder's files,
    :class:`~udpo.env.run_folder.RunFolder`), ``accelerator``, ``device`` (its name), ``deepspeed``,
    ``rank``, ``world``, ``main``, ``bf16`` (autocast in the update: this run's own precision),
    ``gpu_share`` (this process's share of its GPU, None: the whole card). Creating it holds accelerate's
    state and locks ``run.output_dir`` (the main process); :meth:`close` lets go of both.
    """

    def __init__(self, model: ModelArgs, run: RunArgs):
        from accelerate import Accelerator
        from accelerate.utils import DistributedType

        self.run, self.run_dir = run, Path(run.output_dir)
        self.folder = RunFolder(self.run_dir)
        self.bf16 = model.bf16 if model.bf16 is not None else bf16_autocast_default(model.dtype)
        self._lock = None
        accelerate_state.hold(self)  # released by close(), or on failure
        with self.closed_on_failure():
            self.accelerator = Accelerator(
                **process_group_settings(),
                **accelerate_state.precision_settings(self.bf16, deepspeed_launch()),
                log_with=accelerate_trackers(run.report_to) or None,
                project_dir=str(self.run_dir),
                step_scheduler_with_optimizer=False,  # the schedule counts optimizer steps, whatever the process count
            )
            self.device = str(self.accelerator.device)
            self.deepspeed = self.accelerator.distributed_type == DistributedType.DEEPSPEED
            self.rank, self.world = self.accelerator.process_index, self.accelerator.num_processes
            if self.world > 1:
                atexit.unregister(dist.leave)  # once, however many trainers this process builds
                atexit.register(dist.leave)
            self.main = self.accelerator.is_main_process
            # several runs on one GPU (udpo study --workers K): this process's share of the card, capped now
            device = gpu_share.indexed(str(self.accelerator.device))  # cuda -> cuda:N, as torch's calls need
            self.gpu_share = gpu_share.apply(device)
            if self.main and (line := gpu_share.describe(self.gpu_share, device)):
                print(line, file=sys.stderr)
            self._lock = run_lock.acquire_on_main(self.run_dir, self.main)  # released by close()

    def seed_initialization(self) -> None:
        """The run's seed on every process: the team starts identical everywhere."""
        from accelerate.utils import set_seed

        set_seed(self.run.seed)

    def seed_sampling(self) -> None:
        """A seed per process (the run's plus the rank): each process samples its own debates from here on."""
        from accelerate.utils import set_seed

        set_seed(self.run.seed + self.rank)

    def start_tracking(self, config: dict[str, Any]) -> Tracker:
        """The run's metrics.jsonl and trackers (``report_to``), started with the resolved ``config``, which
        the main process writes to config.json; it also names torch's threads per process."""
        tracker = Tracker(
            self.run_dir, self.accelerator, self.run.report_to, self.run.run_name or self.run_dir.name, config
        )
        if self.main:
            write_json(self.folder.config, config)
            print(f"torch threads per process: {threads.describe()}", file=sys.stderr)
        return tracker

    @contextmanager
    def closed_on_failure(self) -> Iterator[None]:
        """Close the environment when the block fails (a run that cannot start leaves nothing held)."""
        try:
            yield
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Unlock the run folder and let go of accelerate's state. Closing twice is fine."""
        if self._lock is not None:
            self._lock.close()
            self._lock = None
        accelerate_state.release(self)
