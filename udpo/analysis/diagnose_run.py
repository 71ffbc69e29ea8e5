"""The debates of one run as ``udpo diagnose`` reads them: :class:`Run` (ids, correctness, answer
matrices and each debate's uncertainty metrics) loaded from a run folder or a ``trajectories.jsonl`` file
by :func:`load_run`; the tables (:mod:`udpo.analysis.diagnose`) and the figures
(:mod:`udpo.analysis.diagnose_plots`) both read it."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from udpo.env.answer_forms import recorded_forms, regraded_forms
from udpo.env.run_folder import DEBATES, DebateFolder
from udpo.env.tasks.base import Task
from udpo.env.trajectory import iter_numbered_records
from udpo.rewards import DebateMetrics, check_answers, debate_metrics
from udpo.rewards.diverse_agent_entropy import trajectory_dae

#: the uncertainty metrics analysed (the three levels and DiverseAgentEntropy), with their display names
UNCERTAINTY_LABELS: dict[str, str] = {
    "u_intra": "U_intra",
    "u_inter": "U_inter",
    "u_sys": "U_sys",
    "dae": "DAE",
}


@dataclass
class Run:
    """The debates of one run: ids, task, shape and correctness per debate, and their metrics
    (``dae``: normalized DiverseAgentEntropy per debate; ``forms[k][i][t]``: the form agent i's answer of
    round t was read in, :mod:`udpo.env.answer_forms`)."""

    label: str
    path: Path
    question_ids: list[str]
    tasks: list[str]
    correct: np.ndarray
    predictions: list[Any]
    golds: list[Any]
    metrics: DebateMetrics
    n_agents: np.ndarray
    n_rounds: np.ndarray
    answers: list[Any]
    injections: list[tuple[str, ...] | None]
    reads: list[list[tuple[int, int, list[list[int]]]]]
    dae: np.ndarray
    forms: list[list[list[str]]]

    def __len__(self) -> int:
        return len(self.correct)

    def values(self, metric: str) -> np.ndarray:
        return self.dae if metric == "dae" else getattr(self.metrics, metric)


def trajectory_file(path: str | os.PathLike) -> Path:
    """The JSONL file of a run given as a folder (``<dir>/trajectories.jsonl``) or a file."""
    path = Path(path)
    if path.is_dir():
        file = DebateFolder(path).trajectories
        if not file.exists():
            raise FileNotFoundError(f"run folder {path} has no {DEBATES}")
        return file
    if not path.exists():
        raise FileNotFoundError(f"no run folder or trajectory file at {path}")
    return path


def default_label(path: str | os.PathLike) -> str:
    """Folder name for a folder or for ``<dir>/trajectories.jsonl``, else the file's stem."""
    path = Path(path)
    if path.is_dir() or path.name == DEBATES:
        return (path if path.is_dir() else path.parent).resolve().name
    return path.stem


def load_run(
    path: str | os.PathLike, label: str | None = None, lam: float = 0.5, regrade: Task | None = None
) -> Run:
    """Read a run's trajectories and compute every debate's metrics (errors name the file and line).

    The answer forms are those recorded in each turn, or with ``regrade`` those that task's parser reads in
    each turn's text now (:func:`udpo.env.answer_forms.regraded_forms`): the monitor on old records."""
    file = trajectory_file(path)
    label = label or default_label(path)
    ids, tasks, correct, preds, golds, answers, injections, reads, dae = [], [], [], [], [], [], [], [], []
    forms: list[list[list[str]]] = []
    records = tqdm(iter_numbered_records(file), desc=f"reading {label}", unit=" debates", leave=False)
    for lineno, rec in records:
        where = f"{file}:{lineno} (question_id {rec['question_id']!r})"
        if not isinstance(rec["correct"], bool):
            raise ValueError(f"{where}: 'correct' must be true or false, got {rec['correct']!r}")
        answers.append(check_answers(rec["answers"], where=where))
        try:
            dae.append(trajectory_dae(rec).normalized)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
        ids.append(str(rec["question_id"]))
        tasks.append(str((rec.get("meta") or {}).get("task", "unknown")))
        correct.append(rec["correct"])
        preds.append(rec["prediction"])
        golds.append(rec["gold"])
        injections.append(injection_pattern(rec.get("meta") or {}))
        reads.append(turn_reads(rec.get("turns") or [], where))
        forms.append(recorded_forms(rec) if regrade is None else regraded_forms(regrade, rec))
    if not answers:
        raise ValueError(f"{file}: no debates in this file (it is empty)")
    return Run(
        label=label,
        path=file,
        question_ids=ids,
        tasks=tasks,
        correct=np.array(correct, dtype=bool),
        predictions=preds,
        golds=golds,
        metrics=debate_metrics(answers, lam=lam, keys=ids),
        n_agents=np.array([len(a) for a in answers]),
        n_rounds=np.array([len(a[0]) - 1 for a in answers]),
        answers=answers,
        injections=injections,
        reads=reads,
        dae=np.array(dae, dtype=float),
        forms=forms,
    )


def injection_pattern(meta: dict[str, Any]) -> tuple[str, ...] | None:
    """The controlled-injection pattern a debate ran with (``meta["protocol"]``), or None. A debate
    protocol records its stages there as a dict; the other procedures (DiverseAgentEntropy, detection)
    record their name, a string, and inject nothing."""
    protocol = meta.get("protocol")
    stages = (protocol.get("stages") or []) if isinstance(protocol, dict) else []
    inject = next((s for s in stages if isinstance(s, dict) and s.get("name") == "inject"), None)
    return tuple(inject["pattern"]) if inject and inject.get("pattern") else None


def turn_reads(turns: list[Any], where: str) -> list[tuple[int, int, list[list[int]]]]:
    """(agent, round, [[peer, peer's round], ...]) of every turn after round 0 that recorded its reads."""
    out = []
    for row in turns:
        for turn in row if isinstance(row, list) else []:
            if not isinstance(turn, dict) or turn.get("round", 0) == 0 or "reads" not in turn:
                continue
            reads = turn["reads"]
            if not isinstance(reads, list) or not all(isinstance(r, list) and len(r) == 2 for r in reads):
                raise ValueError(
                    f"{where}: a turn's 'reads' must be a list of [agent, round] pairs, got {reads!r}"
                )
            out.append((int(turn["agent"]), int(turn["round"]), reads))
    return out


def safe_name(label: str) -> str:
    """A run label made safe for a file name."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", label).strip("_") or "run"
