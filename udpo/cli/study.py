"""``udpo study PLAN.yaml``: run a pre-registered plan's runs (one or several processes), record each run
as it finishes in the plan's committed results folder, and build every table and figure from those
records (udpo.analysis.compare, udpo.analysis.study_tables; its worker processes: udpo.cli.study_workers)."""

from __future__ import annotations

import argparse
import os

from udpo import gpu_share
from udpo.cli.argtypes import gpu_memory_share, positive_int, probability
from udpo.threads import ENV


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "study",
        help="run a study plan's runs, record each as it finishes, and tabulate them",
        description="Train and evaluate the methods x seeds of a plan (a compare config: recipe, methods, "
        "seeds, output_dir, results_dir, ...). Each finished run's evaluations, metrics and calibration are "
        "written, compressed, to RESULTS_DIR/runs/<method>_seed<s>/, a folder meant to be committed; the "
        "tables (table.md, table.csv, runs.csv, budget.csv, results.json, seed_changes.png, diagnosis/) are "
        "built from those records alone. A run with a record is done; an interrupted one resumes from its "
        "latest checkpoint when the same command runs again.",
    )
    p.add_argument("plan", metavar="PLAN.yaml", help="the study plan (recipes/study/, recipes/compare/)")
    add_options(p)


def add_options(p: argparse.ArgumentParser) -> None:
    """The options ``udpo study`` and ``udpo compare`` share."""
    p.add_argument("--output-dir", "--output_dir", default=None, help="instead of the plan's output_dir")
    p.add_argument(
        "--seed",
        type=int,
        action="append",
        default=None,
        help="train only this seed's runs (repeatable); the tables are written once every seed's runs "
        "are recorded. Several processes share the work without it: each trains the runs no other "
        "process is training",
    )
    p.add_argument(
        "--workers",
        type=positive_int,
        default=1,
        help="processes sharing the runs (default 1); each logs to OUTPUT_DIR/logs/worker_<k>.log",
    )
    p.add_argument(
        "--threads",
        type=positive_int,
        default=None,
        help="torch threads per worker (default: the cores divided among the workers); workers whose "
        "threads fit on the cores are pinned to cores of their own",
    )
    p.add_argument(
        "--gpu-memory-share",
        type=gpu_memory_share,
        default=None,
        metavar="S",
        help="share of one GPU's memory each worker may use, in (0, 1] (default with --workers K: 1/K, or "
        "UDPO_GPU_MEMORY_SHARE): the workers share the device, each capped at its share "
        "(torch.cuda.set_per_process_memory_fraction) and sizing its update within it; ignored on a CPU",
    )
    p.add_argument(
        "--status", action="store_true", help="show which runs are done, started or waiting, then exit"
    )
    p.add_argument(
        "--tables-only",
        action="store_true",
        help="build every table and figure from the runs' records (RESULTS_DIR/runs/) alone; train nothing",
    )
    p.add_argument(
        "--sample-size",
        type=probability,
        default=None,
        metavar="EFFECT",
        help="from the recorded runs, the pooled within-arm sd of the per-seed accuracy change and the seeds "
        "per arm a two-sided 95%% t-test needs to find a difference EFFECT with 80%% power; blind: no arm's "
        "mean is shown",
    )
    p.add_argument(
        "--no-progress", "--no_progress", dest="progress", action="store_false", help="hide progress bars"
    )
    p.set_defaults(func=run, check=check)


def check(args: argparse.Namespace):
    """Read and check the plan (and every method's training config) before torch loads."""
    from udpo.analysis.compare import CompareConfig, check_budgets

    config = CompareConfig.load(args.plan)
    if args.output_dir:
        config.output_dir = args.output_dir
    for seed in config.seeds:
        configs = {m: config.train_config(m, seed) for m in config.trained()}
        check_budgets(configs)
        first = configs[config.trained()[0]]
        if not (first.eval_questions and first.eval_at_start):
            raise ValueError(
                "a study needs eval_questions > 0 and eval_at_start: true (Standard MAD is iteration 0)"
            )
    if args.workers > 1 and (args.status or args.tables_only or args.sample_size):
        raise ValueError("--workers trains; --status, --tables-only and --sample-size do not")
    if args.threads is not None and args.workers == 1:  # this process trains: set before torch starts
        os.environ[ENV] = str(args.threads)
    if args.gpu_memory_share is not None and args.workers == 1:  # this process's trainers read it
        os.environ.update(gpu_share.environment(args.gpu_memory_share))
    return config


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from udpo.analysis.compare import format_progress, run_compare, write_results
    from udpo.analysis.study_tables import markdown_table

    config = check(args)
    if args.status:
        print("\n".join(format_progress(config)))
        return 0
    if args.sample_size:
        from udpo.analysis.sample_size import blind_sample_size

        rule = blind_sample_size(config, args.sample_size)
        print(
            f"per-seed {rule.metric} change over Standard MAD, arms {', '.join(rule.arms)}, seeds "
            f"{', '.join(map(str, rule.seeds))}: pooled within-arm sd {rule.pooled_sd:.4f}; a difference of "
            f"{rule.effect:g} at a two-sided {rule.level:.0%} t-test with {rule.power:.0%} power needs "
            f"{rule.seeds_per_arm} seeds per arm"
        )
        return 0
    if args.workers > 1:
        from udpo.cli.study_workers import plan_workers, run_workers, study_command

        extra = [*(["--output-dir", args.output_dir] if args.output_dir else [])]
        extra += [f"--seed={s}" for s in args.seed or []]
        workers = plan_workers(args.workers, args.threads, share=args.gpu_memory_share)
        code = run_workers(study_command(args.plan, extra), workers, Path(config.output_dir) / "logs")
        print("\n".join(format_progress(config)))
        done = all(config.recorded(m, s) for s in config.seeds for m in config.trained())
        if code == 0 and done and config.tables_when_done:
            print((config.results_path() / "table.md").read_text())
        return code
    if args.tables_only:
        results = write_results(config)
    else:
        results = run_compare(config, progress=args.progress, seeds=args.seed)
    if results is None:
        done = all(config.recorded(m, s) for s in config.seeds for m in config.trained())
        print(
            "every run is recorded; tables_when_done is false: no table written (--tables-only writes them)"
            if done
            else "\n".join(
                [
                    "some runs are not done yet (other seeds, or trained by another process); the tables "
                    "follow when the last of them is recorded:",
                    *format_progress(config),
                ]
            )
        )
        return 0
    print(markdown_table(results))
    print(
        f"wrote {config.results_path()}: table.md, table.csv, runs.csv, budget.csv, results.json, diagnosis/"
    )
    return 0
