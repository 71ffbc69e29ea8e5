"""Benchmark: one short real debate with torch's default threading against udpo's thread choice.

    python benchmarks/threads.py [--questions 2] [--agents 3] [--rounds 1] [--max-tokens 32] [--repeats 2]

Run it beside other work (another training run, a test session): that is where the choice matters.
Each repeat runs ``udpo debate`` in fresh interpreters, the two settings interleaved so that load that
drifts hits both alike:

- "torch default": one intra-op thread per core this process may use (what torch does when nothing
  is set; forced with ``UDPO_NUM_THREADS=<cores>`` so that udpo keeps it);
- "udpo's choice": nothing set, ``udpo.threads.configure_threads`` picks from cores, load and ranks.

``OMP_NUM_THREADS`` and ``MKL_NUM_THREADS`` are removed from the children's environment. Prints the
seconds of every run, the medians and their ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

from udpo.threads import available_cores


def run_debate(args: argparse.Namespace, env: dict[str, str], out: str) -> tuple[float, str]:
    debate = ["debate", "--task", "arithmetic", "--n-agents", str(args.agents), "--rounds", str(args.rounds)]
    debate += [
        "--limit",
        str(args.questions),
        "--max-tokens",
        str(args.max_tokens),
        "--output-dir",
        out,
        "--no-progress",
    ]
    code = "import sys, torch; from udpo.cli import main; r = main(sys.argv[1:]); "
    code += "print('threads', torch.get_num_threads(), file=sys.stderr); sys.exit(r)"
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code, *debate], env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"debate failed ({done.returncode}):\n{done.stderr[-2000:]}")
    threads = [line for line in done.stderr.splitlines() if line.startswith("threads ")][-1].split()[1]
    return seconds, threads


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--questions", type=int, default=2)
    p.add_argument("--agents", type=int, default=3)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args(argv)
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "UDPO_NUM_THREADS")
    }
    base.setdefault("TOKENIZERS_PARALLELISM", "false")
    cores = available_cores()
    modes = {"torch default": {**base, "UDPO_NUM_THREADS": str(cores)}, "udpo's choice": base}
    print(
        f"{cores} cores, load average {os.getloadavg()[0]:.2f} at start; udpo debate, {args.questions} "
        f"questions, N={args.agents}, T={args.rounds}, {args.max_tokens} tokens at most"
    )
    times: dict[str, list[float]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for name, env in modes.items():
                seconds, threads = run_debate(
                    args, env, os.path.join(tmp, f"{r}-{len(times[name])}-{name[:5]}")
                )
                times[name].append(seconds)
                print(f"  repeat {r + 1}  {name:14s} {threads} thread(s)  {seconds:7.1f} s", flush=True)
    default, chosen = (statistics.median(times[m]) for m in modes)
    print(
        f"median: torch default {default:.1f} s, udpo's choice {chosen:.1f} s, ratio {default / chosen:.2f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
