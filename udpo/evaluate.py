"""Run debates over a question set and summarize them (shared by ``udpo debate``,
the trainer's eval hook and ``udpo eval``)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from udpo.env.backends.base import Backend
from udpo.env.debate import DebateConfig, DebateEnv
from udpo.env.jsonl import write_json  # noqa: F401  (re-exported: udpo.trainer imports it from here)
from udpo.env.progress import DebateProgress
from udpo.env.protocols import Protocol, Stage
from udpo.env.tasks.base import Question, Task
from udpo.env.trajectory import Trajectory, TrajectoryWriter, iter_numbered_records
from udpo.rewards import uncertainty, wrong_consensus


def summarize(trajectories: Sequence[Trajectory]) -> dict[str, Any]:
    """n_questions, accuracy, the mean U_intra / U_inter / U_sys, the unparsed rate and the
    consensus-on-wrong guard (``wrong_majority``, ``wrong_unanimous``: shares of debates ending with a
    majority, or every agent, on a wrong answer) of a set of debates."""
    if not trajectories:
        return {
            "n_questions": 0,
            **dict.fromkeys(("accuracy", "u_intra", "u_inter", "u_sys", "wrong_majority", "wrong_unanimous")),
        }
    metrics = [uncertainty(t.answers) for t in trajectories]
    guard = [wrong_consensus(t.answers, t.correct) for t in trajectories]
    return {
        "n_questions": len(trajectories),
        "accuracy": float(np.mean([t.correct for t in trajectories])),
        "u_intra": float(np.mean([m.u_intra for m in metrics])),
        "u_inter": float(np.mean([m.u_inter for m in metrics])),
        "u_sys": float(np.mean([m.u_sys for m in metrics])),
        "unparsed_rate": float(np.mean([a is None for t in trajectories for row in t.answers for a in row])),
        "wrong_majority": float(np.mean([g.majority for g in guard])),
        "wrong_unanimous": float(np.mean([g.unanimous for g in guard])),
    }


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
    path = Path(out_dir) / "trajectories.jsonl"
    if not path.exists() or path.stat().st_size == 0:
        return []
    if not resume:
        raise FileExistsError(
            f"{path} already holds debates; pass --resume to continue it or choose another --out"
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
                f"settings: use them, or choose another --out"
            )
        done.append(t)
    return done


def run_debates(
    task: Task,
    backend: Backend,
    questions: Sequence[Question],
    debate_config: DebateConfig,
    out_dir: str | os.PathLike | None = None,
    meta: dict[str, Any] | None = None,
    progress: bool | DebateProgress = True,
    protocol: Protocol | Sequence[Stage] | None = None,
    resume: bool = False,
) -> tuple[list[Trajectory], dict[str, Any]]:
    """Debate ``questions`` under ``protocol`` (default Standard MAD); with ``out_dir`` append ``trajectories.jsonl`` batch by batch and write
    ``summary.json`` (the summary, with ``meta`` under ``"run"``) at the end.

    An ``out_dir`` that already holds debates is refused unless ``resume``: then the questions
    already debated there (with the same settings, see :func:`previous_debates`) are skipped and the
    summary covers the whole file. progress: as :meth:`DebateEnv.run` takes it (True: a line that
    moves with rounds, turns and tokens; a DebateProgress: the caller's line).
    """
    env = DebateEnv(task, backend, debate_config, protocol=protocol, meta=meta)
    if out_dir is None:
        trajectories = env.run(questions, progress=progress)
        return trajectories, summarize(trajectories)
    path = Path(out_dir) / "trajectories.jsonl"
    done = previous_debates(out_dir, resume, debate_config, meta)
    seen = {t.question_id for t in done}
    todo = [q for q in questions if q.id not in seen]
    with TrajectoryWriter(path) as writer:
        trajectories = done + env.run(todo, writer=writer, progress=progress)
    summary = {**summarize(trajectories), "run": dict(meta or {})}
    write_json(Path(out_dir) / "summary.json", summary)
    return trajectories, summary
