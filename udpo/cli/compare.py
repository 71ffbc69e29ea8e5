"""``udpo compare``: train Standard MAD, MAPPO, RMAAC, UDPO, its ablations and its correctness-reward baseline
on the same questions, budget and seeds, and tabulate them (udpo.analysis.compare)."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compare",
        help="train several methods on the same budget and compare them",
        description="Train and evaluate the methods of a compare config (standard_mad, mappo, rmaac, udpo, "
        "udpo_wo_intra, udpo_wo_inter, udpo_wo_sys, task_only) on the same questions, budget and seeds; write "
        "OUTPUT_DIR/table.md and table.csv (accuracy, U_intra, U_inter, U_sys: mean over seeds and 95% "
        "interval), budget.csv and diagnosis/ (gains over Standard MAD by U_sys level). Runs that finished "
        "are kept; an interrupted one resumes from its latest checkpoint.",
    )
    p.add_argument(
        "--config", required=True, metavar="COMPARE.yaml", help="compare config (recipes/compare/)"
    )
    p.add_argument("--output-dir", "--output_dir", default=None, help="instead of the config's output_dir")
    p.add_argument(
        "--seed",
        type=int,
        action="append",
        default=None,
        help="train only this seed's runs (repeatable); the tables are written once every seed's runs "
        "are done. Several compare processes share the work without it: each trains the runs no other "
        "process is training",
    )
    p.add_argument(
        "--status", action="store_true", help="show which runs are done, started or waiting, then exit"
    )
    p.add_argument(
        "--tables-only", action="store_true", help="write the tables from the finished runs; train nothing"
    )
    p.add_argument(
        "--no-progress", "--no_progress", dest="progress", action="store_false", help="hide progress bars"
    )
    p.set_defaults(func=run, check=check)


def check(args: argparse.Namespace):
    """Read and check the compare config (and every method's training config) before torch loads."""
    from udpo.analysis.compare import CompareConfig, check_budgets

    config = CompareConfig.load(args.config)
    if args.output_dir:
        config.output_dir = args.output_dir
    for seed in config.seeds:
        configs = {m: config.train_config(m, seed) for m in config.trained()}
        check_budgets(configs)
        first = configs[config.trained()[0]]
        if not (first.eval_questions and first.eval_at_start):
            raise ValueError(
                "compare needs eval_questions > 0 and eval_at_start: true (Standard MAD is iteration 0)"
            )
    return config


def run(args: argparse.Namespace) -> int:
    from udpo.analysis.compare import format_progress, markdown_table, run_compare, write_results

    config = check(args)
    if args.status:
        print("\n".join(format_progress(config)))
        return 0
    if args.tables_only:
        results = write_results(config)
    else:
        results = run_compare(config, progress=args.progress, seeds=args.seed)
    if results is None:
        print(
            "\n".join(
                [
                    "some runs are not done yet (other seeds, or trained by another process); the tables "
                    "follow when the last of them finishes:",
                    *format_progress(config),
                ]
            )
        )
        return 0
    print(markdown_table(results))
    print(f"wrote {config.output_dir}/table.md, table.csv, budget.csv, results.json and diagnosis/")
    return 0
