"""``udpo diagnose``: does uncertainty predict failure? The statistics and plots of docs/metrics.md,
"``udpo diagnose``".

Reads one or more runs (a folder holding ``trajectories.jsonl``, or a ``.jsonl`` file), computes each
debate's U_intra, U_inter and U_sys from its answer matrix, and its DiverseAgentEntropy (DAE: the entropy
of the final answers weighted by how rarely each agent changed its answer over the rounds the debate ran,
``meta["rounds_run"]`` when present, divided by ln N; :mod:`udpo.rewards.diverse_agent_entropy`)
(correctness is the file's ``correct`` field, decided by the task), and writes to ``out_dir``:

- ``summary.json``: per run accuracy and mean uncertainties (also per task, N and T), failure-vs-success
  Welch t-test p-value and Cohen's d per metric, Pearson r and p of each metric with correctness and
  between metrics, AUROC of each metric against failed debates, selective-prediction curves
  (k = 10..100%); with several runs, the accuracy gain of
  each run over the baseline (Standard MAD) run within bins of the baseline's U_sys, questions matched
  by ``question_id``.
- ``woozle`` in ``summary.json`` and ``woozle.csv``: hallucination propagation per round (the DIGRA paper's
  MA, MR, IMR, CR; with reads recorded, the share of wrong responses read and the read degree), per run
  and per (N, T, controlled-injection pattern) group, so injected runs report like the paper's Table 1.
- ``forms`` in ``summary.json`` and ``forms.csv``: per run and agent, the share of each form its answers were
  read in and its echo rate (docs/metrics.md, "Answer forms and echo rate"; :mod:`udpo.env.answer_forms`).
- CSV tables: ``debates.csv`` (per-debate metrics), ``runs.csv``, ``groups.csv``, ``failure_vs_success.csv``,
  ``correlations.csv``, ``selective_prediction.csv``, ``stratified_gains.csv``, ``woozle.csv``, ``forms.csv``.
- PNG plots: ``distributions_<run>.png``, ``correlation_<run>.png``, ``selective_prediction.png``,
  ``stratified_gains.png``.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from udpo.analysis.diagnose_run import UNCERTAINTY_LABELS, Run, default_label, load_run, safe_name
from udpo.env.answer_forms import forms_by_agent
from udpo.env.tasks.base import Task
from udpo.env.tasks.parsing import FORMS
from udpo.rewards import correctness, read_flow, woozle_metrics
from udpo.rewards.statistics import (
    COVERAGES,
    auroc,
    failure_vs_success,
    pearson,
    selective_prediction,
    stratified_gains,
)

#: labels recognised as the Standard MAD run when no baseline is named
BASELINE_NAMES = ("mad", "standard_mad", "standard-mad", "standard mad", "standardmad")


def woozle_report(run: Run) -> list[dict[str, Any]]:
    """Woozle metrics of a run per (N, T, injection pattern) group (see ``udpo.rewards.woozle``)."""
    groups: dict[tuple, list[int]] = defaultdict(list)
    for k in range(len(run)):
        groups[(int(run.n_agents[k]), int(run.n_rounds[k]), run.injections[k])].append(k)
    report = []
    order = sorted(groups, key=lambda key: (key[0], key[1], key[2] is not None, str(key[2])))  # plain first
    for n, t, pattern in order:
        members = groups[(n, t, pattern)]
        correct = np.stack([correctness(run.answers[k], run.golds[k]) for k in members])
        read_rounds, read_wrong, turn_rounds, degrees = [], [], [], []
        for m, k in enumerate(members):
            for _agent, rnd, reads in run.reads[k]:
                turn_rounds.append(rnd)
                degrees.append(len(reads) / (n - 1) if n > 1 else np.nan)
                for peer, peer_round in reads:
                    read_rounds.append(rnd)
                    read_wrong.append(not correct[m, peer, peer_round])
        flow = read_flow(read_rounds, read_wrong, turn_rounds, degrees, t)
        report.append(
            {
                "n_agents": n,
                "n_rounds": t,
                "inject": list(pattern) if pattern else None,
                "n_debates": len(members),
                **woozle_metrics(correct).to_dict(),
                **{key: value.tolist() for key, value in flow.items()},
            }
        )
    return report


def _means(run: Run, sel: np.ndarray) -> dict[str, float]:
    out = {"n_debates": int(sel.sum()), "accuracy": float(run.correct[sel].mean())}
    out.update({m: float(run.values(m)[sel].mean()) for m in UNCERTAINTY_LABELS})
    return out


def analyze_run(run: Run) -> dict[str, Any]:
    """Every single-run statistic of docs/metrics.md, "``udpo diagnose``", for one run."""
    everything = np.ones(len(run), dtype=bool)
    groups = []
    for key in sorted(set(zip(run.tasks, run.n_agents.tolist(), run.n_rounds.tolist(), strict=True))):
        sel = np.array([k == key for k in zip(run.tasks, run.n_agents, run.n_rounds, strict=True)])
        groups.append({"task": key[0], "n_agents": key[1], "n_rounds": key[2], **_means(run, sel)})
    metric_names = [*UNCERTAINTY_LABELS, "correct"]
    columns = [run.values(m) for m in UNCERTAINTY_LABELS] + [run.correct.astype(float)]
    pairs = [[pearson(a, b) for b in columns] for a in columns]
    matrix_r = [[r for r, _ in row] for row in pairs]
    matrix_p = [[p for _, p in row] for row in pairs]
    return {
        "path": str(run.path),
        **_means(run, everything),
        "groups": groups,
        "failure_vs_success": {
            m: failure_vs_success(run.values(m), run.correct).to_dict() for m in UNCERTAINTY_LABELS
        },
        "correlation_with_correct": {
            m: dict(zip(("r", "p_value"), pearson(run.values(m), run.correct.astype(float)), strict=True))
            for m in UNCERTAINTY_LABELS
        },
        "correlation_matrix": {"variables": metric_names, "r": matrix_r, "p_value": matrix_p},
        "auroc": {m: auroc(run.values(m), ~run.correct) for m in UNCERTAINTY_LABELS},
        "selective_prediction": {
            m: selective_prediction(run.values(m), run.correct, COVERAGES) for m in UNCERTAINTY_LABELS
        },
        "woozle": woozle_report(run),
        "forms": forms_by_agent(run.forms),
    }


def per_question(run: Run) -> dict[str, tuple[float, float]]:
    """question_id -> (mean U_sys, mean correctness) over the run's debates of that question."""
    acc: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for qid, u, c in zip(run.question_ids, run.metrics.u_sys.tolist(), run.correct.tolist(), strict=True):
        acc[qid].append((u, float(c)))
    return {q: (float(np.mean([u for u, _ in v])), float(np.mean([c for _, c in v]))) for q, v in acc.items()}


def gains_over_baseline(baseline: Run, run: Run) -> dict[str, Any]:
    """Accuracy gain of ``run`` over ``baseline`` per bin of the baseline's U_sys, on shared questions."""
    base, other = per_question(baseline), per_question(run)
    shared = [q for q in base if q in other]
    if not shared:
        return {"n_shared_questions": 0, "bins": []}
    rows = stratified_gains(
        [base[q][0] for q in shared], [base[q][1] for q in shared], [other[q][1] for q in shared]
    )
    return {"n_shared_questions": len(shared), "bins": rows}


def choose_baseline(labels: list[str], baseline: str | None) -> str:
    """The named baseline, else a run labelled like Standard MAD, else the first run."""
    if baseline is not None:
        if baseline not in labels:
            raise ValueError(f"--baseline-run {baseline!r} is not a run label; labels are {labels}")
        return baseline
    return next((lab for lab in labels if lab.lower() in BASELINE_NAMES), labels[0])


def _json_ready(x: Any) -> Any:
    """NaN and inf become null; NumPy scalars become Python numbers."""
    if isinstance(x, dict):
        return {k: _json_ready(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_ready(v) for v in x]
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def _write_csv(path: Path, header: list[str], rows: list[list[Any]]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(header)
        for row in rows:
            writer.writerow(["" if isinstance(v, float) and math.isnan(v) else v for v in row])


def write_tables(out: Path, runs: list[Run], summary: dict[str, Any]) -> list[Path]:
    """The CSV tables of a summary (see the module docstring)."""
    written = []

    def table(name: str, header: list[str], rows: list[list[Any]]) -> None:
        _write_csv(out / name, header, rows)
        written.append(out / name)

    parts = [
        "flip_rate",
        "revision_rate",
        "u_intra",
        "u_inter",
        "entropy",
        "disagreement",
        "loo_instability",
        "u_sys",
    ]
    table(
        "debates.csv",
        [
            "run",
            "question_id",
            "task",
            "n_agents",
            "n_rounds",
            "prediction",
            "gold",
            "correct",
            *parts,
            "dae",
        ],
        [
            [run.label, run.question_ids[i], run.tasks[i], int(run.n_agents[i]), int(run.n_rounds[i])]
            + [run.predictions[i], run.golds[i], int(run.correct[i])]
            + [float(getattr(run.metrics, p)[i]) for p in parts]
            + [float(run.dae[i])]
            for run in runs
            for i in range(len(run))
        ],
    )
    stats = summary["runs"]
    table(
        "runs.csv",
        ["run", "n_debates", "accuracy", *UNCERTAINTY_LABELS],
        [
            [lab, s["n_debates"], s["accuracy"], *(s[m] for m in UNCERTAINTY_LABELS)]
            for lab, s in stats.items()
        ],
    )
    table(
        "groups.csv",
        ["run", "task", "n_agents", "n_rounds", "n_debates", "accuracy", *UNCERTAINTY_LABELS],
        [
            [
                lab,
                g["task"],
                g["n_agents"],
                g["n_rounds"],
                g["n_debates"],
                g["accuracy"],
                *(g[m] for m in UNCERTAINTY_LABELS),
            ]
            for lab, s in stats.items()
            for g in s["groups"]
        ],
    )
    fvs_keys = ["n_fail", "n_success", "mean_fail", "mean_success", "t_statistic", "p_value", "cohens_d"]
    table(
        "failure_vs_success.csv",
        ["run", "metric", *fvs_keys],
        [
            [lab, m, *(s["failure_vs_success"][m][k] for k in fvs_keys)]
            for lab, s in stats.items()
            for m in UNCERTAINTY_LABELS
        ],
    )
    table(
        "correlations.csv",
        ["run", "metric", "r_with_correct", "p_value", "auroc_failed"],
        [
            [
                lab,
                m,
                s["correlation_with_correct"][m]["r"],
                s["correlation_with_correct"][m]["p_value"],
                s["auroc"][m],
            ]
            for lab, s in stats.items()
            for m in UNCERTAINTY_LABELS
        ],
    )
    table(
        "selective_prediction.csv",
        ["run", "metric", "k_percent", "n_kept", "accuracy"],
        [
            [lab, m, row["k"], row["n_kept"], row["accuracy"]]
            for lab, s in stats.items()
            for m in UNCERTAINTY_LABELS
            for row in s["selective_prediction"][m]
        ],
    )
    woozle_keys = ("ma", "mr", "imr", "cr", "wrong_read_fraction", "read_degree")
    table(
        "woozle.csv",
        ["run", "n_agents", "n_rounds", "inject", "n_debates", "metric", "round", "value"],
        [
            [lab, g["n_agents"], g["n_rounds"], " ".join(g["inject"] or []), g["n_debates"], key, rnd, value]
            for lab, s in stats.items()
            for g in s["woozle"]
            for key in woozle_keys
            for rnd, value in enumerate(g[key], start=0 if key == "ma" else 1)
        ],
    )
    table(
        "forms.csv",
        ["run", "agent", "turns", "echo_rate", *FORMS],
        [
            [lab, agent, f["turns"], f["echo_rate"], *(f[form] for form in FORMS)]
            for lab, s in stats.items()
            for agent, f in s["forms"].items()
        ],
    )
    if summary.get("stratified_gains"):
        table(
            "stratified_gains.csv",
            ["run", "baseline", "u_sys_bin", "n_questions", "baseline_accuracy", "accuracy", "gain"],
            [
                [
                    lab,
                    summary["baseline"],
                    b["bin"],
                    b["n_questions"],
                    b["baseline_accuracy"],
                    b["accuracy"],
                    b["gain"],
                ]
                for lab, g in summary["stratified_gains"].items()
                for b in g["bins"]
            ],
        )
    return written


def summarize(runs: list[Run], lam: float = 0.5, baseline: str | None = None) -> dict[str, Any]:
    """The summary of loaded runs (as written to summary.json, NaN as None, without ``files``).

    ``lam`` is only recorded: the runs' metrics were computed with it by :func:`load_run`.
    """
    summary: dict[str, Any] = {"lam": lam, "runs": {run.label: analyze_run(run) for run in runs}}
    if len(runs) > 1:
        labels = [run.label for run in runs]
        base_label = choose_baseline(labels, baseline)
        base = runs[labels.index(base_label)]
        summary["baseline"] = base_label
        summary["stratified_gains"] = {
            run.label: gains_over_baseline(base, run) for run in runs if run.label != base_label
        }
    return _json_ready(summary)


def diagnose(
    paths: list[str | os.PathLike],
    out_dir: str | os.PathLike,
    labels: list[str] | None = None,
    baseline: str | None = None,
    lam: float = 0.5,
    plots: bool = True,
    regrade: Task | None = None,
) -> dict[str, Any]:
    """Analyse runs and write summary.json, CSV tables and (``plots``) PNG figures to ``out_dir``.

    ``regrade``: read the answer forms again with this task's parser instead of those recorded
    (:func:`~udpo.analysis.diagnose_run.load_run`). Returns the summary (as written, NaN as None) with
    ``files``: every path written.
    """
    if not paths:
        raise ValueError("give at least one run folder or trajectory file")
    if labels is not None and len(labels) != len(paths):
        raise ValueError(f"got {len(labels)} labels for {len(paths)} runs")
    names = labels or [default_label(p) for p in paths]
    files_names = [safe_name(n) for n in names]
    duplicates = sorted({n for n, f in zip(names, files_names, strict=True) if files_names.count(f) > 1})
    if duplicates:
        raise ValueError(
            f"runs share the label(s) {duplicates} (as file names); name them with --labels a,b,..."
        )
    runs = [load_run(p, label=n, lam=lam, regrade=regrade) for p, n in zip(paths, names, strict=True)]
    summary = summarize(runs, lam=lam, baseline=baseline)

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = write_tables(out, runs, summary)
    if plots:
        from udpo.analysis import diagnose_plots  # matplotlib loads only when figures are drawn

        files += diagnose_plots.write_plots(out, runs, summary)
    summary["files"] = sorted(str(f) for f in files + [out / "summary.json"])
    with open(out / "summary.json", "w", encoding="utf-8") as fh:
        json.dump(summary, fh, indent=2, allow_nan=False)
    return summary


def format_woozle(summary: dict[str, Any]) -> str:
    """The woozle metrics of a summary as text lines: one per run and (N, T, injection) group."""
    lines = []
    for label, stats in summary["runs"].items():
        for g in stats.get("woozle", []):
            setup = f"N={g['n_agents']} T={g['n_rounds']}" + (
                f" inject={','.join(g['inject'])}" if g["inject"] else ""
            )
            cells = [
                f"{name} " + " ".join("-" if v is None else f"{100 * v:.1f}" for v in g[key])
                for key, name in (("ma", "MA"), ("mr", "MR"), ("imr", "IMR"), ("cr", "CR"))
            ]
            lines.append(f"{label:<20} {setup} ({g['n_debates']} debates), % by round: " + " | ".join(cells))
    return "\n".join(lines)
