"""Metrics of a run: RUN_DIR/metrics.jsonl, wandb / tensorboard through accelerate, timers, progress bars.

Every iteration logs one JSON line ``{"iteration": k, "kind": "train", ...}``; evaluations log lines
with ``"kind": "eval"``. Keys are flat, ``/``-separated (``reward/r_task``, ``time/rollout``,
``agent_0/kl``), so the same dict goes to every tracker. The file is append-only: a resumed run cuts
it back to the checkpoint (udpo.training.checkpoint_store.rewind_files) before appending again.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from udpo.env.run_folder import RunFolder

#: report_to value -> (accelerate tracker name, the packages any one of which it needs)
_ACCELERATE_TRACKERS = {
    "wandb": ("wandb", ("wandb",)),
    "tensorboard": ("tensorboard", ("tensorboard", "tensorboardX")),
}


def accelerate_trackers(report_to: list[str]) -> list[str]:
    """The accelerate ``log_with`` names for a config's ``report_to`` (jsonl and none need none).

    Raises ValueError when a tracker's package is missing (accelerate would drop it with a warning).
    """
    out = []
    for name in report_to:
        if name not in _ACCELERATE_TRACKERS:
            continue
        tracker, packages = _ACCELERATE_TRACKERS[name]
        if not any(importlib.util.find_spec(p) is not None for p in packages):
            raise ValueError(f"report_to: {name} needs the {packages[0]} package: pip install 'udpo[{name}]'")
        out.append(tracker)
    return out


def flatten(metrics: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts to one level with ``/``-joined keys."""
    flat: dict[str, Any] = {}
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{name}/"))
        else:
            flat[name] = value
    return flat


def scalars(record: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers (booleans as 0 / 1) of a flat metrics record, without its ``iteration``, ``kind``
    and ``time``: what trackers and transformers callbacks get."""
    return {
        k: s
        for k, v in record.items()
        if k not in ("iteration", "kind", "time")
        if (s := _scalar(v)) is not None
    }


def _scalar(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float) and math.isfinite(value):
        return float(value)
    return None


class Tracker:
    """Writes metrics.jsonl (main process only) and forwards scalars to accelerate's trackers.

    accelerator: the run's Accelerator, created with ``log_with=accelerate_trackers(report_to)``.
    """

    def __init__(
        self, run_dir: str | os.PathLike, accelerator, report_to: list[str], run_name: str, config: dict
    ):
        self.path = RunFolder(Path(run_dir)).metrics
        self.accelerator = accelerator
        self.main = accelerator.is_main_process
        self.trackers = accelerate_trackers(report_to)
        if self.trackers:
            scalars = {
                k: v if _scalar(v) is not None or isinstance(v, str) else str(v) for k, v in config.items()
            }
            accelerator.init_trackers(project_name=run_name, config=scalars)

    def log(self, metrics: Mapping[str, Any], iteration: int, kind: str = "train") -> dict[str, Any]:
        """Append one line and send the finite scalars to the trackers; returns the flat record."""
        record = {"iteration": iteration, "kind": kind, "time": round(time.time(), 3), **flatten(metrics)}
        if self.main:
            line = json.dumps(record, ensure_ascii=False, default=str) + "\n"
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.write(line)
                fh.flush()
                os.fsync(fh.fileno())
        if self.trackers:
            prefix = "" if kind == "train" else f"{kind}/"
            self.accelerator.log({f"{prefix}{k}": s for k, s in scalars(record).items()}, step=iteration)
        return record

    def close(self) -> None:
        """Finish the trackers (the process group is left to whoever ends the run)."""
        for tracker in self.accelerator.trackers if self.trackers else ():
            tracker.finish()


def format_result(result: dict[str, Any]) -> str:
    """Held-out accuracy and U metrics before and after training, as a small table."""
    rows = [f"run: {result['run_dir']} ({result['iterations']} iterations)"]
    keys = ("accuracy", "u_intra", "u_inter", "u_sys")
    rows.append(f"{'':8s}" + "".join(f"{k:>10s}" for k in keys))
    for when in ("before", "after"):
        if when in result:
            rows.append(f"{when:8s}" + "".join(f"{result[when][k]:10.3f}" for k in keys))
    return "\n".join(rows)


def read_metrics(run_dir: str | os.PathLike, kind: str | None = None) -> list[dict[str, Any]]:
    """The records of a run's metrics.jsonl (optionally only one ``kind``)."""
    path = RunFolder(Path(run_dir)).metrics
    if not path.exists():
        return []
    with open(path, encoding="utf-8") as fh:
        records = [json.loads(line) for line in fh if line.strip()]
    return [r for r in records if kind is None or r.get("kind") == kind]


class Timer:
    """Wall-clock seconds per named section of one iteration: ``with timer("rollout"): ...``."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, section: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[section] = self.seconds.get(section, 0.0) + time.perf_counter() - start

    def pop(self) -> dict[str, float]:
        """The sections timed since the last pop, and reset."""
        out, self.seconds = self.seconds, {}
        return out


def progress_bar(total: int, initial: int, enabled: bool, position: int | None = None) -> tqdm:
    """The run's iteration bar (shown on the main process only). position: its tqdm line (e.g. 1 under
    ``udpo compare``'s bar of runs); the rollout's :class:`~udpo.env.progress.DebateProgress` goes on the
    line below it."""
    return tqdm(
        total=total,
        initial=initial,
        desc="train",
        unit="it",
        disable=not enabled,
        dynamic_ncols=True,
        position=position,
    )
