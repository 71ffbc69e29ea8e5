"""Scores of error-detection runs (ColMAD and its baselines): per-task and mean tables.

:func:`summarize_detection` scores a run's trajectories with ``udpo.rewards.detection`` (the positive
class is the task's first label, "error" for ReaLMistake): precision, recall, F1, F2 and accuracy per
subtask (``meta["subtask"]``, else the task), their unweighted mean over subtasks (the ColMAD paper's
"Avg." columns), and the pooled scores over all items; plus how often the judge was called.
:func:`comparison_table` lays several runs side by side as a Markdown table.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from udpo.env.run_folder import DebateFolder
from udpo.env.trajectory import Trajectory
from udpo.rewards.detection import detection_scores, mean_scores

#: the columns of a per-task table
SCORE_KEYS = ("precision", "recall", "f1", "f2", "accuracy")


def _group(t: Trajectory) -> str:
    return str(t.meta.get("subtask") or t.meta.get("task") or "all")


def summarize_detection(trajectories: Sequence[Trajectory], positive: Any = "error") -> dict[str, Any]:
    """The per-task, mean and pooled detection scores of a run (see the module docstring)."""
    if not trajectories:
        return {"n_items": 0, "per_task": {}, "mean": None, "overall": None}
    groups: dict[str, list[Trajectory]] = {}
    for t in trajectories:
        groups.setdefault(_group(t), []).append(t)
    per_task = {
        name: detection_scores([t.prediction for t in ts], [t.gold for t in ts], positive)
        for name, ts in sorted(groups.items())
    }
    overall = detection_scores([t.prediction for t in trajectories], [t.gold for t in trajectories], positive)
    judged = sum(bool(t.meta.get("judge_called")) for t in trajectories)
    return {
        "n_items": len(trajectories),
        "protocol": trajectories[0].meta.get("protocol"),
        "per_task": {name: s.to_dict() for name, s in per_task.items()},
        "mean": mean_scores(list(per_task.values())),
        "overall": overall.to_dict(),
        "judge_calls": judged,
        "judge_call_rate": judged / len(trajectories),
    }


def format_table(summary: dict[str, Any]) -> str:
    """A plain-text table of one run's per-task and mean scores."""
    head = f"{'task':<32} {'n':>4} " + " ".join(f"{k:>9}" for k in SCORE_KEYS)
    lines = [head]
    for name, s in summary["per_task"].items():
        lines.append(f"{name:<32} {s['n']:>4} " + " ".join(f"{s[k]:>9.3f}" for k in SCORE_KEYS))
    mean = summary["mean"]
    lines.append(f"{'mean over tasks':<32} {'':>4} " + " ".join(f"{mean[k]:>9.3f}" for k in SCORE_KEYS))
    return "\n".join(lines)


def load_summary(run: str | os.PathLike) -> dict[str, Any]:
    """The ``summary.json`` of a run folder (a clear error when it is missing)."""
    path = DebateFolder(Path(run)).summary if Path(run).is_dir() else Path(run)
    if not path.is_file():
        raise FileNotFoundError(f"no summary.json for run {run} (run `udpo detect` with --output-dir first)")
    return json.loads(path.read_text(encoding="utf-8"))


def comparison_table(summaries: Sequence[dict[str, Any]], labels: Sequence[str] | None = None) -> str:
    """A Markdown table, one row per run: F1 and F2 (in %) per task, then the means, as in the ColMAD
    paper's Table 1."""
    if not summaries:
        raise ValueError("no runs to compare")
    tasks = sorted({name for s in summaries for name in s["per_task"]})
    labels = list(labels) if labels is not None else [str(s.get("protocol")) for s in summaries]
    header = ["run", "n"] + [f"{t} {m}" for t in tasks for m in ("F1", "F2")] + ["mean F1", "mean F2"]
    rows = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for label, s in zip(labels, summaries, strict=True):
        cells = [label, str(s["n_items"])]
        for t in tasks:
            got = s["per_task"].get(t)
            cells += [f"{100 * got['f1']:.1f}", f"{100 * got['f2']:.1f}"] if got else ["-", "-"]
        cells += [f"{100 * s['mean']['f1']:.1f}", f"{100 * s['mean']['f2']:.1f}"]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)
