"""Benchmark: a study plan, shortened, run by ``udpo study --workers K``: its wall time.

    python benchmarks/study_plan.py --model PATH [--plan recipes/compare/proof.yaml] [--workers 2]
        [--seeds 0] [--iterations 3] [--eval-questions 32] [--out DIR] [KEY VALUE ...]

Writes a copy of ``--plan`` (its recipe, methods, settings) with its seeds cut to ``--seeds``, every run to
``--iterations`` iterations and ``--eval-questions`` held-out questions, on ``--model`` (extra ``KEY VALUE``
pairs are further training settings), and runs it as a user would: ``udpo study PLAN --workers K`` (on one
GPU the K workers share it, each with 1/K of its memory: docs/training.md, "Many runs on one GPU"). Prints
the plan's wall time, from the command's start to its tables, and each run's median iteration after the
first (from its ``metrics.jsonl``), so that the full plan's time can be estimated from the same machine;
on a GPU also each run's peak memory beside each worker's share of the card.
``--out DIR`` keeps the folders (default: a temporary folder).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from multiprocess import iteration_figures, train_records  # noqa: E402  (benchmarks/multiprocess.py)


def shortened_plan(plan: Path, out: Path, args: argparse.Namespace) -> Path:
    """``plan`` with fewer seeds, iterations and held-out questions, on ``args.model``: written to ``out``."""
    from udpo.study import CompareConfig

    config = CompareConfig.load(plan)
    extra = dict(zip(args.extra[::2], args.extra[1::2], strict=True))
    settings = {
        **config.settings,
        "model": str(Path(args.model).resolve()) if Path(args.model).exists() else args.model,
        "max_iterations": args.iterations,
        "save_steps": args.iterations,
        "eval_questions": args.eval_questions,
        "progress": False,
        **{k: yaml.safe_load(v) for k, v in extra.items()},
    }
    values = {
        "recipe": str(Path(config.recipe).resolve()),
        "methods": config.methods,
        "seeds": args.seeds,
        "output_dir": str(out / "runs"),
        "results_dir": str(out / "results"),
        "settings": settings,
        "method_settings": config.method_settings,
        "shared_start": config.shared_start,
        "bootstrap_resamples": 200,  # the tables' machinery, not their numbers
    }
    path = out / "plan.yaml"
    path.write_text(yaml.safe_dump(values, sort_keys=False))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", required=True, help="model folder or name every run trains")
    parser.add_argument("--plan", default="recipes/compare/proof.yaml", help="the study plan to shorten")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--eval-questions", type=int, default=32)
    parser.add_argument(
        "--out", help="keep the plan, run and results folders here (default: a temporary one)"
    )
    parser.add_argument(
        "--json", help="also write the figures to this file (benchmarks/gpu_targets.py reads it)"
    )
    parser.add_argument("extra", nargs="*", help="KEY VALUE pairs: further training settings")
    args = parser.parse_args()
    if len(args.extra) % 2:
        parser.error("extra settings come in KEY VALUE pairs")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.out or tmp).resolve()
        out.mkdir(parents=True, exist_ok=True)
        plan = shortened_plan(REPO / args.plan, out, args)
        command = [sys.executable, "-m", "udpo.cli", "study", str(plan), "--workers", str(args.workers)]
        start = time.perf_counter()
        result = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
        wall = time.perf_counter() - start
        print("\n".join(line for line in result.stdout.splitlines() if line.startswith("worker ")))
        failure = None
        if result.returncode != 0:  # the runs' figures so far are still written, with the error
            logs = sorted((out / "runs" / "logs").glob("worker_*.log"))
            tails = "\n".join(f"--- {log}\n{log.read_text()[-2000:]}" for log in logs)
            failure = f"udpo study failed ({result.returncode}):\n{result.stderr[-2000:]}\n{tails}"
        runs = sorted(
            p.parent for p in (out / "runs").glob("*/seed_*/metrics.jsonl") if train_records(p.parent)
        )
        medians = {}
        for run in runs:
            train = train_records(run)[1:] or train_records(run)
            figures = medians[f"{run.parent.name} {run.name}"] = iteration_figures(train)
            print(
                f"{run.parent.name} {run.name}: median iteration {figures['iteration']:.2f} s (rollout "
                f"{figures['rollout']:.2f}, update {figures['update']:.2f})"
            )
        print(
            f"study plan {args.plan}, shortened: {len(runs)} runs x {args.iterations} iterations, "
            f"{args.eval_questions} held-out questions, {args.workers} workers: wall time {wall:.1f} s"
        )
        # GPUs: each run's most memory, over all its iterations (the first, which compiles, too)
        every = {f"{run.parent.name} {run.name}": iteration_figures(train_records(run)) for run in runs}
        peaks = {name: figures["peak_gib"] for name, figures in every.items() if "peak_gib" in figures}
        share_gib = None
        if peaks:
            import torch

            share_gib = torch.cuda.get_device_properties(0).total_memory / 2**30 / args.workers
            print(f"each run's peak GPU memory (GiB): {peaks}; each worker's share: {share_gib:.1f} GiB")
        if args.json:
            record = {
                "peaks_gib": peaks,
                "share_gib": share_gib,
                "plan": args.plan,
                "runs": len(runs),
                "iterations": args.iterations,
                "workers": args.workers,
                "eval_questions": args.eval_questions,
                "wall_s": wall,
                "medians": medians,
                **({"error": failure[-1000:]} if failure else {}),
            }
            Path(args.json).write_text(json.dumps(record, indent=2))
        if failure:
            raise SystemExit(failure)


if __name__ == "__main__":
    main()
