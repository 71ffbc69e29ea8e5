"""Benchmark: one agent micro-batch's memory in the update, measured, against autosize's plan.

    python benchmarks/update_memory.py [--shapes 1b,1b-check,7b,small-vocab,small-layers] [--dtype bf16]
        [--questions 32] [--agents 3] [--rounds 2] [--max-tokens 64] [--micro-batches 2]
        [--token-budget 65536] [--breakdown 12]

For each shape, a Llama model of that shape from its config (random weights), the team as the trainer
builds it (``MultiAgentPolicy``: a LoRA adapter per agent) and one agent's micro-batch of the debates
autosize sizes for (``Workload.bound``: every response ``max_tokens`` long), scored and backpropagated
through the update's own path: ``token_logprobs`` (``plan_passes``, ``forward_logprobs``) under the
update's autocast, a loss of the log-probs, backward. The peak of the tensors alive is counted tensor by
tensor (``udpo.training.memory.TensorBytes``), the weights excluded (the plan's "held"). Two layouts of
each debate's rows: a row per round (rounds that do not share their prefix) and the rounds packed into one
row; the larger peak is set against ``autosize.micro_batch_bytes`` at the same workload and sizes.

The loss is the negative mean log-prob: the algorithms' losses add tensors of the scored tokens' size
(a few kB), nothing per position or per vocabulary entry.

The shapes ``1b`` (Llama-3.2-1B), ``1b-check`` (the same with the GPU check's small vocabulary) and ``7b``
(Llama-2-7B) run on fake tensors (``FakeTensorMode``: every shape, no compute, no memory), with two
stand-ins for what fake tensors cannot do: a module's ``to()`` sets ``.data`` where torch would swap the
tensors, and transformers' packed-sequence detection is given its answer for plain position ids (no
packing; on fake ids it cannot read them and would build a causal mask the real pass never makes).
``small-vocab`` and ``small-layers`` run for real; ``--fake`` runs every shape on fake tensors (the test
checks that both count the same bytes at a small shape).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from udpo.config import TrainConfig
from udpo.env.backends.machine import describe_numeric_path
from udpo.threads import configure_threads
from udpo.training import autosize
from udpo.training.memory import TensorBytes
from udpo.training.policy import MultiAgentPolicy


@dataclass(frozen=True)
class Shape:
    """A Llama architecture (``LlamaConfig`` fields) and whether it runs on fake tensors by default."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool = True
    fake: bool = False


SHAPES = {
    "1b": Shape(2048, 8192, 16, 32, 8, 128256, fake=True),  # Llama-3.2-1B
    "1b-check": Shape(2048, 8192, 16, 32, 8, 1816, fake=True),  # the GPU check's vocabulary (2,994 before its
    # tokenizer became word-level, 2026-11-28)
    "7b": Shape(4096, 11008, 32, 32, 32, 32000, tied=False, fake=True),  # Llama-2-7B
    "small-vocab": Shape(64, 256, 2, 4, 2, 32000),
    "small-layers": Shape(256, 1024, 4, 4, 2, 2000),
}


@contextlib.contextmanager
def fake_tensors() -> Iterator[None]:
    """``FakeTensorMode`` with the two stand-ins the module docstring names."""
    import transformers.masking_utils as masking
    from torch._subclasses.fake_tensor import FakeTensorMode

    def set_data(t1: torch.Tensor, t2: torch.Tensor) -> None:
        t1.data = t2.data

    swap, packed = torch.utils.swap_tensors, masking.find_packed_sequence_indices
    torch.utils.swap_tensors = set_data
    masking.find_packed_sequence_indices = lambda position_ids: None
    try:
        with FakeTensorMode():
            yield
    finally:
        torch.utils.swap_tensors, masking.find_packed_sequence_indices = swap, packed


def build_policy(shape: Shape, dtype: str, n_agents: int) -> MultiAgentPolicy:
    """The team on a random model of ``shape``, as the trainer builds it (no tokenizer: pad id 0)."""
    from types import SimpleNamespace

    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=shape.vocab,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        tie_word_embeddings=shape.tied,
        max_position_embeddings=8192,
        pad_token_id=0,
    )
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16 if dtype == "bf16" else torch.float32)
    try:
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    model.config._name_or_path = model.name_or_path = "random-llama"
    return MultiAgentPolicy(
        model, n_agents=n_agents, dtype=dtype, device="cpu", tokenizer=SimpleNamespace(pad_token_id=0)
    )


def bound_rows(config: TrainConfig, debates: int, packed: bool) -> tuple[list[list[int]], list[list[int]]]:
    """One agent's (prompt, completion) ids in ``debates`` debates at ``Workload.bound``'s lengths: every
    response ``max_tokens`` long; ``packed``: each round's prompt continues the last round's row (one row
    per debate), else no round's prompt starts with the last one's (a row per round)."""
    rounds = config.rounds + 1
    widths = autosize.row_widths(rounds, config.n_agents, config.max_tokens)
    completion = [7] * config.max_tokens
    prompts, completions = [], []
    for _ in range(debates):
        row: list[int] = []
        for r, width in enumerate(widths):
            prompt = (
                row + [3] * (width - config.max_tokens - len(row))
                if packed
                else [3 + r] * (width - len(completion))
            )
            prompts.append(prompt)
            completions.append(completion)
            row = prompt + completion
    return prompts, completions


def peak_bytes(policy: MultiAgentPolicy, config: TrainConfig, debates: int, packed: bool, budget: int):
    """The peak bytes (and the counter) of agent 0's micro-batch of ``debates`` debates: log-probs with
    gradients under the update's autocast, the loss, backward."""
    prompts, completions = bound_rows(config, debates, packed)
    autocast = (
        torch.autocast("cpu", dtype=torch.bfloat16)
        if policy.dtype == torch.bfloat16
        else contextlib.nullcontext()
    )
    counter = TensorBytes()
    hooks = label_modules(policy.model_of(0), counter)
    with counter:
        with autocast:
            flat = policy.token_logprobs(0, prompts, completions, token_budget=budget)
            loss = -torch.cat(flat).mean()
        counter.label = "backward"
        loss.backward()
    for hook in hooks:
        hook.remove()
    return counter.peak, counter


def label_modules(model: torch.nn.Module, counter: TensorBytes) -> list:
    """Hooks that set ``counter.label`` to the running module's name (layer numbers as ``N``)."""
    outer: list[str] = []

    def enter(name: str):
        def hook(module, args) -> None:
            outer.append(counter.label)
            counter.label = name

        return hook

    def leave(module, args, output) -> None:
        counter.label = outer.pop()

    hooks = []
    for name, module in model.named_modules():
        short = re.sub(r"\.\d+\.", ".N.", name.removeprefix("base_model.model."))
        hooks += [module.register_forward_pre_hook(enter(short)), module.register_forward_hook(leave)]
    return hooks


def measure(name: str, args: argparse.Namespace, fake: bool | None = None) -> dict:
    """Measured peaks (both layouts) and the plan of one shape at the workload ``args`` asks for."""
    shape = SHAPES[name]
    fake = shape.fake if fake is None else fake
    config = TrainConfig(
        questions_per_iteration=args.questions,
        debates_per_question=1,
        n_agents=args.agents,
        rounds=args.rounds,
        max_tokens=args.max_tokens,
    )
    work = autosize.Workload.bound(config, world=1)
    debates = math.ceil(work.debates / args.micro_batches)
    with fake_tensors() if fake else contextlib.nullcontext():
        policy = build_policy(shape, args.dtype, args.agents)
        if args.checkpointing:
            policy.enable_gradient_checkpointing()
        model_shape = autosize.ModelShape.of(policy.model_of(0))
        rows, counter = peak_bytes(policy, config, debates, False, args.token_budget)
        packed, _ = peak_bytes(policy, config, debates, True, args.token_budget)
    plan = autosize.micro_batch_bytes(
        model_shape, work, args.micro_batches, args.checkpointing, args.token_budget
    )
    return {
        "shape": name,
        "fake": fake,
        "debates": debates,
        "row per round": rows,
        "packed": packed,
        "plan": plan,
        "ratio": max(rows, packed) / plan,
        "at_peak": counter.at_peak(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"of {', '.join(SHAPES)}")
    parser.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    parser.add_argument("--questions", type=int, default=32)
    parser.add_argument("--agents", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--micro-batches", type=int, default=2, help="gradient_accumulation_steps")
    parser.add_argument("--token-budget", type=int, default=65536, help="logprob_token_budget")
    parser.add_argument("--checkpointing", action="store_true", help="gradient_checkpointing")
    parser.add_argument("--fake", action="store_true", help="every shape on fake tensors")
    parser.add_argument(
        "--breakdown", type=int, default=0, help="print the N largest groups alive at the peak"
    )
    args = parser.parse_args()
    threads = configure_threads().threads
    print(
        f"{describe_numeric_path()}; {threads} threads, {args.dtype}, torch {torch.__version__}; "
        f"{args.questions} questions x {args.agents} agents x {args.rounds} rounds, {args.max_tokens} tokens, "
        f"{args.micro_batches} micro-batches, token budget {args.token_budget}"
        f"{', gradient checkpointing' if args.checkpointing else ''}"
    )
    print(
        f"{'shape':<13} {'tensors':<6} {'debates':>7} {'row/round GiB':>13} {'packed GiB':>10} {'plan GiB':>9} {'measured/plan':>13}"
    )
    for name in args.shapes.split(","):
        r = measure(name, args, fake=True if args.fake else None)
        print(
            f"{name:<13} {'fake' if r['fake'] else 'real':<6} {r['debates']:>7} {r['row per round'] / 2**30:>13.3f} "
            f"{r['packed'] / 2**30:>10.3f} {r['plan'] / 2**30:>9.3f} {r['ratio']:>13.2f}",
            flush=True,
        )
        for what, size in r["at_peak"].most_common(args.breakdown):
            print(f"    {size / 2**30:8.3f} GiB  {what}")


if __name__ == "__main__":
    sys.exit(main())
