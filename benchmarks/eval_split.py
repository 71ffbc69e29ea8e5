"""Benchmark: where an evaluation's time goes on the hf backend: prompt passes, decode steps, the rest.

    python benchmarks/eval_split.py [--questions 32] [--batch 16] [--agents 3] [--rounds 1]
                                    [--max-tokens 40] [--dtype auto|bf16|fp32] [--seed 0]
                                    [--prefix-cache on|off|both]

Runs Standard-MAD debates shaped like ``udpo debate``'s evaluation (arithmetic test questions,
``--batch`` questions per call, temperature 0.7) and times every forward of the model: a forward over
more than one position is a prompt pass (prefill: every distinct prompt of the call, left-padded to the
longest), one over a single position a decode step. Prints the seconds, share of the wall time, calls
and token slots (padding included) of each, the prompt passes' real tokens and padding, and the
remainder (sampling, prompt building, parsing). ``--prefix-cache both`` runs the same debates (same
seeds) with the hf backend's prefix cache on, then off, and prints the ratio of the wall times.
Threads: torch's current setting (``OMP_NUM_THREADS``); say what else ran on the machine.
"""

from __future__ import annotations

import argparse
import time

from udpo.env.backends import SamplingParams, make_backend
from udpo.env.debate import DebateConfig, DebateEnv
from udpo.env.tasks.arithmetic import Arithmetic


def run(args: argparse.Namespace, prefix_cache: bool) -> float:
    """Debate the questions once; print where the time went; return the wall time."""
    backend = make_backend("hf", dtype=args.dtype, prefix_cache=prefix_cache)
    forward = backend.model.forward
    spent = {"prompt passes": [0.0, 0, 0], "decode steps": [0.0, 0, 0]}  # seconds, calls, token slots
    prompt_tokens = 0  # real (unpadded) tokens of the prompt passes

    def timed(*positional, **kwargs):
        nonlocal prompt_tokens
        ids = kwargs["input_ids"]
        prompt_pass = ids.shape[1] > 1
        if prompt_pass:  # the prompt's columns follow the reused prefixes already in the cache
            reused = int(kwargs["past_key_values"].get_seq_length())
            prompt_tokens += int(kwargs["attention_mask"][:, reused : reused + ids.shape[1]].sum())
        start = time.perf_counter()
        out = forward(*positional, **kwargs)
        entry = spent["prompt passes" if prompt_pass else "decode steps"]
        entry[0] += time.perf_counter() - start
        entry[1] += 1
        entry[2] += ids.numel()
        return out

    backend.model.forward = timed
    task = Arithmetic()
    questions = task.load("test", seed=args.seed)[: args.questions]
    sampling = SamplingParams(temperature=0.7, max_tokens=args.max_tokens, seed=args.seed)
    env = DebateEnv(task, backend, DebateConfig(n_agents=args.agents, rounds=args.rounds, sampling=sampling))
    start = time.perf_counter()
    for first in range(0, len(questions), args.batch):
        env.run(questions[first : first + args.batch], progress=False)
    wall = time.perf_counter() - start
    backend.close()
    print(
        f"prefix cache {'on' if prefix_cache else 'off'}: {len(questions)} questions, {args.batch} per call, "
        f"{args.agents} agents x {args.rounds + 1} rounds, {args.max_tokens} tokens, dtype {args.dtype}: "
        f"{wall:.1f} s"
    )
    for name, (seconds, calls, slots) in spent.items():
        print(
            f"  {name:<14} {seconds:7.1f} s {seconds / wall:5.0%}  {calls:4d} calls  {slots:6d} token slots "
            f"({slots / max(seconds, 1e-9):.0f}/s)"
        )
    slots = spent["prompt passes"][2]
    print(
        f"  prompt passes: {prompt_tokens} real tokens, {1 - prompt_tokens / max(slots, 1):.0%} of the "
        f"slots are padding"
    )
    rest = wall - sum(s for s, _, _ in spent.values())
    print(f"  {'the rest':<14} {rest:7.1f} s {rest / wall:5.0%}")
    return wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=32)
    parser.add_argument("--batch", type=int, default=16, help="questions per call (debate_batch_size)")
    parser.add_argument("--agents", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=40)
    parser.add_argument("--dtype", choices=["auto", "bf16", "fp32"], default="auto")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prefix-cache", choices=["on", "off", "both"], default="on")
    args = parser.parse_args()

    walls = {
        on: run(args, on)
        for on in ([True, False] if args.prefix_cache == "both" else [args.prefix_cache == "on"])
    }
    if len(walls) == 2:
        print(f"prefix cache on / off: {walls[False] / walls[True]:.2f}x faster")


if __name__ == "__main__":
    main()
