"""A study's tables as recorded against its tables re-graded (``udpo study PLAN --tables-only --grader
current`` writes ``results_dir/regraded/comparison.md``).

:func:`compare_graders` takes the results of both graders (:func:`udpo.study.tables.build_results`) and
the debates they came from, in the same order, and gives: each arm's accuracy before and after re-grading;
each trained arm's accuracy change over Standard MAD and each of the plan's comparisons under both; the
plan's second-stage rule under both (when the plan has one); and how many graded turns and debate votes
changed between right and wrong, the votes split into those whose final answers were read the same (the
vote's tie rule alone changed them) and the others.
"""

from __future__ import annotations

from typing import Any

from udpo.env.answer_forms import debate_question
from udpo.env.tasks.base import Task
from udpo.env.trajectory import Trajectory
from udpo.study.plan import METHODS, CompareConfig
from udpo.study.sample_size import second_stage
from udpo.study.tables import Evaluated, build_results, load_records, tables_path, write_outputs

#: in the re-graded tables' folder, the tables as recorded against the re-graded ones
COMPARISON_FILE = "comparison.md"


def write_regraded(config: CompareConfig) -> dict[str, Any]:
    """The tables of ``config``'s records re-graded (:func:`build_results` with the ``current`` grader),
    written to ``results_dir/regraded/`` (:func:`udpo.study.tables.tables_path`) with
    :data:`COMPARISON_FILE`, their comparison with the tables as recorded (also in results.json,
    ``grader_comparison``); returns the re-graded results."""
    results, runs = build_results(config, "current")
    recorded, recorded_runs = build_results(config, "recorded")
    comparison = compare_graders(config, recorded, recorded_runs, results, runs)
    results["grader_comparison"] = comparison
    out = tables_path(config, "current")
    write_outputs(out, results, runs)
    (out / COMPARISON_FILE).write_text(comparison_markdown(comparison) + "\n")
    return results


def compare_graders(
    config: CompareConfig,
    recorded: dict[str, Any],
    recorded_runs: Evaluated,
    current: dict[str, Any],
    current_runs: Evaluated,
) -> dict[str, Any]:
    """The comparison of the tables as recorded (``recorded``, from ``recorded_runs``) with the re-graded
    ones (``current``, from ``current_runs``): see the module docstring."""
    records, _, _ = load_records(config)
    arms = {}
    for method in recorded["methods"]:
        before, after = recorded["methods"][method]["accuracy"], current["methods"][method]["accuracy"]
        arms[method] = {
            "recorded": {k: before[k] for k in ("mean", "low", "high", "per_seed")},
            "current": {k: after[k] for k in ("mean", "low", "high", "per_seed")},
            "change": after["mean"] - before["mean"],
        }
    vs_untrained = {
        method: {
            "recorded": recorded["methods"][method]["accuracy"]["seed_change"],
            "current": current["methods"][method]["accuracy"]["seed_change"],
        }
        for method in recorded["methods"]
        if METHODS[method] is not None and recorded["methods"][method]["accuracy"].get("seed_change")
    }
    comparisons = {
        name: {"recorded": per_metric["accuracy"], "current": current["comparisons"][name]["accuracy"]}
        for name, per_metric in (recorded.get("comparisons") or {}).items()
    }
    changes = []
    for method, rows in recorded_runs.items():
        owner = config.trained()[0] if METHODS[method] is None else method
        for (seed, before), (_, after) in zip(rows, current_runs[method], strict=True):
            task = records[(owner, seed)].task()
            changes.append({"method": method, "seed": seed, **changed_grades(task, before, after)})
    totals = {k: sum(row[k] for row in changes) for k in changes[0] if k not in ("method", "seed")}
    stage = (
        {grader: second_stage(config, grader)[1] for grader in ("recorded", "current")}
        if config.second_stage is not None
        else None
    )
    return {
        "arms": arms,
        "vs_untrained": vs_untrained,
        "comparisons": comparisons,
        "second_stage": stage,
        "changes": changes,
        "totals": totals,
    }


def changed_grades(task: Task, before: list[Trajectory], after: list[Trajectory]) -> dict[str, int]:
    """Between the recorded debates ``before`` and the same debates re-graded ``after``: the turns graded,
    those right as recorded and wrong re-graded (``turns_lost``) and the reverse (``turns_gained``); the
    same for the debates' votes, and of the votes lost those whose final answers were all read the same
    (``votes_lost_tie_rule``: the vote's tie rule alone changed them), and the same of the votes gained
    (``votes_gained_tie_rule``)."""
    out = dict.fromkeys(
        (
            "turns",
            "turns_lost",
            "turns_gained",
            "votes",
            "votes_lost",
            "votes_gained",
            "votes_lost_tie_rule",
            "votes_gained_tie_rule",
        ),
        0,
    )
    for old, new in zip(before, after, strict=True):
        question = debate_question(old)
        for old_row, new_row in zip(old.turns, new.turns, strict=True):
            for a, b in zip(old_row, new_row, strict=True):
                was, now = task.is_correct(a.answer, question), task.is_correct(b.answer, question)
                out["turns"] += 1
                out["turns_lost"] += was and not now
                out["turns_gained"] += now and not was
        out["votes"] += 1
        out["votes_lost"] += old.correct and not new.correct
        out["votes_gained"] += new.correct and not old.correct
        same_answers = [row[-1] for row in old.answers] == [row[-1] for row in new.answers]
        out["votes_lost_tie_rule"] += old.correct and not new.correct and same_answers
        out["votes_gained_tie_rule"] += new.correct and not old.correct and same_answers
    return out


def _interval(low: float | None, high: float | None) -> str:
    return "none" if low is None else f"[{low:+.3f}, {high:+.3f}]"


def _change_cells(c: dict[str, Any]) -> str:
    return f"{c['delta']:+.3f} | {_interval(c['t_low'], c['t_high'])} | {_interval(c['boot_low'], c['boot_high'])}"


def comparison_markdown(comparison: dict[str, Any]) -> str:
    """:func:`compare_graders` as markdown: the tables as recorded beside the re-graded ones."""
    lines = [
        "Accuracy as recorded (the grader and vote of the runs' day) and re-graded (every turn's answer read "
        "again from its text by the run's task, the final round voted again, each debate judged again): mean "
        "over seeds [95% interval resampling each seed's questions].",
        "",
        "| method | as recorded | re-graded | change | per seed as recorded | per seed re-graded |",
        "|---|---|---|---|---|---|",
    ]
    for method, arm in comparison["arms"].items():
        r, c = arm["recorded"], arm["current"]
        lines.append(
            f"| {method} | {r['mean']:.3f} [{r['low']:.3f}, {r['high']:.3f}] | "
            f"{c['mean']:.3f} [{c['low']:.3f}, {c['high']:.3f}] | {arm['change']:+.3f} | "
            + ", ".join(f"{v:.3f}" for v in r["per_seed"])
            + " | "
            + ", ".join(f"{v:.3f}" for v in c["per_seed"])
            + " |"
        )
    paired = [(f"{m} - standard_mad", c) for m, c in comparison["vs_untrained"].items()]
    paired += list(comparison["comparisons"].items())
    if paired:
        lines += [
            "",
            "Accuracy differences, each seed paired (a trained arm against the untrained team, and the plan's "
            "comparisons): mean of the seeds' differences, 95% t-interval over seeds, 95% bootstrap over seeds "
            "and problems, as recorded and re-graded.",
            "",
            "| difference | grader | mean | t-interval over seeds | bootstrap seeds x problems | per seed |",
            "|---|---|---|---|---|---|",
        ]
        for name, both in paired:
            for grader, label in (("recorded", "as recorded"), ("current", "re-graded")):
                c = both[grader]
                per_seed = ", ".join(f"{v:+.3f}" for v in c["per_seed"])
                lines.append(f"| {name} | {label} | {_change_cells(c)} | {per_seed} |")
    if comparison.get("second_stage"):
        lines += [
            "",
            "The plan's second-stage rule (`udpo study PLAN --second-stage --grader recorded|current`):",
            "",
            f"- as recorded: {comparison['second_stage']['recorded']}",
            f"- re-graded: {comparison['second_stage']['current']}",
        ]
    t = comparison["totals"]
    lines += [
        "",
        f"Graded turns (every agent, every round, of the evaluations above): {t['turns']}; right as recorded "
        f"and wrong re-graded: {t['turns_lost']}; wrong as recorded and right re-graded: {t['turns_gained']}. "
        f"Debate votes: {t['votes']}; right as recorded and wrong re-graded: {t['votes_lost']} (of which "
        f"{t['votes_lost_tie_rule']} with every final answer read the same: the tie rule alone); wrong as "
        f"recorded and right re-graded: {t['votes_gained']} (of which {t['votes_gained_tie_rule']} by the tie rule "
        "alone).",
        "",
        "| method | seed | turns lost | turns gained | votes lost | of them by the tie rule alone | "
        "votes gained | of them by the tie rule alone |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in comparison["changes"]:
        lines.append(
            f"| {row['method']} | {row['seed']} | {row['turns_lost']} | {row['turns_gained']} | "
            f"{row['votes_lost']} | {row['votes_lost_tie_rule']} | {row['votes_gained']} | "
            f"{row['votes_gained_tie_rule']} |"
        )
    return "\n".join(lines)
