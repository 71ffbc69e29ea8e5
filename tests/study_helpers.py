"""Run folders as the trainer leaves them, without training, for the tests of ``udpo compare`` and
``udpo study`` (their tables, records and resumption)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from udpo.env.trajectory import Trajectory, TrajectoryWriter
from udpo.study.runner import DONE
from udpo.training import checkpoint_store as ckpt


def finished_run(run: Path, method: str, correct0: list[bool], correct1: list[bool], seed: int = 0) -> None:
    """A run folder as the trainer leaves it: eval/iter_000000 and iter_000001 (question k asks "question k",
    its agents answer 4 when right, 5 when wrong), metrics, a checkpoint, done.json."""
    for it, correct in ((0, correct0), (1, correct1)):
        with TrajectoryWriter(run / "eval" / f"iter_{it:06d}" / "trajectories.jsonl") as w:
            w.write(
                [
                    Trajectory(f"q{k}", f"question {k}", "4", [["4", "4"], ["4" if c else "5"] * 2], "4", c)
                    for k, c in enumerate(correct)
                ]
            )
    records = [{"kind": "train", "iteration": 1, "debates": 2, "tokens": 30, "update/kl": 0.5}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    staging = ckpt.staging_dir(run, 1)
    ckpt.write_json(
        staging / ckpt.STATE,
        {"iteration": 1, "optimizer_steps": 1, "total_iterations": 1, "world_size": 1, "files": {}},
    )
    ckpt.commit(run, staging, 1)
    (run / DONE).write_text(json.dumps({"method": method, "seed": seed, "final_eval": 1}))


def no_diagnosis_plots(monkeypatch: pytest.MonkeyPatch) -> None:
    """Skip ``udpo diagnose``'s PNG figures (seconds each) in tests that check numbers and files."""
    monkeypatch.setattr("udpo.analysis.diagnose_plots.write_plots", lambda *args, **kwargs: [])
