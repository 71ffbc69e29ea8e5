"""Profile: where one batched `hf` generate spends its time (the rollout's inner loop).

    python benchmarks/generate_profile.py [--model smollm2-135m-instruct] [--requests 24] [--adapters 3]
                                          [--max-tokens 64] [--dtype bf16] [--rows 22]

Times one call at 3 requests and at ``--requests`` (ms per decode step: if it barely grows with the batch,
per-step overhead, not arithmetic, sets the speed), then runs the larger call under torch's profiler and
prints the kernel launches per decode step, the share of the wall time the GPU was busy, and the top
operators by CPU time (and by GPU time on CUDA). On GPUs run it on the GPU check's model
(`python scripts/check_model.py DIR`); results in docs/lab/measurements.md ("The GPU check on one H200").
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch
from profiling import LAUNCHES, device_work, union_seconds
from rollout import random_adapters
from torch.profiler import ProfilerActivity, profile

from udpo.env.backends import ChatRequest, SamplingParams, make_backend


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument(
        "--adapters", type=int, default=3, help="random LoRA adapters, requests spread over them"
    )
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--rows", type=int, default=22, help="operators printed")
    args = parser.parse_args()
    sampling = SamplingParams(temperature=0.7, max_tokens=args.max_tokens, seed=0)
    with tempfile.TemporaryDirectory() as folder:
        adapters = random_adapters(args.model, args.adapters, folder)
        backend = make_backend("hf", model=args.model, dtype=args.dtype)
        for name, path in adapters.items():
            backend.load_adapter(name, path)
        names = list(adapters) or [None]
        requests = [
            ChatRequest(
                messages=[{"role": "user", "content": f"What is {i} + {i + 3}? Think step by step."}],
                adapter=names[i % len(names)],
                sampling=sampling,
            )
            for i in range(args.requests)
        ]
        backend.generate(requests)  # warm-up
        for k in sorted({min(3, args.requests), args.requests}):
            sync()
            start = time.perf_counter()
            out = backend.generate(requests[:k])
            sync()
            seconds = time.perf_counter() - start
            steps = max(len(c.completion_ids) for c in out)
            tokens = sum(len(c.completion_ids) for c in out)
            print(
                f"{k} requests: {tokens} tokens in {seconds:.2f} s, {1000 * seconds / steps:.1f} ms per step"
            )
        cuda = torch.cuda.is_available()
        activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
        with profile(activities=activities) as prof:
            start = time.perf_counter()
            out = backend.generate(requests)
            sync()
            wall = time.perf_counter() - start
        events = prof.key_averages()
        steps = max(len(c.completion_ids) for c in out)
        if cuda:
            launches = sum(e.count for e in events if e.key in LAUNCHES)
            busy = union_seconds(device_work(prof.events()))  # kernels, copies and fills, overlaps once
            print(
                f"kernel launches per decode step: {launches / steps:.0f}; GPU busy {busy:.2f} of {wall:.2f} s"
            )
        print(events.table(sort_by="self_cpu_time_total", row_limit=args.rows, max_name_column_width=48))
        if cuda:
            print(events.table(sort_by="self_device_time_total", row_limit=12, max_name_column_width=48))


if __name__ == "__main__":
    main()
