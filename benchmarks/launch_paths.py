"""Benchmark: one recipe trained by each multi-process path, side by side, with the iteration split.

    python benchmarks/launch_paths.py [--config recipes/quickstart.yaml] [--iterations 3] [--processes 2]
        [--paths single,ddp,zero2,zero3] [--threads share|udpo] [--keep DIR] [KEY VALUE ...]

Paths: ``single`` (``python train_udpo.py``), ``accelerate`` (a bare ``accelerate launch train_udpo.py``,
one process, as the README gives it), ``ddp`` (``torchrun``, gloo on CPU / NCCL on GPU), ``zero2`` and
``zero3`` (``accelerate launch --config_file recipes/accelerate/deepspeed_zero{2,3}.yaml``). Extra
``KEY VALUE`` pairs are passed to every run as ``--KEY VALUE`` (e.g. ``questions_per_iteration 4``).
Prints, per path, the median seconds of an iteration and of its parts (rollout, reward, update, sync),
rollout tokens/s and process 0's peak memory in GiB over the iterations after the first (GPUs: the
iteration's and the rollout's and update's apart; CPUs: the rollout's and update's resident peaks), the
wall time of the whole run, process 0's torch threads (its header line) and each path's iteration time
relative to ``single``. Threads: with ``--threads share`` (the default) each process gets
``UDPO_NUM_THREADS`` = cores / processes unless the variable is set; with ``--threads udpo`` the
thread variables are removed and each run chooses as a user's would (``udpo.threads``, under the
launchers' defaults). ``--keep DIR``
keeps the run folders (``DIR/<path>``); otherwise they are deleted.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from udpo.env.run_folder import RunFolder

REPO = Path(__file__).resolve().parents[1]
PARTS = ("rollout", "reward", "update", "sync")
#: the parts whose peak memory each iteration logs (memory/<part>_peak_gib, or _rss_peak_gib on a CPU)
PEAKS = ("rollout", "update")
#: the thread settings a user may make (removed under ``--threads udpo``)
THREAD_VARIABLES = ("UDPO_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def command(path: str, processes: int) -> list[str]:
    if path == "single":
        return [sys.executable, "train_udpo.py"]
    if path == "accelerate":
        return [sys.executable, "-m", "accelerate.commands.launch", "train_udpo.py"]
    if path == "ddp":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                str(processes), "train_udpo.py"]  # fmt: skip
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
            f"recipes/accelerate/deepspeed_{path}.yaml", "--num_processes", str(processes),
            "train_udpo.py"]  # fmt: skip


def run(path: str, args: argparse.Namespace, out: Path) -> dict[str, float]:
    processes = 1 if path in ("single", "accelerate") else args.processes
    if args.threads == "udpo":
        env = {k: v for k, v in os.environ.items() if k not in THREAD_VARIABLES}
    else:
        env = dict(os.environ)
        env.setdefault("UDPO_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // processes)))
    extra = [x for k, v in zip(args.extra[::2], args.extra[1::2], strict=True) for x in (f"--{k}", v)]
    cmd = [*command(path, processes), "--config", args.config, "--output_dir", str(out),
           "--max_iterations", str(args.iterations), "--progress", "false", *extra]  # fmt: skip
    start = time.perf_counter()
    result = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"{path} failed:\n{result.stderr[-3000:]}")
    figures = iteration_figures(train_records(out)[1:])  # the first iteration warms caches
    figures["wall"] = time.perf_counter() - start
    threads = re.search(r"torch threads per process: (\d+).*", result.stderr)
    if threads:
        figures["threads"] = int(threads.group(1))
        print(f"{path:7s} {threads.group(0)}", flush=True)
    return figures


def train_records(run_dir: Path) -> list[dict]:
    """The run's training iterations, as ``metrics.jsonl`` logged them."""
    lines = RunFolder(run_dir).metrics.read_text().splitlines()
    return [r for r in map(json.loads, filter(str.strip, lines)) if r["kind"] == "train"]


def iteration_figures(train: list[dict]) -> dict[str, float]:
    """Over the iterations ``train``: the median seconds of each part and their sum (``iteration``), the
    median rollout tokens/s and process 0's most memory (GPUs: the iteration's and each phase's peaks;
    CPUs: each phase's resident peak)."""
    skipped = [r["iteration"] for r in train if r.get("update/skipped")]
    if skipped:  # no update to time: dynamic sampling found no informative question within its cap
        raise ValueError(
            f"iterations {skipped} made no update (dynamic sampling dropped every question within its cap): "
            "time a run whose debates differ, or set debates_per_question: 1 or dynamic_sampling: false"
        )
    figures = {part: statistics.median(r[f"time/{part}"] for r in train) for part in PARTS}
    figures["iteration"] = sum(figures.values())
    figures["tokens_per_s"] = statistics.median(r["tokens_per_s"] for r in train)
    for key in ("peak_gib", *(f"{part}_{kind}" for part in PEAKS for kind in ("peak_gib", "rss_peak_gib"))):
        if all(f"memory/{key}" in r for r in train):  # GPUs: process 0's peaks; CPUs: resident peaks
            figures[key] = max(r[f"memory/{key}"] for r in train)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", default="recipes/quickstart.yaml")
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--paths", default="single,ddp,zero2,zero3")
    parser.add_argument(
        "--threads",
        choices=("share", "udpo"),
        default="share",
        help="share: UDPO_NUM_THREADS = cores / processes; udpo: no thread variable, each run chooses",
    )
    parser.add_argument("--keep", help="keep the run folders here (default: a temporary folder)")
    parser.add_argument("extra", nargs="*", help="KEY VALUE pairs passed to every run as --KEY VALUE")
    args = parser.parse_args()
    if len(args.extra) % 2:
        parser.error("extra settings come in KEY VALUE pairs")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for path in args.paths.split(","):
            results[path] = run(path, args, Path(args.keep or tmp) / path)
            print(f"{path:7s} " + "  ".join(f"{k} {v:.2f}" for k, v in results[path].items()), flush=True)
    base = results.get("single", {}).get("iteration")
    print(
        f"\nmedian iteration after the first ({args.iterations} iterations; ddp, zero2, zero3: {args.processes} processes)"
    )
    for path, figures in results.items():
        ratio = f"  {figures['iteration'] / base:.2f}x single" if base else ""
        print(f"{path:7s} {figures['iteration']:7.2f}s{ratio}")


if __name__ == "__main__":
    main()
