"""``udpo compare --config PLAN.yaml``: ``udpo study PLAN.yaml`` under its earlier name (udpo.cli.study, udpo.study):
train Standard MAD, MAPPO, RMAAC, UDPO, its ablations and its correctness-reward baseline on the same
questions, budget and seeds, record each run, and tabulate them."""

from __future__ import annotations

import argparse

from udpo.cli.study import add_options


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compare",
        help="train several methods on the same budget and compare them (udpo study, by its earlier name)",
        description="Train and evaluate the methods of a compare config (standard_mad, mappo, rmaac, udpo, "
        "udpo_wo_intra, udpo_wo_inter, udpo_wo_sys, task_only, coin_control) on the same questions, budget "
        "and seeds; record each finished run in RESULTS_DIR/runs/ and write RESULTS_DIR/table.md and "
        "table.csv (accuracy, U_intra, U_inter, U_sys: mean over seeds and 95% interval), runs.csv, "
        "budget.csv and diagnosis/ (gains over Standard MAD by U_sys level). Runs that finished are kept; an "
        "interrupted one resumes from its latest checkpoint. The same as udpo study COMPARE.yaml.",
    )
    p.add_argument(
        "--config",
        dest="plan",
        required=True,
        metavar="COMPARE.yaml",
        help="compare config (recipes/compare/)",
    )
    add_options(p)
