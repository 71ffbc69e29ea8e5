"""Checkpoints of a training run: everything it needs to resume exactly (adapters, the critic, optimizer,
schedule, generators, replay buffer, calibration) written atomically, and read back after every file
was checked (udpo.training.checkpoint_store: nothing in a checkpoint is unpickled)."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from udpo.env.jsonl import write_json
from udpo.env.run_folder import RunFolder
from udpo.training import checkpoint_store as ckpt
from udpo.training import distributed as dist
from udpo.training import zero_state
from udpo.training.errors import TrainingError
from udpo.training.state import TrainingState
from udpo.training.team import save_team

if TYPE_CHECKING:
    from udpo.algorithms.critic import Critic
    from udpo.config import TrainConfig
    from udpo.training.policy import MultiAgentPolicy
    from udpo.training.replay import ReplayBuffer
    from udpo.training.update import Updater

#: settings a resumed run may change without a note
RESUMABLE_CHANGES = {
    "resume",
    "max_iterations",
    "num_train_epochs",
    "eval_steps",
    "save_steps",
    "progress",
    "report_to",
}


@dataclass
class RunParts:
    """What a checkpoint is written from and read into besides the :class:`TrainingState`: the run (its
    settings, folder and processes) and the parts whose state it holds, named here so that the checkpoint
    format does not hang on the trainer's attributes.

    replay: None until the calibration builds it (:func:`load` returns a checkpoint's replay state in
    :attr:`TrainingState.replay`). team: what team.json records besides the adapters (``task``,
    ``profiles``, ``debate`` of :func:`~udpo.training.team.save_team`)."""

    config: TrainConfig
    folder: RunFolder
    rank: int
    world: int
    policy: MultiAgentPolicy
    updater: Updater
    critic: Critic | None
    replay: ReplayBuffer | None
    total_iterations: int
    team: dict[str, Any]
    deepspeed: bool = False

    @property
    def main(self) -> bool:
        return self.rank == 0


def verify(
    path: Path, config: TrainConfig, *, deepspeed: bool, critic: bool, updater: Updater | None = None
) -> None:
    """Check the checkpoint at ``path`` whole before anything is loaded (CheckpointError names the file):
    before the model loads against the adapters' headers, and again when loading, parameter by parameter
    against the run's optimizer and schedule (under DeepSpeed, whose optimizer holds flat partitions,
    against the headers again). ``critic``: whether the run has one; ``updater``: the run's, once built
    (the first check comes before it)."""
    live = None if deepspeed else updater
    ckpt.verify(
        path,
        replay=config.replay,
        reference=config.reference == "lagged",
        deepspeed=deepspeed,
        optimizer=live and live.optimizer,
        scheduler=live and live.scheduler,
    )
    if critic and not (path / "critic").is_dir():
        raise ckpt.CheckpointError(f"{path} has no critic/ (not written by a {config.algorithm} run)")


def check_run_dir(config: TrainConfig, *, deepspeed: bool, critic: bool) -> None:
    """Before anything loads: the paths the config names, the checkpoint to resume (whole), and a run
    directory that holds a run only with ``resume``. A directory whose run was stopped before its first
    checkpoint holds nothing to resume: a new start replaces what that attempt wrote."""
    run_dir = Path(config.output_dir)
    metrics = RunFolder(run_dir).metrics
    config.check_paths()
    if config.resume is not None:
        verify(ckpt.resolve(run_dir, config.resume), config, deepspeed=deepspeed, critic=critic)
    elif ckpt.list_checkpoints(run_dir):
        raise TrainingError(
            f"output_dir {run_dir} already holds a run (checkpoints); pass --resume latest to "
            f"continue it, or choose a new output_dir"
        )
    elif metrics.exists() and not _interrupted_start(metrics):
        raise TrainingError(
            f"output_dir {run_dir} holds a {metrics.name} that is not a UDPO run's; choose a new output_dir"
        )


def _interrupted_start(metrics: Path) -> bool:
    """Whether a run directory's ``metrics`` are a UDPO run's (every line a record with a "kind")."""
    try:
        whole = metrics.read_bytes().split(b"\n")[:-1]  # not a line cut short
    except OSError:
        return False
    return all(b'"kind"' in line and b'"iteration"' in line for line in whole if line.strip())


def save(state: TrainingState, iteration: int, parts: RunParts) -> Path:
    """Write checkpoint ``iteration`` of a run at ``state`` atomically (all processes call this)."""
    t, cfg = parts, parts.config
    rng_states = dist.gather_objects(ckpt.rng_state())
    final = t.folder.checkpoint(iteration)
    staging = ckpt.staging_dir(t.folder.root, iteration) if t.main else None
    dist.barrier()
    if t.deepspeed:  # every process: ZeRO's partitions are gathered
        optimizer_state, masters = zero_state.gather(t.updater)
    else:
        optimizer_state, masters = t.updater.optimizer.state_dict(), None
    with t.policy.full_adapters():  # every process: ZeRO-3 gathers the adapters to write them
        if t.main:
            assert staging is not None
            save_team(t.policy, staging, iteration=iteration, **t.team)
            if cfg.reference == "lagged":
                t.policy.save_adapters(staging / "reference", reference=True)
    if t.main:
        assert staging is not None
        if t.critic is not None:
            t.critic.save(staging / "critic")
        ckpt.save_state(staging / "optimizer", optimizer_state)
        ckpt.save_state(staging / "scheduler", t.updater.scheduler.state_dict())
        if masters is not None:
            ckpt.save_state(staging / ckpt.MASTER, masters)
        ckpt.save_state(staging / "rng", rng_states)
        if t.replay is not None:
            ckpt.save_state(staging / "replay", t.replay.state_dict())
        write_json(staging / ckpt.CALIBRATION, state.calibration)
        record = {
            **state.to_dict(),
            "iteration": iteration,  # the loop's, or the one before it (a run stopped by a non-finite value)
            "optimizer_steps": t.updater.steps,
            "total_iterations": t.total_iterations,
            "world_size": t.world,
            "files": ckpt.file_marks(t.folder.root, list(RunFolder.APPEND_ONLY)),
            "config": cfg.to_dict(),
        }
        write_json(staging / ckpt.STATE, record)
        ckpt.commit(t.folder.root, staging, iteration)
        ckpt.prune(t.folder.root, cfg.save_total_limit)
    dist.barrier()
    return final


def load(path: Path, parts: RunParts) -> TrainingState:
    """Restore what :func:`save` wrote into the run's parts (policy, critic, optimizer, schedule,
    generators), rewind the append-only files, and return where the run stands, with the calibration
    record (the algorithm and replay buffer are built from it) and the replay buffer's state.

    A file that does not fit this run is a CheckpointError naming it."""
    t = parts
    verify(path, t.config, deepspeed=t.deepspeed, critic=t.critic is not None, updater=t.updater)
    state = ckpt.read_state(path)
    changed = sorted(
        k
        for k, v in state.get("config", {}).items()
        if k not in RESUMABLE_CHANGES and getattr(t.config, k, v) != v
    )
    if changed and t.main:
        print(f"note: resuming {path} with changed settings: {', '.join(changed)}", file=sys.stderr)
    if state["world_size"] != t.world:
        print(
            f"note: checkpoint written by {state['world_size']} processes, resuming with {t.world}; "
            f"sampling differs from an uninterrupted run",
            file=sys.stderr,
        )
    with names_file(path / "adapters"):
        t.policy.load_adapters(path / "adapters")
    if t.config.reference == "lagged":
        with names_file(path / "reference"):
            t.policy.load_adapters(path / "reference", reference=True)
    if t.critic is not None:
        with names_file(path / "critic"):
            t.critic.load(path / "critic")
    with names_file(path / "optimizer.json"):
        optimizer_state = ckpt.load_state(path / "optimizer")
        if t.deepspeed:
            master = path / ckpt.MASTER
            masters = ckpt.load_state(master) if master.with_suffix(".json").is_file() else None
            zero_state.restore(t.updater, optimizer_state, masters)
        else:
            t.updater.optimizer.load_state_dict(optimizer_state)
    with names_file(path / "scheduler.json"):
        t.updater.scheduler.load_state_dict(ckpt.load_state(path / "scheduler"))
    with names_file(path / ckpt.CALIBRATION):
        calibration = ckpt.read_json(path / ckpt.CALIBRATION)
    replay = None
    if t.config.replay:
        with names_file(path / "replay.json"):
            replay = ckpt.load_state(path / "replay")
    with names_file(path / "rng.json"):
        rng_states = ckpt.load_state(path / "rng")
        ckpt.set_rng_state(rng_states[t.rank % len(rng_states)])
    t.updater.steps = state["optimizer_steps"]
    iteration = state["iteration"]
    dist.barrier()
    if t.main:
        ckpt.rewind_files(t.folder.root, state["files"])
        for k, evaluation in t.folder.evaluated():
            if k > iteration:
                shutil.rmtree(evaluation.root)
    dist.barrier()
    loaded = TrainingState.from_dict(state)
    loaded.calibration, loaded.replay = calibration, replay
    return loaded


def record_evaluation(state: TrainingState, iteration: int, folder: RunFolder, main: bool) -> None:
    """Checkpoint ``iteration`` was written before its evaluation; take the evaluation into its state
    (the metrics line, the ``state``'s history) so that resuming there does not evaluate again. Main
    process."""
    if not main:
        return
    path = folder.checkpoint(iteration)
    record = ckpt.read_state(path)
    record.update(
        files=ckpt.file_marks(folder.root, list(RunFolder.APPEND_ONLY)),
        history=state.history,
        last_evaluation=iteration,
    )
    write_json(path / ckpt.STATE, record)


@contextmanager
def names_file(path: Path) -> Iterator[None]:
    """Re-raise what goes wrong while loading a checkpoint file as a CheckpointError naming the file."""
    try:
        yield
    except ckpt.CheckpointError:
        raise
    except Exception as e:  # a damaged or foreign file fails in many ways inside torch, PEFT, safetensors
        raise ckpt.CheckpointError(f"{path}: does not fit this run ({ckpt.brief(e, 300)})") from None
