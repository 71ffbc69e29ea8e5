"""``udpo diagnose``: uncertainty statistics and plots of debate runs (docs/metrics.md,
"``udpo diagnose``")."""

from __future__ import annotations

import argparse

from udpo.analysis.diagnose import diagnose, format_woozle
from udpo.analysis.diagnose_run import trajectory_file
from udpo.env.answer_forms import format_forms
from udpo.env.tasks import TASK_NAMES, get_task

from .argtypes import probability


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "diagnose",
        help="test whether uncertainty predicts failure in debate runs",
        description="Compute U_intra, U_inter, U_sys and DiverseAgentEntropy of every debate in one or more runs and write "
        "OUT/summary.json, CSV tables and PNG plots: failure-vs-success tests, correlations, selective "
        "prediction, woozle metrics of hallucination propagation per round (MA, MR, IMR, CR), each agent's "
        "answer forms and echo rate, and (with several runs) accuracy gains over the baseline by U_sys bin.",
    )
    p.add_argument(
        "runs",
        nargs="+",
        metavar="RUN",
        help="run folder holding trajectories.jsonl, or a .jsonl file",
    )
    p.add_argument("--out", required=True, help="output folder (tables and plots; not a run)")
    p.add_argument(
        "--labels",
        default=None,
        help="comma-separated run labels, one per RUN (default: folder or file name)",
    )
    p.add_argument(
        "--baseline-run",
        default=None,
        help="label of the Standard MAD run for stratified gains (default: a run labelled mad or "
        "standard_mad, else the first run)",
    )
    p.add_argument(
        "--lam", type=probability, default=0.5, help="weight of the flip rate in U_intra (default: 0.5)"
    )
    p.add_argument("--no-plots", action="store_true", help="write only summary.json and the CSV tables")
    p.add_argument(
        "--regrade-forms",
        default=None,
        choices=TASK_NAMES,
        metavar="TASK",
        help="read each turn's answer form again from its text and question with TASK's current parser "
        "(for records written before forms were recorded, or by an older parser) instead of the forms "
        f"recorded; one of {', '.join(TASK_NAMES)}",
    )
    p.set_defaults(func=run, check=check)


def check(args: argparse.Namespace) -> list[str] | None:
    """The checks made before torch loads (the CLI runs it first; ``run`` repeats it): every RUN is a
    trajectory file or a run folder holding one, one label per RUN. Returns the labels (None: default)."""
    for run_path in args.runs:
        trajectory_file(run_path)
    labels = [s.strip() for s in args.labels.split(",")] if args.labels else None
    if labels is not None and len(labels) != len(args.runs):
        raise ValueError(f"--labels: got {len(labels)} labels for {len(args.runs)} runs")
    return labels


def run(args: argparse.Namespace) -> int:
    labels = check(args)
    summary = diagnose(
        args.runs,
        args.out,
        labels=labels,
        baseline=args.baseline_run,
        lam=args.lam,
        plots=not args.no_plots,
        regrade=get_task(args.regrade_forms) if args.regrade_forms else None,
    )
    print(f"{'run':<20} {'debates':>8} {'accuracy':>9} {'U_intra':>8} {'U_inter':>8} {'U_sys':>8} {'DAE':>8}")
    for label, s in summary["runs"].items():
        print(
            f"{label:<20} {s['n_debates']:>8} {s['accuracy']:>9.3f} "
            f"{s['u_intra']:>8.3f} {s['u_inter']:>8.3f} {s['u_sys']:>8.3f} {s['dae']:>8.3f}"
        )
    print("woozle metrics (MA: rounds 0..T; MR, IMR, CR: rounds 1..T)")
    print(format_woozle(summary))
    regraded = " (read again by the current parser)" if args.regrade_forms else ""
    print(f"answer forms and echo rate per agent, all rounds{regraded}")
    for label, s in summary["runs"].items():
        print(f"{label}\n{format_forms(s['forms'])}")
    print(f"wrote {len(summary['files'])} files to {args.out} (summary.json, CSV tables, plots)")
    return 0
