"""Checkpoints of a training run: everything it needs to resume exactly (adapters, the critic, optimizer,
schedule, generators, replay buffer, calibration) written atomically, and read back after every file
was checked (udpo.training.checkpoint_store: nothing in a checkpoint is unpickled)."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from udpo.env.jsonl import write_json
from udpo.training import checkpoint_store as ckpt
from udpo.training import distributed as dist
from udpo.training.errors import TrainingError
from udpo.training.state import TrainingState
from udpo.training.team import DEBATE_SETTINGS, save_team

if TYPE_CHECKING:
    from udpo.training.trainer import Trainer

TRAIN_FILE = "trajectories/train.jsonl"
METRICS_FILE = "metrics.jsonl"
#: rewound to a checkpoint's marks when a run resumes from it
APPEND_ONLY = (TRAIN_FILE, METRICS_FILE)
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


def verify(trainer: Trainer, path: Path) -> None:
    """Check the checkpoint at ``path`` whole before anything is loaded (CheckpointError names the file):
    before the model loads against the adapters' headers, and again when loading, parameter by parameter
    against the run's optimizer and schedule (none under DeepSpeed, which keeps its own)."""
    cfg = trainer.config
    updater = None if trainer.deepspeed else getattr(trainer, "updater", None)  # built after the first check
    ckpt.verify(
        path,
        replay=cfg.replay,
        reference=cfg.reference == "lagged",
        deepspeed=trainer.deepspeed,
        optimizer=updater and updater.optimizer,
        scheduler=updater and updater.scheduler,
    )
    if trainer.critic_needed and not (path / "critic").is_dir():
        raise ckpt.CheckpointError(f"{path} has no critic/ (not written by a {cfg.algorithm} run)")


def check_run_dir(trainer: Trainer) -> None:
    """Before anything loads: the paths the config names, the checkpoint to resume (whole), and a run
    directory that holds a run only with ``resume``. A directory whose run was stopped before its first
    checkpoint holds nothing to resume: a new start replaces what that attempt wrote."""
    cfg, run_dir = trainer.config, trainer.run_dir
    cfg.check_paths()
    if cfg.resume is not None:
        verify(trainer, ckpt.resolve(run_dir, cfg.resume))
    elif ckpt.list_checkpoints(run_dir):
        raise TrainingError(
            f"output_dir {run_dir} already holds a run (checkpoints); pass --resume latest to "
            f"continue it, or choose a new output_dir"
        )
    elif (run_dir / METRICS_FILE).exists() and not _interrupted_start(run_dir):
        raise TrainingError(
            f"output_dir {run_dir} holds a {METRICS_FILE} that is not a UDPO run's; choose a new output_dir"
        )


def _interrupted_start(run_dir: Path) -> bool:
    """Whether the run directory's metrics are a UDPO run's (every line a record with a "kind")."""
    try:
        whole = (run_dir / METRICS_FILE).read_bytes().split(b"\n")[:-1]  # not a line cut short
    except OSError:
        return False
    return all(b'"kind"' in line and b'"iteration"' in line for line in whole if line.strip())


def save(trainer: Trainer, iteration: int) -> Path:
    """Write checkpoint ``iteration`` atomically (all processes call this)."""
    t, cfg = trainer, trainer.config
    rng_states = dist.gather_objects(ckpt.rng_state())
    final = ckpt.checkpoints_dir(t.run_dir) / ckpt.checkpoint_name(iteration)
    staging = ckpt.staging_dir(t.run_dir, iteration) if t.main else None
    dist.barrier()
    if t.deepspeed:
        t.accelerator.save_state(
            str(ckpt.checkpoints_dir(t.run_dir) / f".staging-{final.name}" / "deepspeed")
        )
    with t.policy.full_adapters():  # every process: ZeRO-3 gathers the adapters to write them
        if t.main:
            assert staging is not None
            _write_team(t, staging, iteration)
    if t.main:
        assert staging is not None
        if t.critic is not None:
            t.critic.save(staging / "critic")
        if not t.deepspeed:
            ckpt.save_state(staging / "optimizer", t.updater.optimizer.state_dict())
            ckpt.save_state(staging / "scheduler", t.updater.scheduler.state_dict())
        ckpt.save_state(staging / "rng", rng_states)
        if t.replay is not None:
            ckpt.save_state(staging / "replay", t.replay.state_dict())
        write_json(staging / "calibration.json", t.calibration)
        state = {
            **t.state.to_dict(),
            "iteration": iteration,  # the loop's, or the one before it (a run stopped by a non-finite value)
            "optimizer_steps": t.updater.steps,
            "total_iterations": t.data.total_iterations,
            "world_size": t.world,
            "files": ckpt.file_marks(t.run_dir, list(APPEND_ONLY)),
            "config": cfg.to_dict(),
        }
        write_json(staging / ckpt.STATE, state)
        ckpt.commit(t.run_dir, staging, iteration)
        ckpt.prune(t.run_dir, cfg.save_total_limit)
    dist.barrier()
    return final


def team_settings(t: Trainer) -> dict[str, Any]:
    """What team.json records of a run besides its adapters and iteration: the task's name, each agent's
    profile and the debate settings the team trains with (``task``, ``profiles``, ``debate`` of
    :func:`~udpo.training.team.save_team`)."""
    cfg = t.config
    return {
        "task": cfg.task,
        "profiles": [s.profile for s in t.rollouts.agent_specs()],
        "debate": {key: getattr(cfg, key) for key in DEBATE_SETTINGS},
    }


def _write_team(t: Trainer, staging: Path, iteration: int) -> None:
    """The team (manifest and adapters) and, with a lagged reference, its snapshots (main process)."""
    save_team(t.policy, staging, iteration=iteration, **team_settings(t))
    if t.config.reference == "lagged":
        t.policy.save_adapters(staging / "reference", reference=True)


def load(trainer: Trainer, path: Path) -> TrainingState:
    """Restore everything :func:`save` wrote into the trainer's parts (policy, critic, optimizer, schedule,
    algorithm, replay, generators), rewind the append-only files, and return where the run stands.

    A file that does not fit this run is a CheckpointError naming it."""
    t = trainer
    verify(t, path)
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
    if t.deepspeed:
        t.accelerator.load_state(str(path / "deepspeed"))
    else:
        with names_file(path / "optimizer.json"):
            t.updater.optimizer.load_state_dict(ckpt.load_state(path / "optimizer"))
        with names_file(path / "scheduler.json"):
            t.updater.scheduler.load_state_dict(ckpt.load_state(path / "scheduler"))
    with names_file(path / "calibration.json"):
        t.use_calibration(ckpt.read_json(path / "calibration.json"))  # builds the replay buffer
    if t.replay is not None:
        with names_file(path / "replay.json"):
            t.replay.load_state_dict(ckpt.load_state(path / "replay"))
    with names_file(path / "rng.json"):
        rng_states = ckpt.load_state(path / "rng")
        ckpt.set_rng_state(rng_states[t.rank % len(rng_states)])
    t.updater.steps = state["optimizer_steps"]
    iteration = state["iteration"]
    # checkpoints of earlier versions were written after the evaluation at their iteration
    evaluated = t.run_dir / "eval" / ckpt.checkpoint_name(iteration) / "summary.json"
    legacy = iteration if dist.any_true(t.main and evaluated.is_file()) else None
    dist.barrier()
    if t.main:
        ckpt.rewind_files(t.run_dir, state["files"])
        for folder in (t.run_dir / "eval").glob("iter_*"):
            if int(folder.name.split("_")[1]) > iteration:
                shutil.rmtree(folder)
    dist.barrier()
    t.rollouts.sync_adapters(iteration)
    return TrainingState.from_dict(state, last_evaluation=legacy)


def record_evaluation(trainer: Trainer, iteration: int) -> None:
    """Checkpoint ``iteration`` was written before its evaluation; take the evaluation into its state
    (the metrics line, the history) so that resuming there does not evaluate again. Main process."""
    t = trainer
    if not t.main:
        return
    path = ckpt.checkpoints_dir(t.run_dir) / ckpt.checkpoint_name(iteration)
    state = ckpt.read_state(path)
    state.update(
        files=ckpt.file_marks(t.run_dir, list(APPEND_ONLY)),
        history=t.state.history,
        last_evaluation=iteration,
    )
    write_json(path / ckpt.STATE, state)


@contextmanager
def names_file(path: Path) -> Iterator[None]:
    """Re-raise what goes wrong while loading a checkpoint file as a CheckpointError naming the file."""
    try:
        yield
    except ckpt.CheckpointError:
        raise
    except Exception as e:  # a damaged or foreign file fails in many ways inside torch, PEFT, safetensors
        raise ckpt.CheckpointError(f"{path}: does not fit this run ({ckpt.brief(e, 300)})") from None
