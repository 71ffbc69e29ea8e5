"""The tables and figures of a study (``udpo study``, ``udpo compare``), built from the runs' records alone
(:mod:`udpo.study.record`, ``results_dir/runs/``): no run folder is read, so a study's committed
folder rebuilds them anywhere.

Written to ``results_dir``: ``results.json``, ``table.md``, ``table.csv``, ``runs.csv`` (each run's training
diagnostics), ``budget.csv``, ``forms.csv`` (each agent's answer forms and echo rate, every turn's text read
again by the current parser: :func:`answer_forms`), ``seed_changes.png`` (when the seeds share their test
problems) and
``diagnosis/`` (``udpo diagnose`` of the final evaluations; its pooled inputs are removed afterwards).
The tables cover the seeds whose every trained run has a record; the others are listed as missing.
"""

from __future__ import annotations

import csv
import shutil
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from udpo.analysis.results import PER_QUESTION_METRICS, problems, question_metrics
from udpo.env.answer_forms import forms_by_agent, forms_used, recorded_forms, regraded_forms
from udpo.env.jsonl import write_json
from udpo.env.tasks.parsing import FORMS
from udpo.env.trajectory import Trajectory
from udpo.rewards import collapse_rate
from udpo.study.cut import cut_summary, length_decomposition
from udpo.study.plan import METHODS, CompareConfig
from udpo.study.record import RunRecord
from udpo.study.regrade import check_grader

#: the metrics of the tables and of the seed analysis: the unparsed rate beside the guard, since an agent that
#: stops answering lowers ``wrong_majority`` (unparsed answers never count there) and the U terms alike
TABLE_METRICS = (
    "accuracy",
    "u_intra",
    "u_inter",
    "u_sys",
    "wrong_majority",
    "wrong_unanimous",
    "unparsed_rate",
)
#: metrics of a whole evaluation, not of one question: analysed over seeds (one value per seed and evaluation)
RUN_METRICS: dict[str, Callable[[Sequence[Trajectory]], float]] = {
    "collapse_rate": lambda debates: collapse_rate([t.answers for t in debates]),
}
#: training diagnostics of each run, ``metrics.jsonl`` key -> name: the mean over the run's iterations
TRAINING_DIAGNOSTICS = {
    "update/clip_frac": "clip_frac",
    "update/dual_clip_frac": "dual_clip_frac",
    "update/kl": "kl",
    "mismatch/abs_mean": "mismatch_abs_mean",
    "mismatch/kl": "mismatch_kl",
}
#: each agent's answer forms and echo rate, per method and seed (:func:`answer_forms`)
FORMS_FILE = "forms.csv"
#: the folder of results_dir that holds the tables of the records re-graded (``--grader current``)
REGRADED = "regraded"
#: the figure of the seeds' changes over Standard MAD (written when the seeds share their problems)
SEED_CHANGES_PLOT = "seed_changes.png"
#: the columns of runs.csv and of table.md's per-run table, after method and seed
RUN_COLUMNS = (
    "iterations",
    "train_accuracy_start",
    "train_accuracy_end",
    *TRAINING_DIAGNOSTICS.values(),
    "kl_last",
    "accuracy",
    "unparsed_rate",
    "collapse_rate",
    "cut_share",
    "words_per_answer",
)

Records = dict[tuple[str, int], RunRecord]
#: method -> [(seed, the debates of the evaluation that stands for the method in that seed)]
Evaluated = dict[str, list[tuple[int, list[Trajectory]]]]


def load_records(config: CompareConfig, grader: str = "recorded") -> tuple[Records, list[int], list[str]]:
    """(method, seed) -> record of every recorded trained run, its debates graded by ``grader``
    (:data:`udpo.study.regrade.GRADERS`); the seeds whose every trained run has a record (the seeds the
    tables cover); the runs that have none ("method seed s")."""
    records = {
        (m, s): RunRecord.load(config.record_dir(m, s), grader)
        for s in config.seeds
        for m in config.trained()
        if config.recorded(m, s)
    }
    seeds = [s for s in config.seeds if all((m, s) in records for m in config.trained())]
    missing = [f"{m} seed {s}" for s in config.seeds for m in config.trained() if (m, s) not in records]
    return records, seeds, missing


def evaluated(config: CompareConfig, records: Records, seeds: list[int]) -> Evaluated:
    """Trained methods at their final evaluation; standard_mad at iteration 0 of the first trained method."""
    first = config.trained()[0]
    return {
        method: [
            (s, records[(first, s)].evaluation(0))
            if METHODS[method] is None
            else (s, records[(method, s)].evaluation(records[(method, s)].final_eval))
            for s in seeds
        ]
        for method in config.methods
    }


def check_same_start(config: CompareConfig, records: Records, seeds: list[int]) -> None:
    """Without ``shared_start``, every trained method's iteration-0 evaluation of a seed must be the same
    debates (same questions, same untrained team, same draws): Standard MAD is read from them."""
    if config.shared_start:
        return
    for seed in seeds:
        seen = {m: question_metrics(records[(m, seed)].evaluation(0)) for m in config.trained()}
        first, ref = next(iter(seen.items()))
        for method, answers in seen.items():
            if answers != ref:
                raise ValueError(
                    f"seed {seed}: the iteration-0 evaluations of {first} and {method} differ; the methods did "
                    "not start from the same team on the same questions"
                )


def build_results(config: CompareConfig, grader: str = "recorded") -> tuple[dict[str, Any], Evaluated]:
    """Every number of the tables (results.json), and the evaluations they came from, every debate graded
    by ``grader`` (:data:`udpo.study.regrade.GRADERS`)."""
    from udpo.study.intervals import paired_bootstrap, seed_change

    records, seeds, missing = load_records(config, grader)
    if not seeds:
        raise ValueError(
            f"no seed has a record of every trained run in {config.results_path() / 'runs'}; missing: "
            + ", ".join(missing)
        )
    check_same_start(config, records, seeds)
    runs = evaluated(config, records, seeds)
    n = config.bootstrap_resamples
    start = [records[(config.trained()[0], s)].evaluation(0) for s in seeds]  # Standard MAD, per seed
    baseline = [question_metrics(debates) for debates in start]
    results: dict[str, Any] = {
        "grader": grader,
        "seeds": seeds,
        "missing": missing,
        "methods": {},
        "budget": [
            {"method": m, "seed": s, **records[(m, s)].budget} for m in config.trained() for s in seeds
        ],
        "runs": [run_row(records[(m, s)]) for m in config.trained() for s in seeds],
    }
    metrics = {method: [question_metrics(debates) for _, debates in rows] for method, rows in runs.items()}
    for method, rows in runs.items():
        per_seed = metrics[method]
        entry: dict[str, Any] = {}
        # every seed evaluated the same problems (eval_question_seed): the seeds x problems analysis; the
        # change's interval of questions alone would then treat the seeds x questions cells as independent
        shared = len({tuple(sorted(q)) for q in per_seed}) == 1
        if shared:  # questions posing one problem are resampled together
            texts = problems(rows[0][1])
            clusters = [texts[qid] for qid in sorted(per_seed[0])]
        for metric in PER_QUESTION_METRICS:
            after = [[q[qid][metric] for qid in sorted(q)] for q in per_seed]
            before = [[b[qid][metric] for qid in sorted(q)] for b, q in zip(baseline, per_seed, strict=True)]
            level = paired_bootstrap(
                [np.zeros(len(r)) for r in after], after, n_resamples=n, shared_questions=False
            )
            change = (
                None if shared else paired_bootstrap(before, after, n_resamples=n, shared_questions=False)
            )
            entry[metric] = {
                "mean": level.after,
                "low": level.low,
                "high": level.high,
                "per_seed": [float(np.mean(r)) for r in after],
                "change": level.after - float(np.mean([np.mean(r) for r in before])),
                "change_low": None if change is None else change.low,
                "change_high": None if change is None else change.high,
                "seed_change": seed_change(before, after, n_resamples=n, clusters=clusters).to_dict()
                if shared
                else None,
            }
        for metric, of in RUN_METRICS.items():
            after = [of(debates) for _, debates in rows]
            before = [of(debates) for debates in start]
            entry[metric] = {
                "mean": float(np.mean(after)),
                "per_seed": after,
                "change": float(np.mean(after) - np.mean(before)),
                "seed_change": seed_change(
                    [[b] for b in before], [[a] for a in after], n_resamples=n
                ).to_dict()
                if shared
                else None,
            }
        entry["n_questions"] = sum(len(q) for q in per_seed)
        results["methods"][method] = entry
    results["comparisons"] = arm_comparisons(config, runs, metrics, n)
    results["forms"] = answer_forms(config, records, runs)
    before_cut = cut_summary(d for debates in start for d in debates)
    results["cut_answers"] = {}
    for method, rows in runs.items():
        after_cut = cut_summary(d for _, debates in rows for d in debates)
        results["cut_answers"][method] = {
            "before": before_cut.to_dict(),
            "after": after_cut.to_dict(),
            "decomposition": None if METHODS[method] is None else length_decomposition(before_cut, after_cut),
        }
    return results, runs


def arm_comparisons(
    config: CompareConfig,
    runs: Evaluated,
    metrics: dict[str, list[dict[str, dict[str, float]]]],
    n_resamples: int,
) -> dict[str, dict[str, Any]]:
    """``"A - B"`` -> metric -> the seed analysis of arm A against arm B (:func:`seed_change` with B as
    "before"), for each pair of the plan's ``comparisons``: both arms' seeds share their problems and their
    evaluation draws, so each seed's difference is paired. ``metrics``: each arm's per-seed
    :func:`question_metrics` of ``runs``. Empty when the plan names none, or when the seeds' problems differ
    (no paired analysis then)."""
    from udpo.study.intervals import seed_change

    out: dict[str, dict[str, Any]] = {}
    for a, b in config.comparisons:
        per_a, per_b = metrics[a], metrics[b]
        if len({tuple(sorted(q)) for q in per_a + per_b}) != 1:
            continue
        qids = sorted(per_a[0])
        texts = problems(runs[a][0][1])
        out[f"{a} - {b}"] = {
            metric: seed_change(
                [[q[qid][metric] for qid in qids] for q in per_b],
                [[q[qid][metric] for qid in qids] for q in per_a],
                n_resamples=n_resamples,
                clusters=[texts[qid] for qid in qids],
            ).to_dict()
            for metric in TABLE_METRICS
        }
    return out


def answer_forms(config: CompareConfig, records: Records, runs: Evaluated) -> list[dict[str, Any]]:
    """One row per method, seed and agent: the share of each answer form and the echo rate
    (:mod:`udpo.env.answer_forms`) over every turn of the evaluation that stands for the method, each turn's
    text read again by the current parser of the run's task (the forms a record holds are the parser's of
    its day, and older records hold none); a record without its config keeps the forms it recorded, and one
    loaded with the ``current`` grader already carries the current parser's forms (read once, by
    :func:`udpo.study.regrade.regrade`)."""
    rows = []
    for method, evaluated_seeds in runs.items():
        for seed, debates in evaluated_seeds:
            record = records[(config.trained()[0] if METHODS[method] is None else method, seed)]
            if record.config is None or record.grader == "current":
                forms = [recorded_forms(d) for d in debates]
            else:
                task = record.task()
                forms = [regraded_forms(task, d) for d in debates]
            rows += [
                {"method": method, "seed": seed, "agent": agent, **shares}
                for agent, shares in forms_by_agent(forms).items()
            ]
    return rows


def forms_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The answer forms per method, seed and agent (:func:`answer_forms`), as a markdown table."""
    if not rows:
        return []
    lines = [
        "",
        'Answer forms (docs/metrics.md, "Answer forms and echo rate"), every agent\'s answer in every round of '
        "the evaluation that stands for the method, each turn read again by the current parser: the echo rate "
        "is the share of turns refused for restating the question; the forms are those of `udpo diagnose`.",
        "",
        "| method | seed | agent | turns | echo rate | forms |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        echo = "-" if row["echo_rate"] is None else f"{row['echo_rate']:.3f}"
        lines.append(
            f"| {row['method']} | {row['seed']} | {row['agent']} | {row['turns']} | {echo} | {forms_used(row)} |"
        )
    return lines


def run_row(record: RunRecord) -> dict[str, Any]:
    """One run's training diagnostics: the training accuracy of its first and last fifth of iterations,
    the mean over its iterations of each of :data:`TRAINING_DIAGNOSTICS` (None when never logged) and the
    last KL; its final evaluation's accuracy, unparsed rate and collapse rate."""
    train = record.metrics("train")

    def mean(key: str, rows: list[dict[str, Any]]) -> float | None:
        values = [r[key] for r in rows if isinstance(r.get(key), int | float)]
        return float(np.mean(values)) if values else None

    fifth = max(1, len(train) // 5)
    final = record.evaluation(record.final_eval)
    summary = {m: float(np.mean([f(t) for t in final])) for m, f in PER_QUESTION_METRICS.items()}
    cut = cut_summary(final)
    return {
        "method": record.method,
        "seed": record.seed,
        "iterations": record.budget["iterations"],
        "train_accuracy_start": mean("train/accuracy", train[:fifth]),
        "train_accuracy_end": mean("train/accuracy", train[-fifth:]),
        **{name: mean(key, train) for key, name in TRAINING_DIAGNOSTICS.items()},
        "kl_last": mean("update/kl", train[-1:]),
        "accuracy": summary["accuracy"],
        "unparsed_rate": summary["unparsed_rate"],
        **{m: of(final) for m, of in RUN_METRICS.items()},
        "cut_share": cut.cut_share,
        "words_per_answer": cut.to_dict()["words_per_answer"],
    }


def tables_path(config: CompareConfig, grader: str = "recorded") -> Path:
    """Where the tables of ``grader`` go: ``results_dir`` for the records as recorded, its
    :data:`REGRADED` folder for the records re-graded (beside the tables as recorded, which stay)."""
    return config.results_path() / REGRADED if check_grader(grader) == "current" else config.results_path()


def write_tables(config: CompareConfig) -> dict[str, Any]:
    """Build the results from the records as recorded (:func:`build_results`) and write every table and
    figure to ``results_dir`` (:func:`write_outputs`); returns the results. The re-graded tables:
    :func:`udpo.study.grader_comparison.write_regraded`."""
    results, runs = build_results(config)
    write_outputs(config.results_path(), results, runs)
    return results


def write_outputs(out: Path, results: dict[str, Any], runs: Evaluated) -> None:
    """Every table and figure of ``results`` (from the debates ``runs``) into the folder ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "results.json", results)
    (out / "table.md").write_text(markdown_table(results) + "\n")
    write_csv(out / "table.csv", results)
    changes = seed_changes(results)
    if changes:
        from udpo.study.seed_change_plot import seed_change_figure

        seed_change_figure(changes).savefig(out / SEED_CHANGES_PLOT, dpi=110)
    for name, rows in (("budget.csv", results["budget"]), ("runs.csv", results["runs"])):
        with (out / name).open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    with (out / FORMS_FILE).open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["method", "seed", "agent", "turns", "echo_rate", *FORMS])
        writer.writeheader()
        writer.writerows(results["forms"])
    diagnose_gains(out / "diagnosis", runs)


def markdown_table(results: dict[str, Any]) -> str:
    """Table 1: each metric's mean over seeds and 95% interval (questions resampled within each seed, the
    trained adapters held fixed), accuracy's change over Standard MAD and accuracy per seed; then, when
    every seed evaluated the same problems, each metric's change with the t-interval over seeds and the
    seeds x problems bootstrap (:func:`udpo.study.intervals.seed_change`), the pre-registered intervals;
    then each run's training diagnostics. (A results.json written before the per-run table and the
    collapse rate existed gives the tables it has the numbers for.)"""
    changes = seed_changes(results)
    head = (
        "| method | " + " | ".join(TABLE_METRICS) + " | accuracy change vs Standard MAD | accuracy per seed |"
    )
    lines = [head, "|---" * (len(TABLE_METRICS) + 3) + "|"]
    if results.get("grader") == "current":
        lines = [
            "Re-graded: every turn's answer read again from its committed text by the run's task, the final "
            "round voted again and each debate judged again (udpo.study.regrade); comparison.md sets these "
            "tables beside the tables as recorded.",
            "",
            *lines,
        ]
    for method, entry in results["methods"].items():
        cells = [
            f"{entry[m]['mean']:.3f} [{entry[m]['low']:.3f}, {entry[m]['high']:.3f}]" for m in TABLE_METRICS
        ]
        acc = entry["accuracy"]
        if METHODS[method] is None:
            change = "-"
        elif changes:  # its intervals are the seed analysis's, below
            change = f"{acc['change']:+.3f} (intervals: next table)"
        else:
            change = f"{acc['change']:+.3f} [{acc['change_low']:+.3f}, {acc['change_high']:+.3f}]"
        per_seed = ", ".join(f"{v:.3f}" for v in acc["per_seed"])
        lines.append(f"| {method} | " + " | ".join(cells) + f" | {change} | {per_seed} |")
    lines += [
        "",
        "Mean over seeds [95% interval resampling each seed's questions with its trained adapters held fixed: "
        "it leaves out how much another training run would differ]. "
        + (
            "The change's intervals over seeds and problems, the pre-registered analysis, are in the next "
            "table; no interval of the change is given here, since one resampling questions alone would treat "
            "the seeds x questions cells as independent."
            if changes
            else "Change: paired with Standard MAD on the same questions, the same resampling."
        ),
    ]
    if results.get("missing"):
        lines += ["", "Missing (no record, left out of every table): " + ", ".join(results["missing"]) + "."]
    if changes:
        per_run = any(m in RUN_METRICS for per_metric in changes.values() for m in per_metric)
        lines += [
            "",
            "Change over Standard MAD, seeds sharing their problems (docs/lab/preregistration.md): mean of the "
            "seeds' changes, 95% t-interval over seeds, 95% bootstrap over seeds and problems"
            + (" (over seeds alone for the collapse rate, one number per evaluation)." if per_run else "."),
            "",
            "| method | metric | change | t-interval over seeds | bootstrap seeds x problems | change per seed |",
            "|---|---|---|---|---|---|",
        ]
        for method, per_metric in changes.items():
            for metric, c in per_metric.items():
                per_seed = ", ".join(f"{v:+.3f}" for v in c["per_seed"])
                t = "one seed: none" if c["t_low"] is None else f"[{c['t_low']:+.3f}, {c['t_high']:+.3f}]"
                lines.append(
                    f"| {method} | {metric} | {c['delta']:+.3f} | {t} | "
                    f"[{c['boot_low']:+.3f}, {c['boot_high']:+.3f}] | {per_seed} |"
                )
    lines += comparison_lines(results.get("comparisons") or {})
    lines += cut_lines(results.get("cut_answers") or {})
    lines += forms_lines(results.get("forms") or [])
    if results.get("runs"):
        lines += [
            "",
            "Per run: training accuracy over the first and last fifth of the iterations; the mean over "
            "iterations of the clip fraction, the dual-clip fraction, the KL to the reference and the "
            "sampler/trainer mismatch (- where never logged), and the last KL; the final evaluation's "
            "accuracy, unparsed rate, collapse rate (agents more than half unparsed), share of answers cut by "
            "max_tokens and words per answer.",
            "",
            "| method | seed | " + " | ".join(RUN_COLUMNS) + " |",
            "|---" * (len(RUN_COLUMNS) + 2) + "|",
        ]
        for row in results["runs"]:
            cells = ["-" if row[c] is None else f"{row[c]:.4g}" for c in RUN_COLUMNS]
            lines.append(f"| {row['method']} | {row['seed']} | " + " | ".join(cells) + " |")
        lines += [
            "",
            "Per arm: each column of the per-run table, mean over the arm's seeds [lowest, highest of its seeds] (- where "
            "never logged). Described, not tested.",
            "",
            "| method | seeds | " + " | ".join(RUN_COLUMNS) + " |",
            "|---" * (len(RUN_COLUMNS) + 2) + "|",
        ]
        for method, arm in arm_summaries(results["runs"]).items():
            cells = [
                "-" if arm[c] is None else f"{arm[c]['mean']:.4g} [{arm[c]['low']:.4g}, {arm[c]['high']:.4g}]"
                for c in RUN_COLUMNS
            ]
            lines.append(f"| {method} | {arm['seeds']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def arm_summaries(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per method, its runs' count (``seeds``) and for each of :data:`RUN_COLUMNS` the mean, lowest and
    highest value over its runs (None where no run logged it)."""
    out: dict[str, dict[str, Any]] = {}
    for method in dict.fromkeys(row["method"] for row in runs):
        rows = [row for row in runs if row["method"] == method]
        arm: dict[str, Any] = {"seeds": len(rows)}
        for column in RUN_COLUMNS:
            values = [row[column] for row in rows if row[column] is not None]
            arm[column] = (
                {"mean": float(np.mean(values)), "low": min(values), "high": max(values)} if values else None
            )
        out[method] = arm
    return out


def comparison_lines(comparisons: dict[str, dict[str, Any]]) -> list[str]:
    """The plan's arm-against-arm comparisons: per metric the mean of the seeds' paired differences, the
    t-interval over seeds and the seeds x problems bootstrap."""
    if not comparisons:
        return []
    lines = [
        "",
        "Arm against arm (the plan's comparisons), each seed's two arms paired on the same problems and draws: "
        "mean of the seeds' differences, 95% t-interval over seeds, 95% bootstrap over seeds and problems.",
        "",
        "| comparison | metric | difference | t-interval over seeds | bootstrap seeds x problems | per seed |",
        "|---|---|---|---|---|---|",
    ]
    for name, per_metric in comparisons.items():
        for metric, c in per_metric.items():
            t = "one seed: none" if c["t_low"] is None else f"[{c['t_low']:+.3f}, {c['t_high']:+.3f}]"
            per_seed = ", ".join(f"{v:+.3f}" for v in c["per_seed"])
            lines.append(
                f"| {name} | {metric} | {c['delta']:+.3f} | {t} | [{c['boot_low']:+.3f}, {c['boot_high']:+.3f}]"
                f" | {per_seed} |"
            )
    return lines


def cut_lines(cut_answers: dict[str, dict[str, Any]]) -> list[str]:
    """Answers cut by max_tokens before and after, the accuracy of finished and cut answers, and how much of
    the change in answer accuracy the shift from cut to finished answers carries (udpo.study.cut)."""
    if not cut_answers:
        return []

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{x:.3f}"

    lines = [
        "",
        "Answer length (every agent's answer in every round, seeds pooled; before = Standard MAD): share cut "
        "by max_tokens, accuracy of finished and of cut answers; the change in answer accuracy split into the "
        "shift from cut to finished answers (composition) and the gain within each kind (within).",
        "",
        "| method | cut before | cut after | finished acc. before / after | cut acc. before / after | "
        "answer acc. change | composition | within |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for method, c in cut_answers.items():
        b, a, d = c["before"], c["after"], c["decomposition"]
        split = (
            ["-", "-", "-"]
            if d is None
            else [f"{d['change']:+.3f}", f"{d['composition']:+.3f}", f"{d['within']:+.3f}"]
        )
        lines.append(
            f"| {method} | {pct(b['cut_share'])} | {pct(a['cut_share'])} | "
            f"{pct(b['accuracy_finished'])} / {pct(a['accuracy_finished'])} | "
            f"{pct(b['accuracy_cut'])} / {pct(a['accuracy_cut'])} | " + " | ".join(split) + " |"
        )
    return lines


def seed_changes(results: dict[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    """trained method -> metric -> its seed analysis (``SeedChange.to_dict()``), for the metrics that have
    one (every seed evaluated the same problems); empty otherwise."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for method, entry in results["methods"].items():
        if METHODS[method] is None:
            continue
        per_metric = {
            m: entry[m]["seed_change"]
            for m in (*TABLE_METRICS, *RUN_METRICS)
            if entry.get(m, {}).get("seed_change")
        }
        if per_metric:
            out[method] = per_metric
    return out


def write_csv(path: Path, results: dict[str, Any]) -> None:
    """One row per method and metric: mean, interval, change and its interval (where one applies), per seed."""
    columns = ("mean", "low", "high", "change", "change_low", "change_high")
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["method", "metric", *columns, "per_seed"])
        for method, entry in results["methods"].items():
            for metric in (*PER_QUESTION_METRICS, *RUN_METRICS):
                if metric not in entry:
                    continue
                e = entry[metric]
                per_seed = " ".join(f"{v:.6g}" for v in e["per_seed"])
                writer.writerow([method, metric, *(e.get(c) for c in columns), per_seed])


def diagnose_gains(out: Path, runs: Evaluated) -> None:
    """``udpo diagnose`` of every method's evaluations into ``out``, seeds pooled (question ids prefixed
    with the seed, so each is paired within its seed): the gains over Standard MAD by U_sys level (Figure
    5). The pooled input files are written to ``out/pooled`` and removed afterwards."""
    from udpo.analysis.diagnose import diagnose
    from udpo.env.trajectory import TrajectoryWriter

    pooled = out / "pooled"
    shutil.rmtree(pooled, ignore_errors=True)
    files = []
    for method, rows in runs.items():
        path = pooled / f"{method}.jsonl"
        with TrajectoryWriter(path) as writer:
            for seed, debates in rows:
                writer.write([replace(t, question_id=f"s{seed}/{t.question_id}") for t in debates])
        files.append(str(path))
    labels = list(runs)
    try:
        diagnose(
            files, str(out), labels=labels, baseline="standard_mad" if "standard_mad" in labels else None
        )
    finally:
        shutil.rmtree(pooled, ignore_errors=True)
