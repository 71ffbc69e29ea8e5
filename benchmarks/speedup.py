"""Benchmark: this checkout against an earlier commit on the study's own workloads, side by side in one run.

    python benchmarks/speedup.py                        # against BASELINE (before the CPU throughput work)
    python benchmarks/speedup.py --baseline HEAD~3 --only iteration --iterations 4 --threads 2

Two workloads, each run by the baseline and by this checkout with the same threads, one after the other
(never together: on a small machine they would share its cores):

- an iteration of ``recipes/study/arithmetic_n3.yaml`` (warm-up calibration, then ``--iterations``
  iterations without evaluations): the median iteration's seconds, its rollout and update split and the
  rollout's tokens/s, from the run's ``metrics.jsonl`` (the first iteration is left out: it warms up);
- a held-out evaluation: ``udpo debate`` over ``--questions`` test questions with the study recipe's
  debate settings (3 agents, 1 round, 40 tokens, temperature 0.7, seed 0); wall seconds, accuracy.

Each side runs with its own defaults (the dtype, the batch size of ``udpo debate``), which is what a user
of either commit gets. The baseline is installed from a git worktree into a temporary folder (``pip
install --no-deps --target``, this environment's dependencies), so the two run the same libraries. Prints
each number and the ratio baseline / this checkout; ``--json`` keeps them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from udpo.env.run_folder import RunFolder

REPO = Path(__file__).resolve().parents[1]
#: the commit before the CPU throughput work: fp32 on CPU, transformers' generate
BASELINE = "ced04f4"
STUDY = "recipes/study/arithmetic_n3.yaml"
EVAL = [
    "debate", "--task", "arithmetic", "--rounds", "1", "--max-tokens", "40",
    "--temperature", "0.7", "--seed", "0", "--no-progress",
]  # fmt: skip


#: runs a script (``*.py``) or the ``udpo`` CLI with this environment's editable install of the checkout
#: and the working folder taken out of the import system, so that ``PYTHONPATH`` (the baseline's install)
#: provides ``udpo``
WITHOUT_EDITABLE = (
    "import os, runpy, sys; "
    "sys.meta_path[:] = [f for f in sys.meta_path if 'Editable' not in getattr(f, '__name__', type(f).__name__)]; "
    "sys.path[:] = [p for p in sys.path if p not in ('', os.getcwd())]; "
    "sys.argv = sys.argv[1:]; "
    "runpy.run_path(sys.argv[0], run_name='__main__') if sys.argv[0].endswith('.py') else "
    "sys.exit(__import__('udpo.cli', fromlist=['main']).main(sys.argv))"
)


def checkout(rev: str, scratch: Path) -> tuple[Path, dict[str, str]]:
    """(working folder, environment) that run ``rev``'s code: a detached worktree, installed beside."""
    tree, site = scratch / "tree", scratch / "site"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(tree), rev], check=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target",
         str(site), str(tree)],
        check=True,
    )  # fmt: skip
    return tree, {"PYTHONPATH": str(site)}


def run(cwd: Path, env: dict[str, str], threads: int, args: list[str]) -> float:
    """Wall seconds of ``python script.py ...`` or of ``udpo ...`` (``args[0]`` not a script) in ``cwd``;
    with ``PYTHONPATH`` in ``env``, from the code there, not this checkout's."""
    full = {**os.environ, **env, "OMP_NUM_THREADS": str(threads), "UDPO_NUM_THREADS": str(threads)}
    if "PYTHONPATH" in env:
        command = [sys.executable, "-c", WITHOUT_EDITABLE, *args]
    elif args[0].endswith(".py"):
        command = [sys.executable, *args]
    else:
        command = [
            sys.executable,
            "-c",
            "import sys; from udpo.cli import main; sys.exit(main(sys.argv[1:]))",
            *args,
        ]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, env=full, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed in {cwd}:\n{done.stderr[-3000:]}")
    return time.perf_counter() - start


def iteration(cwd: Path, env: dict[str, str], threads: int, iterations: int, out: Path) -> dict[str, float]:
    run(cwd, env, threads, ["train_udpo.py", "--config", STUDY, "--max_iterations", str(iterations),
                            "--eval_questions", "0", "--save_steps", "1000", "--output_dir", str(out)])  # fmt: skip
    rows = [json.loads(line) for line in RunFolder(out).metrics.read_text().splitlines()]
    its = [r for r in rows if "time/rollout" in r][1:]
    parts = {k: statistics.median(r[k] for r in its) for k in ("time/rollout", "time/update", "tokens_per_s")}
    total = statistics.median(sum(v for k, v in r.items() if k.startswith("time/")) for r in its)
    return {"iteration_s": total, "rollout_s": parts["time/rollout"], "update_s": parts["time/update"],
            "rollout_tokens_per_s": parts["tokens_per_s"]}  # fmt: skip


def evaluation(cwd: Path, env: dict[str, str], threads: int, questions: int, out: Path) -> dict[str, float]:
    old = (cwd / "udpo" / "commands").is_dir()  # a checkout from before udpo.cli, whose flag was --out
    flag = "--out" if old else "--output-dir"
    seconds = run(cwd, env, threads, [*EVAL, "--limit", str(questions), flag, str(out)])
    summary = json.loads((out / "summary.json").read_text())
    return {"eval_s": seconds, "eval_accuracy": summary["accuracy"]}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--baseline", default=BASELINE, help=f"commit to compare with (default {BASELINE})")
    parser.add_argument("--only", choices=["iteration", "eval"], default=None)
    parser.add_argument(
        "--iterations", type=int, default=4, help="study iterations per side (first not counted)"
    )
    parser.add_argument("--questions", type=int, default=100, help="questions of the evaluation")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--sides", choices=["both", "baseline", "this"], default="both")
    parser.add_argument("--json", default=None, help="also write the numbers to this file")
    args = parser.parse_args()
    head = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    parser_sides = {"both": ("baseline", "this"), "baseline": ("baseline",), "this": ("this",)}
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        base_tree, base_env = checkout(args.baseline, scratch / "baseline")
        sides = {"baseline": (base_tree, base_env), "this": (REPO, {})}
        try:
            for name in parser_sides[args.sides]:
                cwd, env = sides[name]
                numbers: dict[str, float] = {}
                if args.only in (None, "iteration"):
                    numbers |= iteration(cwd, env, args.threads, args.iterations, scratch / f"{name}-train")
                if args.only in (None, "eval"):
                    numbers |= evaluation(cwd, env, args.threads, args.questions, scratch / f"{name}-eval")
                results[name] = numbers
                print(name, json.dumps({k: round(v, 3) for k, v in numbers.items()}), flush=True)
        finally:
            subprocess.run(
                ["git", "-C", str(REPO), "worktree", "remove", "--force", str(base_tree)], check=False
            )
    if len(results) < 2:
        return 0
    print(f"\nbaseline {args.baseline} vs this checkout {head.stdout.strip()}, {args.threads} threads")
    print(f"{'':24} {'baseline':>10} {'this':>10} {'ratio':>8}")
    for key in results["this"]:
        before, after = results["baseline"][key], results["this"][key]
        if key.endswith("accuracy"):
            change = f"{100 * (after - before):+.1f} points"
        else:
            change = f"{after / before if key.endswith('per_s') else before / after:.2f}x faster"
        print(f"{key:24} {before:10.3f} {after:10.3f}   {change}")
    if args.json:
        Path(args.json).write_text(json.dumps({"baseline": args.baseline, "head": head.stdout.strip(),
                                               "threads": args.threads, **results}, indent=2))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
