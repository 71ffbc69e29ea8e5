"""The record of a finished training run that a study commits: everything its tables and figures are
built from, compressed, without the run folder (checkpoints, adapters and training debates stay on the
machine that trained).

A record is a folder (``udpo study`` writes ``<results_dir>/runs/<method>_seed<s>/`` as each run finishes)::

    evals.jsonl.gz      every held-out evaluation's debates, one per line (its iteration in ``meta``): question
                        id and text, gold, each agent's response text and parsed answer per round, the vote,
                        correct; a trajectory file without prompts, token ids or log-probs
    metrics.jsonl.gz    the run's metrics.jsonl as it is
    calibration.json    the run's reward coefficients and their ordering report (when the run wrote one)
    machine.json        where the run was recorded: CPU model and cores, the GPU when one was in use, the
                        numeric path (the config's dtype as resolved there), torch's version
                        (:func:`machine_facts`); a plan pinned to older code gets it from
                        ``scripts/study_collect.py`` when its records are collected
    run.json            method, seed, the evaluated iterations, the budget the run spent and its config;
                        written last, so a folder without it is an unfinished record

The gzip files carry no time stamp: writing the record of the same run twice gives the same bytes.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from udpo.config.groups import mapping
from udpo.env import run_folder
from udpo.env.jsonl import iter_jsonl_lines, write_bytes_atomic, write_json
from udpo.env.run_folder import RunFolder
from udpo.env.tasks import get_task
from udpo.env.tasks.base import Task
from udpo.env.trajectory import Trajectory, read_trajectories, validate_record
from udpo.study.regrade import check_grader, regrade

EVALS = "evals.jsonl.gz"
METRICS = f"{run_folder.METRICS}.gz"
#: the run's calibration.json, under its name
CALIBRATION = run_folder.CALIBRATION
RUN = "run.json"
MACHINE = "machine.json"
#: the keys of a debate's ``meta`` a record keeps (``rounds_run``: how far an early-stopped debate went)
KEPT_META = ("rounds_run",)


def record_name(method: str, seed: int) -> str:
    return f"{method}_seed{seed}"


def compact(trajectory: Trajectory, iteration: int) -> dict[str, Any]:
    """One evaluated debate as a record keeps it: answers, vote and each turn's text, no token data."""
    d = trajectory.to_dict()
    d["turns"] = [
        [
            {
                "agent": turn.agent,
                "round": turn.round,
                "messages": [],
                "text": turn.text,
                "answer": turn.answer,
                "form": turn.form,
                "finish_reason": turn.finish_reason,
            }
            for turn in row
        ]
        for row in trajectory.turns
    ]
    d["meta"] = {"iteration": iteration, **{k: trajectory.meta[k] for k in KEPT_META if k in trajectory.meta}}
    return d


def machine_facts(dtype: str, gpu: str | None = None) -> dict[str, Any]:
    """What names the machine a run was recorded on: this CPU's model and cores, ``gpu`` (default: the
    current CUDA device's name when CUDA is available), the numeric path ``dtype`` (a config's value)
    resolves to there, and torch's version."""
    import os

    import torch

    from udpo.env.backends.machine import cpu_model, pick_dtype

    if gpu is None and torch.cuda.is_available():
        gpu = torch.cuda.get_device_name()
    resolved = pick_dtype(dtype, "cuda" if gpu else "cpu")
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "gpu": gpu,
        "dtype": {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[resolved],
        "torch": torch.__version__,
    }


def measure_budget(run_dir: Path) -> dict[str, int]:
    """What a run spent, measured from its files: iterations and optimizer steps (latest checkpoint),
    training debates and generated tokens (metrics.jsonl), warm-up debates (trajectories/warmup.jsonl)."""
    from udpo.training import checkpoint_store as ckpt
    from udpo.training.tracking import read_metrics

    train = read_metrics(run_dir, kind="train")
    state = ckpt.read_state(ckpt.resolve(run_dir, ckpt.LATEST))
    warmup = RunFolder(run_dir).warmup
    return {
        "iterations": state["iteration"],
        "debates": int(sum(r.get("debates", 0) for r in train)),
        "optimizer_steps": state["optimizer_steps"],
        "generated_tokens": int(sum(r.get("tokens", 0) for r in train)),
        "warmup_debates": sum(1 for line in warmup.read_text().splitlines() if line.strip())
        if warmup.exists()
        else 0,
    }


def write_record(run_dir: str | Path, folder: str | Path, method: str, seed: int) -> RunRecord:
    """Write the record of the finished run ``run_dir`` to ``folder`` (replacing an earlier one); returns it."""
    run, folder = RunFolder(Path(run_dir)), Path(folder)
    evaluated = run.evaluated()
    if not evaluated:
        raise ValueError(f"{run.root} has no held-out evaluation to record")
    (folder / RUN).unlink(missing_ok=True)  # unfinished until run.json is written again
    lines = [
        json.dumps(compact(t, it), ensure_ascii=False) + "\n"
        for it, evaluation in evaluated
        for t in read_trajectories(evaluation.trajectories)
    ]
    write_bytes_atomic(folder / EVALS, gzip.compress("".join(lines).encode("utf-8"), mtime=0))
    metrics = run.metrics
    write_bytes_atomic(
        folder / METRICS, gzip.compress(metrics.read_bytes() if metrics.exists() else b"", mtime=0)
    )
    if run.calibration.exists():
        write_bytes_atomic(folder / CALIBRATION, run.calibration.read_bytes())
    config = run.config
    settings = json.loads(config.read_text()) if config.exists() else None
    write_json(folder / MACHINE, machine_facts((settings or {}).get("dtype", "auto")))
    summary = {
        "method": method,
        "seed": seed,
        "evaluations": [it for it, _ in evaluated],
        "budget": measure_budget(run.root),
        "config": settings,
    }
    write_json(folder / RUN, summary)
    return RunRecord.load(folder)


def record_files(folder: str | Path) -> dict[str, bytes]:
    """A finished record's files as bytes, by name: what a Ray worker hands the driver
    (:mod:`udpo.study.ray_executor`), which writes them with :func:`place_record`."""
    folder = Path(folder)
    if not (folder / RUN).is_file():
        raise FileNotFoundError(f"{folder} holds no finished run record ({RUN} is missing)")
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def place_record(files: dict[str, bytes], folder: str | Path) -> RunRecord:
    """Write a record's files (:func:`record_files`) to ``folder``, ``run.json`` last, as
    :func:`write_record` does; returns the record."""
    folder = Path(folder)
    if RUN not in files or any("/" in name or name.startswith(".") for name in files):
        raise ValueError(f"not a run record's files: {sorted(files)}")
    (folder / RUN).unlink(missing_ok=True)
    for name, data in files.items():
        if name != RUN:
            write_bytes_atomic(folder / name, data)
    write_bytes_atomic(folder / RUN, files[RUN])
    return RunRecord.load(folder)


@dataclass
class RunRecord:
    """A committed run record (see the module docstring), read back."""

    folder: Path
    method: str
    seed: int
    evaluations: list[int]
    budget: dict[str, int]
    config: dict[str, Any] | None = None
    grader: str = "recorded"
    _debates: dict[int, list[Trajectory]] | None = field(default=None, repr=False)
    _regraded: dict[int, list[Trajectory]] = field(default_factory=dict, repr=False)

    @classmethod
    def load(cls, folder: str | Path, grader: str = "recorded") -> RunRecord:
        """The record in ``folder``; ``grader`` (:data:`udpo.study.regrade.GRADERS`): how
        :meth:`evaluation` grades its debates, as recorded or again by today's grader and vote."""
        folder = Path(folder)
        if not (folder / RUN).is_file():
            raise FileNotFoundError(f"{folder} holds no finished run record ({RUN} is missing)")
        d = json.loads((folder / RUN).read_text(encoding="utf-8"))
        return cls(
            folder,
            d["method"],
            int(d["seed"]),
            list(d["evaluations"]),
            d["budget"],
            d.get("config"),
            check_grader(grader),
        )

    def task(self) -> Task:
        """The run's task, built from its config as the run built it."""
        if self.config is None:
            raise ValueError(f"{self.folder}: the record keeps no config, so its task cannot be rebuilt")
        return get_task(self.config["task"], **mapping(self.config.get("task_options")))

    @property
    def final_eval(self) -> int:
        """The last evaluated iteration (the trained team's evaluation)."""
        return self.evaluations[-1]

    def evaluation(self, iteration: int) -> list[Trajectory]:
        """The debates of the held-out evaluation at ``iteration``, in the order they were written; with the
        ``current`` grader each re-graded by the run's task (:func:`udpo.study.regrade.regrade`)."""
        if self._debates is None:
            self._debates = {it: [] for it in self.evaluations}
            path = self.folder / EVALS
            with gzip.open(path, "rb") as fh:
                for lineno, d in iter_jsonl_lines(fh, str(path)):
                    try:
                        validate_record(d)
                    except ValueError as e:
                        raise ValueError(f"{path}:{lineno}: {e}") from None
                    self._debates.setdefault(int(d["meta"]["iteration"]), []).append(Trajectory.from_dict(d))
        if iteration not in self._debates:
            raise KeyError(
                f"{self.folder} has no evaluation at iteration {iteration} (it has {self.evaluations})"
            )
        if self.grader == "recorded":
            return self._debates[iteration]
        if iteration not in self._regraded:
            task = self.task()
            self._regraded[iteration] = [regrade(t, task) for t in self._debates[iteration]]
        return self._regraded[iteration]

    def metrics(self, kind: str | None = None) -> list[dict[str, Any]]:
        """The records of the run's metrics.jsonl (optionally only one ``kind``)."""
        with gzip.open(self.folder / METRICS, "rb") as fh:
            records = [d for _, d in iter_jsonl_lines(fh, str(self.folder / METRICS), append_only=True)]
        return [r for r in records if kind is None or r.get("kind") == kind]
