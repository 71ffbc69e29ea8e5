"""Benchmark: what compiling the decode step costs across a run's bucket shapes, one compile for every
bucket (``shapes="dynamic"``, the default) against one per bucket (``"static"``), side by side.

    python benchmarks/decode_compile.py [--shape 135m|1b|7b] [--layers N] [--calls 96x150,96x650,...]
                                        [--max-tokens 16] [--adapters 3] [--threads N]
                                        [--dtype auto|bf16|fp32] [--json FILE]

Per mode, a :class:`~udpo.env.backends.static_decode.StaticDecoder` on the check model's ``--shape``
(``scripts/check_model.py``: random weights built in memory, ``--layers`` of them; ``--adapters`` random
LoRA adapters mixed over the rows) makes ``--calls``, each ROWS prompts of WIDTH tokens: by default the
buckets of rows and KV columns the 1B iteration of the first H200 check met (rows 96, 64, 48, 6 and 4;
columns 256 and 768: a debate's rounds, and calls the KV cap split); then the same calls once more. On a GPU the
step is the CUDA graph (``reduce-overhead``); on a CPU it is compiled by inductor to C++ (a GPU compiles
Triton kernels instead: the CPU's figures give the number of compiles and their cost against each
other, not a GPU's seconds). Printed per mode and call: the first call's seconds (compiling, and on a
GPU recording a graph) and the second's; dynamo's compiled graphs; and static / dynamic of the first
pass's seconds and of the second's. Both modes compile cold: inductor's caches are in a fresh folder
for each run of this script, dynamo is reset between the modes, and a small function compiled before
either pays the compiler's start (the first compile of a process is slower). The CPU's name, the torch
threads and the dtype head the output.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import torch
from decode import load  # benchmarks/decode.py

from udpo.env.backends.machine import cpu_model, pick_dtype
from udpo.env.backends.static_decode import MIN_COLUMNS, SHAPES, StaticDecoder, bucket


def timed(call, **kwargs) -> float:
    """Seconds of ``call(**kwargs)``, the device synchronized at both ends."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    call(**kwargs)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - start


def warm_up(device: str) -> None:
    """Compile and run a small function as the step is compiled (the compiler's start-up paid here)."""
    x = torch.ones(64, 64, device=device)
    how = {"mode": "reduce-overhead"} if device == "cuda" else {"backend": "inductor"}
    step = torch.compile(lambda t: (t @ t).relu().sum(-1), **how)
    for _ in range(3):
        step(x)
    torch._dynamo.reset()


def passes(model, names: list[str], args, shapes: str, device: str) -> dict:
    """Two passes over the calls through a decoder compiling with ``shapes``: each call's seconds, and
    the graphs dynamo compiled."""
    from torch._dynamo.utils import counters

    cuda = device == "cuda"
    vocab = model.config.vocab_size
    max_rows = max(rows for rows, _ in args.calls)
    decoder = StaticDecoder(
        model, graph=cuda, max_rows=max_rows, compile_backend=None if cuda else "inductor", shapes=shapes
    )
    counters.clear()
    gen = torch.Generator().manual_seed(args.seed)
    calls = [torch.randint(10, vocab - 10, (rows, w), generator=gen).to(device) for rows, w in args.calls]
    sample = dict(max_new_tokens=args.max_tokens, temperature=1.0, top_p=1.0, stops=set())

    def call(ids: torch.Tensor) -> float:
        adapters = [names[k % len(names)] for k in range(len(ids))] if names else None
        return timed(
            decoder.sample, input_ids=ids, attention=torch.ones_like(ids), adapters=adapters, **sample
        )

    seconds: list[list[float]] = []
    try:
        for _ in range(2):
            seconds.append([call(ids) for ids in calls])
        return {"first": seconds[0], "second": seconds[1], "graphs": counters["stats"]["unique_graphs"]}
    finally:
        decoder.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=["135m", "1b", "7b"], default="135m")
    parser.add_argument("--layers", type=int, help="layers of the shape (default: all)")
    parser.add_argument(
        "--calls",
        default="96x150,96x650,4x150,64x650,48x150,6x650",
        help="ROWSxPROMPT_TOKENS, comma-separated",
    )
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--adapters", type=int, default=3)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch CPU threads")
    parser.add_argument("--dtype", choices=["auto", "bf16", "fp32"], default="auto")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    # read by inductor when it first compiles: nothing compiled by an earlier run is reused
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="decode_compile_")
    args.calls = [tuple(int(n) for n in c.split("x")) for c in args.calls.split(",")]
    torch.set_num_threads(args.threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = pick_dtype(args.dtype, device)
    step = "CUDA graph" if device == "cuda" else "inductor (C++)"
    gpu = torch.cuda.get_device_name() if device == "cuda" else "no GPU"
    print(f"CPU {cpu_model()}, {torch.get_num_threads()} torch threads; {gpu}; torch {torch.__version__}")
    print(
        f"{args.shape} shape, {args.layers or 'all'} layers, {str(dtype).removeprefix('torch.')}, {step}; "
        f"{len(args.calls)} calls x {args.max_tokens} new tokens, {args.adapters} adapters"
    )
    model, names = load(tempfile.mkdtemp(), dtype, device, args.adapters, args.shape, args.layers)
    warm_up(device)
    figures = {mode: passes(model, names, args, mode, device) for mode in SHAPES}
    print(f"\n{'mode':<8} {'call':>8} {'bucket':>9} {'first call':>10} {'second':>8}")
    for mode, f in figures.items():
        for (rows, w), first, second in zip(args.calls, f["first"], f["second"], strict=True):
            shape = f"{bucket(rows)}x{bucket(w + args.max_tokens, MIN_COLUMNS)}"
            print(f"{mode:<8} {f'{rows}x{w}':>8} {shape:>9} {first:>9.2f}s {second:>7.2f}s")
        print(f"{mode:<8} {'all':>8} {'':>9} {sum(f['first']):>9.2f}s {sum(f['second']):>7.2f}s   "
              f"{f['graphs']} graph(s) compiled")  # fmt: skip
    dyn, sta = figures["dynamic"], figures["static"]
    print(f"static / dynamic, first pass: {sum(sta['first']) / sum(dyn['first']):.2f}x; "
          f"second pass: {sum(sta['second']) / sum(dyn['second']):.2f}x")  # fmt: skip
    if args.json:
        record = {
            "device": gpu if device == "cuda" else f"CPU {cpu_model()}",
            "threads": torch.get_num_threads(),
            "dtype": str(dtype).removeprefix("torch."),
            "args": {k: v for k, v in vars(args).items() if k != "json"},
            "figures": figures,
        }
        Path(args.json).write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
