"""Benchmark: uncertainty metrics one debate at a time vs the vectorized batch path.

    python benchmarks/uncertainty.py [--debates 10000] [--agents 10] [--rounds 10] [--seed 0]

Random answer matrices (a few candidate answers plus unparsed ``None``; agents drift towards one
answer over rounds). Times, measured side by side in this run:

- scalar: ``uncertainty(a)`` for every debate (debate-level metrics only), and "scalar, all terms":
  ``uncertainty``, ``agent_uncertainty`` and ``rewards`` in both scopes (what ``debate_metrics`` returns);
  these one-debate functions are the batch path on a batch of one, so this measures the cost of calling
  it debate by debate (the formulas written out per debate are the tests' oracle, not library code);
- batch: ``debate_metrics(matrices, keys=ids)`` (validation, integer coding, the votes' tie-breaks by
  question id, and every debate- and agent-level metric and reward term), and ``batch_uncertainty(codes,
  values=..., keys=ids)`` on pre-coded integers.

Every debate has a question id (``q0``, ``q1``, ...), the key of its votes' tie-break, as in training.

Prints both times, the scalar/batch ratio, and checks that the two paths agree.
"""

from __future__ import annotations

import argparse
import random
import time

import numpy as np

from udpo.rewards import (
    agent_uncertainty,
    batch_uncertainty,
    debate_metrics,
    encode_answers,
    rewards,
    uncertainty,
)


def random_debates(m: int, n: int, t: int, seed: int) -> list[list[list]]:
    rng = random.Random(seed)
    choices = ["12", "15", "7", "3.5", None]
    debates = []
    for _ in range(m):
        target = rng.choice(choices[:-1])
        pull = rng.random()  # how strongly this debate converges
        rows = []
        for _agent in range(n):
            answer = rng.choice(choices)
            row = [answer]
            for _round in range(t):
                r = rng.random()
                answer = target if r < pull else (rng.choice(choices) if r < pull + 0.2 else answer)
                row.append(answer)
            rows.append(row)
        debates.append(rows)
    return debates


def best_of(repeats: int, fn) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--debates", type=int, default=10_000)
    parser.add_argument("--agents", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3, help="batch timings: best of this many runs")
    args = parser.parse_args()

    debates = random_debates(args.debates, args.agents, args.rounds, args.seed)
    ids = [f"q{m}" for m in range(len(debates))]
    shape = f"{args.debates} debates, N={args.agents}, T={args.rounds}"

    start = time.perf_counter()
    scalar = [uncertainty(a, key=k) for a, k in zip(debates, ids, strict=True)]
    t_scalar = time.perf_counter() - start
    start = time.perf_counter()
    for a, k in zip(debates, ids, strict=True):
        agent_uncertainty(a, key=k), rewards(a, None, key=k), rewards(a, None, scope="agent", key=k)
    t_all = t_scalar + time.perf_counter() - start
    t_batch, metrics = best_of(args.repeats, lambda: debate_metrics(debates, keys=ids))
    codes, values = encode_answers(debates, return_values=True)
    t_codes, coded = best_of(args.repeats, lambda: batch_uncertainty(codes, values=values, keys=ids))

    for name in ("u_intra", "u_inter", "u_sys"):
        reference = np.array([getattr(u, name) for u in scalar])
        assert np.allclose(reference, getattr(metrics, name)), name
        assert np.allclose(reference, getattr(coded, name)), name

    print(f"{shape}")
    print(f"scalar uncertainty(), one debate at a time : {t_scalar:8.3f} s")
    print(f"scalar, all terms, one debate at a time    : {t_all:8.3f} s")
    print(
        f"batch debate_metrics(answer lists)         : {t_batch:8.3f} s   ratio scalar/batch {t_scalar / t_batch:6.1f}x"
    )
    print(
        f"batch batch_uncertainty(int codes)         : {t_codes:8.3f} s   ratio scalar/batch {t_scalar / t_codes:6.1f}x"
    )
    print(
        f"all terms: scalar/batch ratio {t_all / t_batch:6.1f}x (answer lists), {t_all / t_codes:6.1f}x (int codes)"
    )
    print("paths agree on u_intra, u_inter, u_sys")


if __name__ == "__main__":
    main()
