"""``udpo study PLAN.yaml``: run a pre-registered plan's runs (one or several processes), record each run
as it finishes in the plan's committed results folder, and build every table and figure from those
records. This module parses the command line; the study layer does the work (:func:`udpo.study.study`)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from udpo import gpu_share
from udpo.cli.argtypes import gpu_memory_share, positive_int, probability
from udpo.study.regrade import GRADERS
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
        "--ray",
        nargs="?",
        const="auto",
        default=None,
        metavar="auto|local|ADDRESS",
        help="run each run as a Ray task on a cluster (default auto: the one running; local: start one here, "
        "on 127.0.0.1), with the plan's resources per run; the driver writes each record as its run "
        "returns, and the logs to OUTPUT_DIR/logs/ (docs/ray.md)",
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
        "--grader",
        choices=GRADERS,
        default="current",
        help="how --tables-only, --sample-size and --second-stage grade the records: current (default) reads "
        "every turn's answer again from its text with today's grader and votes again, and writes the tables "
        "to RESULTS_DIR/regraded/ with comparison.md (the tables as recorded beside them); recorded takes the "
        "answers, votes and correctness as the runs recorded them and writes to RESULTS_DIR (the tables a "
        "study committed)",
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
        "--second-stage",
        action="store_true",
        help="the plan's second_stage rule on the recorded runs, blind to the arms: the seeds per arm for the "
        "rest of the study, as one line to commit",
    )
    p.add_argument(
        "--check",
        dest="headroom_check",
        action="store_true",
        help="train nothing: debate the plan's training questions with the untrained team, several times "
        "each at the plan's temperature (the plan's headroom: block), print the headroom (accuracy, "
        "questions sometimes right, the sharpening ceiling, cut and unparsed answers, the pace) and write "
        "RESULTS_DIR/headroom.json, the file a plan with headroom bounds needs committed before it trains; "
        "exits 1 when a bound is missed",
    )
    p.add_argument(
        "--no-progress", "--no_progress", dest="progress", action="store_false", help="hide progress bars"
    )
    p.set_defaults(func=run, check=check)


def check(args: argparse.Namespace):
    """Read and check the plan (and every method's training config) before torch loads."""
    from udpo.study import load_plan

    config = load_plan(args.plan, args.output_dir)
    modes = (args.status, args.tables_only, args.sample_size, args.second_stage, args.headroom_check)
    trains = "--workers" if args.workers > 1 else "--ray" if args.ray is not None else None
    if trains and any(modes):
        raise ValueError(
            f"{trains} trains; --status, --tables-only, --sample-size, --second-stage and --check do not"
        )
    if args.ray is not None and (args.workers > 1 or args.threads or args.gpu_memory_share):
        raise ValueError(
            "--ray places each run with the plan's resources: no --workers, --threads or --gpu-memory-share"
        )
    if args.threads is not None and args.workers == 1:  # this process trains: set before torch starts
        os.environ[ENV] = str(args.threads)
    if args.gpu_memory_share is not None and args.workers == 1:  # this process's trainers read it
        os.environ.update(gpu_share.environment(args.gpu_memory_share))
    return config


def run(args: argparse.Namespace) -> int:
    from udpo.study import study

    if args.headroom_check:
        from udpo.study.headroom import HEADROOM_FILE, describe, run_check

        config = check(args)
        result = run_check(config, args.plan)
        print(describe(result))
        print(f"wrote {config.results_path() / HEADROOM_FILE} (commit it with the plan)")
        return 1 if result["violations"] else 0

    extra = [*(["--output-dir", args.output_dir] if args.output_dir else [])]
    extra += [f"--seed={s}" for s in args.seed or []]
    return study(
        check(args),
        status=args.status,
        tables_only=args.tables_only,
        grader=args.grader,
        sample_size=args.sample_size,
        second_stage=args.second_stage,
        workers=args.workers,
        worker_command=study_command(args.plan, extra),
        threads=args.threads,
        gpu_memory_share=args.gpu_memory_share,
        seeds=args.seed,
        progress=args.progress,
        ray=args.ray,
    )


def study_command(plan: str, extra: Sequence[str] = ()) -> list[str]:
    """The command line of one worker of ``--workers K``: ``udpo study PLAN --no-progress *extra`` in this
    interpreter."""
    return [sys.executable, "-m", "udpo.cli", "study", plan, "--no-progress", *extra]
