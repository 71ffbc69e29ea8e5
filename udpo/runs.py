"""A resumable run of any procedure that turns questions into trajectories, written to a run folder.

``OUT/trajectories.jsonl`` is appended batch by batch; a folder that already holds items is refused
unless resuming, and then the items already there are skipped; ``OUT/summary.json`` is written at the
end from every item of the file. Used by ``udpo detect`` and ``udpo uncertainty``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from udpo.env.tasks.base import Question
from udpo.env.trajectory import Trajectory, TrajectoryWriter
from udpo.evaluate import previous_debates, write_json

#: runner(questions, writer, progress) -> the trajectories of those questions
Runner = Callable[..., list[Trajectory]]


def run_to_folder(
    run: Runner,
    questions: Sequence[Question],
    summarize: Callable[[list[Trajectory]], dict[str, Any]],
    out_dir: str | os.PathLike | None = None,
    meta: dict[str, Any] | None = None,
    progress: bool = True,
    resume: bool = False,
) -> tuple[list[Trajectory], dict[str, Any]]:
    """Run ``questions`` (skipping those already in ``out_dir`` when resuming) and summarize all of them.

    Without ``out_dir`` nothing is written. The summary gets ``meta`` under ``"run"``.
    """
    if out_dir is None:
        trajectories = run(questions, writer=None, progress=progress)
        return trajectories, {**summarize(trajectories), "run": dict(meta or {})}
    path = Path(out_dir) / "trajectories.jsonl"
    done = previous_debates(out_dir, resume)
    seen = {t.question_id for t in done}
    todo = [q for q in questions if q.id not in seen]
    with TrajectoryWriter(path) as writer:
        trajectories = done + run(todo, writer=writer, progress=progress)
    summary = {**summarize(trajectories), "run": dict(meta or {})}
    write_json(Path(out_dir) / "summary.json", summary)
    return trajectories, summary
