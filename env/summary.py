"""Run debates over a question set and summarize them (shared by ``udpo debate``,
the trainer's eval hook and ``udpo eval``). Writing and resuming a run folder is
:func:`udpo.env.runs.run_to_folder`'s; :func:`previous_debates` is re-exported from there."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from udpo.env.answer_forms import agent_form_shares
from udpo.env.backends.base import Backend
from udpo.env.debate import DebateConfig, DebateEnv
from udpo.env.progress import DebateProgress
from udpo.env.protocols import Protocol, Stage
from udpo.env.runs import run_to_folder
from udpo.env.tasks.base import Question, Task
from udpo.env.trajectory import Trajectory
from udpo.rewards import collapse_rate, debate_metrics, wrong_consensus


def summarize(trajectories: Sequence[Trajectory]) -> dict[str, Any]:
    """n_questions, accuracy, the mean U_intra / U_inter / U_sys, the unparsed rate, the collapse rate
    (the share of agents whose answers were more than half unparsed, :func:`udpo.rewards.collapse_rate`)
    and the consensus-on-wrong guard (``wrong_majority``, ``wrong_unanimous``: shares of debates ending
    with a majority, or every agent, on a wrong answer) of a set of debates, and ``forms``: per agent, the
    share of each form its answers were read in and its echo rate (:mod:`udpo.env.answer_forms`)."""
    if not trajectories:
        return {
            "n_questions": 0,
            **dict.fromkeys(("accuracy", "u_intra", "u_inter", "u_sys", "wrong_majority", "wrong_unanimous")),
            "forms": {},
        }
    metrics = debate_metrics([t.answers for t in trajectories], keys=[t.question_id for t in trajectories])
    guard = [wrong_consensus(t.answers, t.correct) for t in trajectories]
    return {
        "n_questions": len(trajectories),
        "accuracy": float(np.mean([t.correct for t in trajectories])),
        "u_intra": float(np.mean(metrics.u_intra)),
        "u_inter": float(np.mean(metrics.u_inter)),
        "u_sys": float(np.mean(metrics.u_sys)),
        "unparsed_rate": float(np.mean([a is None for t in trajectories for row in t.answers for a in row])),
        "collapse_rate": collapse_rate([t.answers for t in trajectories]),
        "wrong_majority": float(np.mean([g.majority for g in guard])),
        "wrong_unanimous": float(np.mean([g.unanimous for g in guard])),
        "forms": agent_form_shares(trajectories),
    }


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
    """Debate ``questions`` under ``protocol`` (default Standard MAD): :func:`udpo.env.runs.run_to_folder`
    with a :class:`DebateEnv` and :func:`summarize`. With ``out_dir`` append ``trajectories.jsonl``
    batch by batch and write ``summary.json`` (the summary, with ``meta`` under ``"run"``) at the end.

    An ``out_dir`` that already holds debates is refused unless ``resume``: then the questions
    already debated there (with the same settings, see :func:`udpo.env.runs.previous_debates`) are skipped
    and the summary covers the whole file. progress: as :meth:`DebateEnv.run` takes it (True: a line
    that moves with rounds, turns and tokens; a DebateProgress: the caller's line).
    """
    env = DebateEnv(task, backend, debate_config, protocol=protocol, meta=meta)
    return run_to_folder(
        env.run,
        questions,
        summarize,
        out_dir=out_dir,
        meta=meta,
        progress=progress,
        resume=resume,
        debate_config=debate_config,
        same_settings=True,
    )
