"""Benchmark: DIGRA's extra cost per round against Standard MAD, side by side in one run.

    OMP_NUM_THREADS=1 python benchmarks/protocols.py [--questions 4] [--agents 3] [--rounds 2]
                                                     [--max-tokens 48] [--task du-arithmetic] [--seed 0]

One hf backend (the model loaded once) debates the same questions twice: Standard MAD, then DIGRA
(its default options: stable agents stop, unanimity ends a debate). A stage appended to each protocol
clocks every round (from the end of the previous round: selection, forced decoding and generation)
and reads DIGRA's counters, so the table shows per round: requests generated, forced-decoding passes
and their batched calls, seconds spent scoring, and each round's seconds with the ratio DIGRA /
Standard. Round 0 is the same work for both (no one reads anyone yet).
"""

from __future__ import annotations

import argparse
import platform
import random
import time
from collections.abc import Sequence

import numpy as np
import torch

from udpo.env.backends import Backend, ChatRequest, Completion, SamplingParams, make_backend
from udpo.env.debate import DebateConfig, DebateEnv
from udpo.env.protocols import DebateState, DIGRATopology, Protocol, ProtocolConfig, Stage, build_protocol
from udpo.env.tasks import get_task


class Counting(Backend):
    """Wraps a backend and counts the requests generated since the last ``pop``."""

    def __init__(self, inner: Backend):
        self.inner, self.name, self.requests = inner, inner.name, 0

    def generate(self, requests: list[ChatRequest]) -> list[Completion]:
        self.requests += len(requests)
        return self.inner.generate(requests)

    def token_entropies(self, requests):
        return self.inner.token_entropies(requests)

    def pop(self) -> int:
        n, self.requests = self.requests, 0
        return n


class RoundClock(Stage):
    """Records, after every round, its seconds, the requests generated and DIGRA's scoring counters."""

    name = "round_clock"

    def __init__(self, backend: Counting, digra: DIGRATopology | None):
        self.backend, self.digra, self.rows = backend, digra, []
        self.start = time.perf_counter()
        self.scored = {"passes": 0, "calls": 0, "seconds": 0.0}

    def after_round(self, states: Sequence[DebateState], rnd: int) -> None:
        now = time.perf_counter()
        stats = self.digra.stats() if self.digra else dict(self.scored)
        row = {"round": rnd, "seconds": now - self.start, "requests": self.backend.pop()}
        row.update({f"scoring_{k}": stats[k] - self.scored[k] for k in self.scored})
        self.rows.append(row)
        self.scored, self.start = stats, now


def run(name: str, task, questions, backend: Counting, config: DebateConfig, seed: int) -> list[dict]:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    protocol = build_protocol(ProtocolConfig(name=name), task, backend)
    digra = next((s for s in protocol.stages if isinstance(s, DIGRATopology)), None)
    clock = RoundClock(backend, digra)
    backend.pop()
    DebateEnv(task, backend, config, protocol=Protocol([*protocol.stages, clock], name)).run(
        questions, progress=False
    )
    return clock.rows


def report(standard: list[dict], digra: list[dict], n_questions: int) -> None:
    print(
        f"{'round':>5} | {'MAD req':>7} {'MAD s':>7} | {'DIGRA req':>9} {'passes':>6} {'calls':>5} "
        f"{'score s':>7} {'DIGRA s':>8} | {'DIGRA/MAD':>9}"
    )
    for s, d in zip(standard, digra, strict=False):
        print(
            f"{s['round']:>5} | {s['requests']:>7} {s['seconds']:>7.1f} | {d['requests']:>9} {d['scoring_passes']:>6} "
            f"{d['scoring_calls']:>5} {d['scoring_seconds']:>7.1f} {d['seconds']:>8.1f} | {d['seconds'] / s['seconds']:>8.2f}x"
        )
    total_s, total_d = sum(r["seconds"] for r in standard), sum(r["seconds"] for r in digra)
    passes = sum(r["scoring_passes"] for r in digra)
    print(
        f"total: Standard MAD {total_s:.1f} s, DIGRA {total_d:.1f} s ({total_d / total_s:.2f}x); "
        f"{passes} forced-decoding passes ({passes / n_questions:.1f} per debate), "
        f"{sum(r['scoring_seconds'] for r in digra):.1f} s scoring"
    )
    if len(digra) < len(standard):
        print(f"DIGRA ended every debate after round {len(digra) - 1} (unanimity or stable agents)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--task", default="du-arithmetic")
    parser.add_argument("--questions", type=int, default=4)
    parser.add_argument("--agents", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(
        f"{args.task}: {args.questions} questions x {args.agents} agents x {args.rounds} debate rounds, "
        f"max_tokens={args.max_tokens}, temperature 0.7, seed {args.seed}, hf backend, "
        f"{torch.get_num_threads()} torch thread(s); {platform.processor() or platform.machine()}"
    )
    task = get_task(args.task)
    questions = task.load(limit=args.questions)
    sampling = SamplingParams(temperature=0.7, max_tokens=args.max_tokens)
    config = DebateConfig(args.agents, args.rounds, sampling, debate_batch_size=args.questions)
    with make_backend("hf", model=args.model) as inner:
        backend = Counting(inner)
        standard = run("standard", task, questions, backend, config, args.seed)
        digra = run("digra", task, questions, backend, config, args.seed)
    report(standard, digra, args.questions)


if __name__ == "__main__":
    main()
