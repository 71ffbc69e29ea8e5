"""The folders runs write, each file and folder in them named once: :class:`RunFolder` (a training run)
and :class:`DebateFolder` (debates: ``udpo debate``, ``udpo detect``, ``udpo uncertainty``, an attack row,
each held-out evaluation of a training run). Every reader and writer of these folders goes through them.

A training run's folder (``output_dir``)::

    RUN_DIR/
        config.json                      the resolved configuration (written at every start and resume)
        calibration.json                 coefficients, profile, base weights, warm-up summary, ordering report
        metrics.jsonl                    one line per iteration ("kind": "train"), per evaluation ("eval"),
                                         for the calibration and a critic's warm start      (append-only)
        trajectories/warmup.jsonl        the warm-up debates of the calibration
        trajectories/train.jsonl         every training debate (meta.iteration tells which)  (append-only)
        eval/iter_000000/                a held-out evaluation, a debate folder:
            trajectories.jsonl               its debates
            summary.json                     their summary, with the iteration
        eval/attack/iter_000010/<row>/   the attack evaluation of iteration 10, one debate folder per row
        checkpoints/iter_000010/         checkpoint 10 (what it holds: udpo.training.checkpoint_store)
        checkpoints/.staging-iter_000010/    checkpoint 10 while it is written, renamed into place
        checkpoints/.replaced-iter_000010/   an older checkpoint 10 moved aside while the new one replaces it
        checkpoints/latest               the name of the newest complete checkpoint
        sync/rank0/iter_000010/          the adapters handed to an engine that does not serve the live model
        .lock                            held by the one process writing the folder, pid and host inside
                                         (udpo.training.run_lock)

``udpo calibrate`` writes the calibration and its warm-up debates, without training. Iterations are
named ``iter_`` and six digits or more (:func:`iteration_name`). The two append-only files are cut back
to a checkpoint's record of their lengths on resume (:attr:`RunFolder.APPEND_ONLY`).

Path arithmetic on the standard library (nothing here touches a file), so that every tool (the trainer,
the analysis tools, the study layer, scripts, benchmarks) names the files the same way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

CONFIG = "config.json"
CALIBRATION = "calibration.json"
METRICS = "metrics.jsonl"
#: the folder of a training run's own debates, and its files (relative to the run folder)
TRAJECTORIES_DIR = "trajectories"
WARMUP = f"{TRAJECTORIES_DIR}/warmup.jsonl"
TRAIN = f"{TRAJECTORIES_DIR}/train.jsonl"
EVAL_DIR = "eval"
ATTACK_DIR = "attack"
CHECKPOINTS_DIR = "checkpoints"
LATEST = "latest"
SYNC_DIR = "sync"
LOCK = ".lock"
#: a debate folder's files
DEBATES = "trajectories.jsonl"
SUMMARY = "summary.json"
#: the name of an iteration's folder (an evaluation, a checkpoint, an engine's adapters)
ITERATION = re.compile(r"^iter_(\d{6,})$")


def iteration_name(iteration: int) -> str:
    """``iter_000010``: the folder name of iteration 10."""
    return f"iter_{iteration:06d}"


def iteration_of(name: str) -> int | None:
    """The iteration an ``iter_<k>`` name stands for; None for any other name."""
    match = ITERATION.match(name)
    return int(match.group(1)) if match else None


def iteration_folders(folder: Path) -> list[tuple[int, Path]]:
    """``(k, folder/iter_<k>)`` for every iteration folder under ``folder``, by k ([] when it is missing)."""
    if not folder.is_dir():
        return []
    found = [(k, p) for p in folder.iterdir() if p.is_dir() and (k := iteration_of(p.name)) is not None]
    return sorted(found)


@dataclass(frozen=True)
class DebateFolder:
    """A folder of debates: ``trajectories.jsonl`` (appended batch by batch) and ``summary.json``."""

    root: Path

    @property
    def trajectories(self) -> Path:
        return self.root / DEBATES

    @property
    def summary(self) -> Path:
        return self.root / SUMMARY


@dataclass(frozen=True)
class RunFolder:
    """A training run's folder at ``root`` (see the module docstring for its layout)."""

    root: Path

    #: the append-only files, relative to the folder, in the order a checkpoint records their lengths
    APPEND_ONLY: ClassVar[tuple[str, ...]] = (TRAIN, METRICS)

    @property
    def config(self) -> Path:
        return self.root / CONFIG

    @property
    def calibration(self) -> Path:
        return self.root / CALIBRATION

    @property
    def metrics(self) -> Path:
        return self.root / METRICS

    @property
    def warmup(self) -> Path:
        return self.root / WARMUP

    @property
    def train(self) -> Path:
        return self.root / TRAIN

    @property
    def evaluations(self) -> Path:
        """The folder of the held-out evaluations, ``eval/``."""
        return self.root / EVAL_DIR

    def evaluation(self, iteration: int) -> DebateFolder:
        """The held-out evaluation at ``iteration``."""
        return DebateFolder(self.evaluations / iteration_name(iteration))

    def evaluated(self) -> list[tuple[int, DebateFolder]]:
        """``(k, its evaluation)`` for every evaluation folder the run holds, by k."""
        return [(k, DebateFolder(p)) for k, p in iteration_folders(self.evaluations)]

    @property
    def attack_evaluations(self) -> Path:
        """The folder of the attack evaluations, ``eval/attack/`` (``iter_<k>/<row>/`` under it)."""
        return self.evaluations / ATTACK_DIR

    @property
    def checkpoints(self) -> Path:
        return self.root / CHECKPOINTS_DIR

    def checkpoint(self, iteration: int) -> Path:
        return self.checkpoints / iteration_name(iteration)

    def checkpoint_staging(self, iteration: int) -> Path:
        """The hidden folder checkpoint ``iteration`` is written into before it is renamed into place."""
        return self.checkpoints / f".staging-{iteration_name(iteration)}"

    def checkpoint_replaced(self, iteration: int) -> Path:
        """Where an existing checkpoint ``iteration`` is moved aside while a new one takes its place."""
        return self.checkpoints / f".replaced-{iteration_name(iteration)}"

    @property
    def latest(self) -> Path:
        """The file naming the newest complete checkpoint."""
        return self.checkpoints / LATEST

    def sync(self, rank: int, iteration: int) -> Path:
        """The adapters process ``rank`` hands its engine after iteration ``iteration``."""
        return self.root / SYNC_DIR / f"rank{rank}" / iteration_name(iteration)

    @property
    def lock(self) -> Path:
        return self.root / LOCK
