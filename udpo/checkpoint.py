"""Checkpoints that survive being killed at any moment, and exact resumption.

Layout (see trainer_interfaces.md)::

    RUN_DIR/checkpoints/iter_000010/
        team.json, adapters/agent_i/          # the team: loadable by export, eval, vLLM
        trainer_state.json                    # iteration, optimizer steps, append-only file marks
        optimizer.pt, scheduler.pt, rng.pt, replay.pt, calibration.json
    RUN_DIR/checkpoints/latest                # name of the newest complete checkpoint

A checkpoint is written into a hidden staging folder and renamed into place with ``os.replace``; the
``latest`` pointer is replaced last. A reader therefore sees either the previous checkpoint or the
new one, never half of one. The run's append-only files (trajectory JSONL, metrics.jsonl) keep
growing between checkpoints; ``trainer_state.json`` records their length (lines and bytes) at the
checkpoint, and :func:`rewind_files` cuts them back to it on resume so no iteration is logged twice.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

CHECKPOINTS = "checkpoints"
LATEST = "latest"
STATE = "trainer_state.json"
_NAME = re.compile(r"^iter_(\d{6,})$")


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete or does not match the run's files."""


def checkpoint_name(iteration: int) -> str:
    return f"iter_{iteration:06d}"


def checkpoints_dir(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / CHECKPOINTS


def list_checkpoints(run_dir: str | os.PathLike) -> list[Path]:
    """Complete checkpoints of a run (those with a trainer_state.json), oldest first."""
    root = checkpoints_dir(run_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if _NAME.match(p.name) and (p / STATE).is_file()]
    return sorted(found, key=lambda p: int(_NAME.match(p.name).group(1)))  # type: ignore[union-attr]


# --- writing ---------------------------------------------------------------------------------
def staging_dir(run_dir: str | os.PathLike, iteration: int) -> Path:
    """An empty hidden folder to write checkpoint ``iteration`` into (leftovers of a crash are removed)."""
    path = checkpoints_dir(run_dir) / f".staging-{checkpoint_name(iteration)}"
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def commit(run_dir: str | os.PathLike, staging: Path, iteration: int) -> Path:
    """Move a fully written staging folder into place, then point ``latest`` at it."""
    if not (staging / STATE).is_file():
        raise CheckpointError(f"{staging} has no {STATE}; write the trainer state before committing")
    _fsync_tree(staging)
    root = checkpoints_dir(run_dir)
    final = root / checkpoint_name(iteration)
    if final.exists():  # re-reached after resuming from an older checkpoint: the new one replaces it
        old = root / f".replaced-{final.name}"
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
        os.replace(staging, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(staging, final)
    write_text_atomic(root / LATEST, final.name + "\n")
    _fsync_dir(root)
    return final


def prune(run_dir: str | os.PathLike, keep: int | None) -> list[Path]:
    """Delete all but the newest ``keep`` checkpoints (never the one ``latest`` names)."""
    if keep is None:
        return []
    latest = _read_latest(checkpoints_dir(run_dir))
    ckpts = list_checkpoints(run_dir)
    doomed = [p for p in ckpts[: max(len(ckpts) - keep, 0)] if p.name != latest]
    for p in doomed:
        shutil.rmtree(p)
    return doomed


def write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def write_json(path: Path, data: Any) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")


# --- reading ---------------------------------------------------------------------------------
def resolve(run_dir: str | os.PathLike, resume: str) -> Path:
    """The checkpoint folder ``resume`` names: ``latest`` (in run_dir), or a checkpoint path."""
    if resume == LATEST:
        root = checkpoints_dir(run_dir)
        name = _read_latest(root)
        if name is not None and (root / name / STATE).is_file():
            return root / name
        ckpts = list_checkpoints(run_dir)  # pointer lost (killed between rename and pointer write)
        if not ckpts:
            raise CheckpointError(f"--resume latest: no checkpoint under {root}; start without --resume")
        return ckpts[-1]
    path = Path(resume)
    if not (path / STATE).is_file():
        hint = (
            f" (run dir {path}? use --resume latest with output_dir {path})"
            if (path / CHECKPOINTS).is_dir()
            else ""
        )
        raise CheckpointError(f"--resume {resume}: not a checkpoint folder, {STATE} missing{hint}")
    return path


def read_state(ckpt: Path) -> dict[str, Any]:
    return read_json(ckpt / STATE)


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: unreadable ({e})") from None


def _read_latest(root: Path) -> str | None:
    try:
        name = (root / LATEST).read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return name if _NAME.match(name) else None


# --- append-only files -----------------------------------------------------------------------
def file_marks(run_dir: str | os.PathLike, relpaths: list[str]) -> dict[str, dict[str, int]]:
    """Length of each append-only file now: ``{relpath: {"lines": n, "bytes": b}}`` (0 when absent)."""
    marks = {}
    for rel in relpaths:
        path = Path(run_dir) / rel
        if path.exists():
            data = path.read_bytes()
            marks[rel] = {"lines": data.count(b"\n"), "bytes": len(data)}
        else:
            marks[rel] = {"lines": 0, "bytes": 0}
    return marks


def rewind_files(run_dir: str | os.PathLike, marks: dict[str, dict[str, int]]) -> dict[str, int]:
    """Truncate each append-only file back to its recorded length; returns lines dropped per file.

    Raises CheckpointError when a file is shorter than recorded or its kept part does not have the
    recorded number of lines (the file was edited or belongs to another run).
    """
    dropped = {}
    for rel, mark in marks.items():
        path = Path(run_dir) / rel
        size = path.stat().st_size if path.exists() else 0
        if size < mark["bytes"]:
            raise CheckpointError(
                f"{path} has {size} bytes but the checkpoint recorded {mark['bytes']}: the file lost data "
                f"after the checkpoint was written; restore it or start a new run"
            )
        if mark["bytes"] == 0:
            if path.exists():
                dropped[rel] = _count_lines(path.read_bytes())
                path.unlink()
            continue
        with open(path, "rb+") as fh:
            kept = fh.read(mark["bytes"])
            lines = kept.count(b"\n")
            if lines != mark["lines"] or not kept.endswith(b"\n"):
                raise CheckpointError(
                    f"{path}: its first {mark['bytes']} bytes hold {lines} lines, the checkpoint "
                    f"recorded {mark['lines']}; the file does not belong to this checkpoint"
                )
            dropped[rel] = _count_lines(fh.read())
            fh.truncate(mark["bytes"])
            fh.flush()
            os.fsync(fh.fileno())
    return dropped


def _count_lines(data: bytes) -> int:
    """Lines in ``data``, a half-written last line included."""
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)


# --- random number generators ----------------------------------------------------------------
def rng_state() -> dict[str, Any]:
    """Python, NumPy and torch (CPU and CUDA) generator states of this process."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# --- fsync helpers ---------------------------------------------------------------------------
def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _fsync_tree(path: Path) -> None:
    for p in sorted(path.rglob("*"), reverse=True):
        if p.is_file():
            with open(p, "rb") as fh:
                os.fsync(fh.fileno())
        else:
            _fsync_dir(p)
    _fsync_dir(path)
