"""A resumable run of any procedure that turns questions into trajectories, written to a run folder.

``OUT/trajectories.jsonl`` is appended batch by batch; a folder that already holds items is refused
unless resuming, and then the items already there are skipped (:func:`previous_debates`: a last line
cut short by a killed run is dropped and its question run again); ``OUT/summary.json`` is written at the
end from every item of the file. :func:`run_to_folder` is the one implementation: ``udpo debate``,
``udpo eval``'s attack rows (through :func:`udpo.env.summary.run_debates`), ``udpo detect`` and
``udpo uncertainty`` all run through it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from udpo.env.debate import DebateConfig
from udpo.env.jsonl import write_json
from udpo.env.progress import DebateProgress
from udpo.env.run_folder import DebateFolder
from udpo.env.tasks.base import Question
from udpo.env.trajectory import Trajectory, TrajectoryWriter, iter_numbered_records

#: runner(questions, writer=, progress=) -> the trajectories of those questions, each finished batch
#: appended to the writer (``DebateEnv.run``, a detector's or an uncertainty procedure's ``run``)
Runner = Callable[..., list[Trajectory]]
#: run settings a resumed run may change: they say how debates are computed, not what is debated
MAY_CHANGE_ON_RESUME = ("backend",)


def previous_debates(
    out_dir: str | os.PathLike,
    resume: bool,
    debate_config: DebateConfig | None = None,
    meta: dict[str, Any] | None = None,
) -> list[Trajectory]:
    """The debates ``out_dir/trajectories.jsonl`` already holds ([] when none).

    Without ``resume`` a file with debates is refused (runs are never mixed). With it, every debate
    must have been run with this run's settings: ``n_agents`` and ``rounds`` (the answer matrix's
    shape, when ``debate_config`` is given) and every ``meta`` entry the record also has (task, split, model, seed, ...; not those in
    ``MAY_CHANGE_ON_RESUME``). A last line cut short by a killed run is dropped (its question is
    debated again). Call it before loading a model: a mismatch costs nothing.
    """
    path = DebateFolder(Path(out_dir)).trajectories
    if not path.exists() or path.stat().st_size == 0:
        return []
    if not resume:
        raise FileExistsError(
            f"{path} already holds debates; pass --resume to continue it or choose another --output-dir"
        )
    want = {k: v for k, v in (meta or {}).items() if k not in MAY_CHANGE_ON_RESUME}
    if debate_config is not None:
        want.update(n_agents=debate_config.n_agents, rounds=debate_config.rounds)
    done = []
    for lineno, record in iter_numbered_records(path):
        t = Trajectory.from_dict(record)
        have = {**t.meta, "n_agents": t.n_agents, "rounds": t.n_rounds}
        differ = [f"{k}={have[k]!r} (now {v!r})" for k, v in want.items() if k in have and have[k] != v]
        if differ:
            raise ValueError(
                f"{path}:{lineno}: debated with {', '.join(differ)}; --resume continues a run with its own "
                f"settings: use them, or choose another --output-dir"
            )
        done.append(t)
    return done


def run_to_folder(
    run: Runner,
    questions: Sequence[Question],
    summarize: Callable[[list[Trajectory]], dict[str, Any]],
    out_dir: str | os.PathLike | None = None,
    meta: dict[str, Any] | None = None,
    progress: bool | DebateProgress = True,
    resume: bool = False,
    debate_config: DebateConfig | None = None,
    same_settings: bool = False,
) -> tuple[list[Trajectory], dict[str, Any]]:
    """Run ``questions`` (skipping those already in ``out_dir`` when resuming) and summarize all of them.

    With ``out_dir``, ``trajectories.jsonl`` there is appended batch by batch (never rewritten) and
    ``summary.json`` written at the end (atomically) from every trajectory of the file; a folder that
    already holds trajectories is refused unless ``resume`` (:func:`previous_debates`). When resuming,
    the trajectories already there must have been run with ``debate_config``'s shape (when given) and,
    with ``same_settings``, with ``meta``'s settings. Without ``out_dir`` nothing is written. The
    summary gets ``meta`` under ``"run"``. progress: as the runner takes it.
    """
    if out_dir is None:
        trajectories = run(questions, writer=None, progress=progress)
        return trajectories, {**summarize(trajectories), "run": dict(meta or {})}
    folder = DebateFolder(Path(out_dir))
    path = folder.trajectories
    done = previous_debates(out_dir, resume, debate_config, meta if same_settings else None)
    seen = {t.question_id for t in done}
    todo = [q for q in questions if q.id not in seen]
    with TrajectoryWriter(path) as writer:
        trajectories = done + run(todo, writer=writer, progress=progress)
    summary = {**summarize(trajectories), "run": dict(meta or {})}
    write_json(folder.summary, summary)
    return trajectories, summary
