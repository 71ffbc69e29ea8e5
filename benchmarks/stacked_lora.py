"""Benchmark: the per-row LoRA of the decode loops (``env/backends/stacked.py``) against its previous form,
side by side in one run.

    python benchmarks/stacked_lora.py [--rows 6,24] [--context 128] [--steps 8] [--repeats 5]
                                      [--adapters 3] [--dtype fp32|bf16] [--model smollm2-135m-instruct]

"before" is the per-layer forward as it was until the rows' masks were written by ``select``: every LoRA
layer compared the stacked columns with the slot index, cast the mask (and the input, when the dtypes
differ), flattened the stacked weights and ran its base layer, two matmuls, a product, a sum and a cast
(:func:`before_forward`, kept here). "after" is :class:`udpo.env.backends.stacked.StackedAdapters` as it is.

At each of ``--rows`` (the rows spread over ``--adapters`` random LoRA adapters, every fourth row on the
base model, prompts of about ``--context`` words, as ``benchmarks/breakdown.py`` builds them), for each
form:

- the aten operators one decode step dispatches (``breakdown.count_operators``: a call of 3 new tokens
  less one of 2), a count that does not depend on the machine's load;
- that both forms sample the same tokens with the same log-probs (``decoding.sample``, one seed);
- the median decode forward of ``--steps`` steps, the two forms alternating ``--repeats`` times (the
  median over repeats of each call's median step): read the ratio, taken side by side, before the
  seconds on a busy machine. The load average is printed before and after.

``--dtype`` defaults to fp32, the path on which the two forms must give the same numbers bit for bit.
Threads: torch's current setting (``UDPO_NUM_THREADS``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "benchmarks")]


def before_forward(self, base, stack) -> Callable:
    """``StackedAdapters._forward`` before the masks were written by ``select`` (the mask computed, and
    cast, in every layer)."""
    import torch

    def forward(x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        result = base(x, *args, **kwargs)
        if stack is None:
            return result
        a, bt = stack.a.flatten(0, 1), stack.bt.flatten(0, 1)
        mask = (stack.columns == self.index[: x.shape[0], None]).to(a.dtype)
        hidden = (x.to(a.dtype) @ a.T) * mask.view(x.shape[0], *([1] * (x.dim() - 2)), -1)
        return (result + hidden @ bt).to(result.dtype)

    return forward


def sampler(peft, input_ids, attention, adapters: list) -> Callable:
    """``sample(new_tokens)``: those rows sampled by ``decoding.sample`` from one seed."""
    import torch

    from udpo.env.backends import decoding

    def sample(new_tokens: int) -> list:
        torch.manual_seed(0)
        return decoding.sample(
            peft, input_ids, attention, max_new_tokens=new_tokens, temperature=0.7, top_p=0.95,
            stops=set(), adapters=adapters,
        )  # fmt: skip

    return sample


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", default="6,24", help="decode rows, comma-separated")
    parser.add_argument("--context", type=int, default=128, help="prompt words")
    parser.add_argument("--steps", type=int, default=8, help="decode steps per timed call")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls of each form, alternating")
    parser.add_argument("--adapters", type=int, default=3)
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    args = parser.parse_args()

    from udpo.threads import configure_threads

    configure_threads()
    import torch
    from breakdown import count_operators, recording
    from decode import load, prompts
    from decode_limit import padded
    from transformers import AutoTokenizer

    from udpo.env.backends.attention import use_grouped_sdpa
    from udpo.env.backends.machine import DTYPES, cpu_model
    from udpo.env.backends.stacked import StackedAdapters
    from udpo.threads import describe

    peft, names = load(args.model, DTYPES[args.dtype], "cpu", max(1, args.adapters))
    use_grouped_sdpa(peft.get_base_model())
    tokenizer = AutoTokenizer.from_pretrained(peft.get_base_model().name_or_path)
    forms = {"before": before_forward, "after": StackedAdapters._forward}
    print(
        f"cpu: {cpu_model()}; torch {torch.__version__}, kernels {torch.backends.cpu.get_cpu_capability()}; "
        f"{args.dtype}; torch threads {describe()}; {args.adapters} adapters; "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    print(
        "rows | operators per step, before | after | same tokens and log-probs "
        "| ms per step, before | after | after / before"
    )
    for rows in map(int, args.rows.split(",")):
        input_ids, attention = padded(tokenizer, prompts(rows, args.context, seed=rows))
        adapters = [names[k % len(names)] if k % 4 else None for k in range(rows)]

        sample = sampler(peft, input_ids, attention, adapters)
        ops, samples, steps = {}, {}, {name: [] for name in forms}
        for name, form in forms.items():
            StackedAdapters._forward = form
            ops[name] = count_operators(partial(sample, 3)) - count_operators(partial(sample, 2))
            samples[name] = [(s.tokens, s.logprobs) for s in sample(args.steps)]
        for _ in range(args.repeats):
            for name, form in forms.items():
                StackedAdapters._forward = form
                with recording(type(peft.get_base_model())) as forwards:
                    sample(args.steps + 1)
                steps[name].append(statistics.median(f.seconds for f in forwards if f.width == 1))
        StackedAdapters._forward = forms["after"]
        ms = {name: 1000 * statistics.median(times) for name, times in steps.items()}
        print(
            f"{rows} | {ops['before']} | {ops['after']} | {samples['before'] == samples['after']} | "
            f"{ms['before']:.1f} | {ms['after']:.1f} | {ms['after'] / ms['before']:.2f}",
            flush=True,
        )
    print(f"load average {os.getloadavg()[0]:.2f} at {time.strftime('%H:%M:%S')}")


if __name__ == "__main__":
    main()
