"""Run debates over a question set and summarize them (shared by ``udpo debate``,
the trainer's eval hook and ``udpo eval``)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from udpo.env.backends.base import Backend
from udpo.env.debate import DebateConfig, DebateEnv
from udpo.env.protocols import Protocol, Stage
from udpo.env.tasks.base import Question, Task
from udpo.env.trajectory import Trajectory, TrajectoryWriter, read_trajectories
from udpo.rewards import uncertainty


def summarize(trajectories: Sequence[Trajectory]) -> dict[str, Any]:
    """n_questions, accuracy and the mean U_intra / U_inter / U_sys of a set of debates."""
    if not trajectories:
        return {"n_questions": 0, "accuracy": None, "u_intra": None, "u_inter": None, "u_sys": None}
    metrics = [uncertainty(t.answers) for t in trajectories]
    return {
        "n_questions": len(trajectories),
        "accuracy": float(np.mean([t.correct for t in trajectories])),
        "u_intra": float(np.mean([m.u_intra for m in metrics])),
        "u_inter": float(np.mean([m.u_inter for m in metrics])),
        "u_sys": float(np.mean([m.u_sys for m in metrics])),
        "unparsed_rate": float(np.mean([a is None for t in trajectories for row in t.answers for a in row])),
    }


def write_json(path: str | os.PathLike, data: dict[str, Any]) -> None:
    """Write JSON atomically (temp file + rename): readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def check_out_dir(out_dir: str | os.PathLike, resume: bool) -> bool:
    """True when ``out_dir`` already holds debates to resume; refuses to mix runs without ``resume``."""
    path = Path(out_dir) / "trajectories.jsonl"
    if not path.exists() or path.stat().st_size == 0:
        return False
    if not resume:
        raise FileExistsError(
            f"{path} already holds debates; pass --resume to continue it or choose another --out"
        )
    return True


def run_debates(
    task: Task,
    backend: Backend,
    questions: Sequence[Question],
    debate_config: DebateConfig,
    out_dir: str | os.PathLike | None = None,
    meta: dict[str, Any] | None = None,
    progress: bool = True,
    protocol: Protocol | Sequence[Stage] | None = None,
    resume: bool = False,
) -> tuple[list[Trajectory], dict[str, Any]]:
    """Debate ``questions`` under ``protocol`` (default Standard MAD); with ``out_dir`` append ``trajectories.jsonl`` batch by batch and write
    ``summary.json`` (the summary, with ``meta`` under ``"run"``) at the end.

    An ``out_dir`` that already holds debates is refused unless ``resume``: then the questions
    already debated there are skipped and the summary covers the whole file.
    """
    env = DebateEnv(task, backend, debate_config, protocol=protocol, meta=meta)
    if out_dir is None:
        trajectories = env.run(questions, progress=progress)
        return trajectories, summarize(trajectories)
    path = Path(out_dir) / "trajectories.jsonl"
    done = read_trajectories(path) if check_out_dir(out_dir, resume) else []
    seen = {t.question_id for t in done}
    todo = [q for q in questions if q.id not in seen]
    with TrajectoryWriter(path) as writer:
        trajectories = done + env.run(todo, writer=writer, progress=progress)
    summary = {**summarize(trajectories), "run": dict(meta or {})}
    write_json(Path(out_dir) / "summary.json", summary)
    return trajectories, summary
