"""Benchmark: where a debate's generation and a training iteration spend their time on a CPU.

    python benchmarks/breakdown.py [--dtype fp32|bf16] [--rows 6,24,48] [--context 128] [--steps 8]
        [--adapters 3] [--model smollm2-135m-instruct] [--questions 8] [--parts steps,debate,iteration]

    # the AVX2 machine's path on any x86 CPU (torch's kernels held to AVX2, fp32)
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 \\
        python benchmarks/breakdown.py --dtype fp32

``--dtype`` is also what ``dtype: auto`` resolves to in the real runs below (``UDPO_DTYPE``). Three parts,
in one run:

- steps: one decode step at each of ``--rows``, the rows spread over ``--adapters`` random LoRA adapters
  (stacked, as the sampler runs them), over a KV cache of about ``--context`` positions. The step as
  ``decoding.sample`` runs it (its median forward, plus its draw and loop per step), then its parts, each
  timed alone on the same weights and shapes: the base matmuls (every linear layer of the blocks), the
  per-row LoRA terms (the stacked layers' forward less their base layers'), attention (SDPA over the
  grouped heads with a padding mask), the output layer, the draw (``decoding._draw``), and the rest (the
  step less its parts: norms, rotary, residual adds, cache writes, Python and dispatch), beside the
  operators the step dispatches and what dispatching that many costs (each as fast as a one-element add).
  Floors: the arithmetic (2 x parameters x rows, the output layer included, at the GFLOP/s of a
  ``rows x hidden @ hidden x intermediate`` matmul: ``decode_limit.roofline``) and reading every weight
  once (their bytes at the read bandwidth of a 256 MiB tensor's sum).
- debate: the README's first command (``udpo debate --task arithmetic --n-agents 3 --rounds 2 --limit 8``;
  ``--questions`` sets the limit) in this process, every forward of the model timed (its class's ``forward`` wrapped): prompt passes
  (several new positions over the KV cache), decode steps (one), the rest of ``generate`` (the draw, the
  loop, tokenization) and the rest of the run; prompt passes and steps against their arithmetic floors
  (and the steps against reading the weights once each).
- iteration: one quickstart iteration (``recipes/quickstart.yaml``, with explicit reward coefficients so
  that no warm-up debates run, and no evaluation): its rollout split as the debate's, and its update:
  the log-prob passes with gradients (floor: 3 forwards' arithmetic, forward and backward) and without
  (one), and the rest of the update (backward, objective, optimizer).

Threads: torch's current setting (``UDPO_NUM_THREADS``); say what else ran on the machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "benchmarks")]

#: the README's first command, less its question count and output folder
DEBATE = ["debate", "--task", "arithmetic", "--n-agents", "3", "--rounds", "2"]
#: reward coefficients given, so that a quickstart iteration runs no warm-up debates, and no learning-rate
#: warm-up (the run is that one iteration)
ONE_ITERATION = ["--max_iterations", "1", "--warmup_steps", "0", "--eval_questions", "0",
                 "--warmup_fraction", "0", "--alpha", "0.3", "--beta", "0.3", "--gamma", "0.3",
                 "--lambda_", "1.0", "--eta", "0.01"]  # fmt: skip


@dataclass
class Forward:
    """One call of the model's forward: its rows and new positions, whether it ran over a KV cache and
    with gradients, and its seconds."""

    rows: int
    width: int
    cached: bool
    grad: bool
    seconds: float


@dataclass
class Machine:
    """What the floors are computed from: the model's FLOPs per position, its weights' bytes, the read
    bandwidth and the matmul GFLOP/s at a number of rows (measured once per row count)."""

    model: object
    dtype: object
    flops_per_position: float
    weight_bytes: int
    read_gb_s: float
    _gflops: dict

    def gflops(self, rows: int) -> float:
        from decode_limit import roofline

        rows = max(1, min(rows, 512))  # past a few hundred rows a matmul runs at its large-batch rate
        if rows not in self._gflops:
            self._gflops[rows] = roofline(self.model, rows, self.dtype)[0]
        return self._gflops[rows]

    def arithmetic(self, rows: int, width: int, passes: float = 1.0) -> float:
        """Seconds the arithmetic of ``passes`` forwards over ``rows x width`` positions takes at least."""
        return passes * self.flops_per_position * rows * width / (self.gflops(rows * width) * 1e9)

    def weights_read(self) -> float:
        return self.weight_bytes / (self.read_gb_s * 1e9)


def seconds(fn: Callable[[], object], repeats: int = 5) -> float:
    """The median seconds of ``fn()`` over ``repeats`` calls after one untimed call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def read_bandwidth(mib: int = 256) -> float:
    """GB/s of summing a ``mib`` MiB fp32 tensor (more than the caches hold): what reading weights costs."""
    import torch

    big = torch.ones(mib * 2**18)
    return big.numel() * 4 / seconds(big.sum) / 1e9


def machine(base, dtype) -> Machine:
    from decode_limit import base_parameters, roofline

    gflops, per_token = roofline(base, 1, dtype)
    weights = sum(p.numel() * p.element_size() for _, p in base_parameters(base))
    return Machine(base, dtype, per_token, weights, read_bandwidth(), {1: gflops})


@contextmanager
def recording(model_class) -> Iterator[list[Forward]]:
    """Every call of ``model_class.forward`` (the causal LM under PEFT and the backends) timed into the
    list yielded; the class is restored afterwards."""
    import torch

    original, records = model_class.forward, []

    def forward(self, *args, **kwargs):
        ids = kwargs["input_ids"] if "input_ids" in kwargs else args[0]
        start = time.perf_counter()
        out = original(self, *args, **kwargs)
        records.append(
            Forward(
                rows=ids.shape[0],
                width=ids.shape[1],
                cached=kwargs.get("past_key_values") is not None,
                grad=torch.is_grad_enabled(),
                seconds=time.perf_counter() - start,
            )
        )
        return out

    model_class.forward = forward
    try:
        yield records
    finally:
        model_class.forward = original


@contextmanager
def timing(owner, name: str) -> Iterator[list[float]]:
    """Every call of the method ``owner.name`` timed into the list yielded (restored afterwards)."""
    original, times = getattr(owner, name), []

    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            times.append(time.perf_counter() - start)

    setattr(owner, name, timed)
    try:
        yield times
    finally:
        setattr(owner, name, original)


def count_operators(fn: Callable[[], object]) -> int:
    """The aten operators ``fn()`` dispatches (as a dispatch mode sees them)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += 1
            return func(*args, **(kwargs or {}))

    with Count():
        fn()
    return Count.n


def dispatch_seconds() -> float:
    """Seconds of one operator at its smallest: a one-element add, called from Python."""
    import torch

    a = torch.ones(1)
    return seconds(lambda: [torch.add(a, a) for _ in range(2000)]) / 2000


def step_parts(peft, names: list[str], rows: int, context: int, steps: int, m: Machine) -> dict[str, float]:
    """Seconds of one decode step at ``rows`` (see the module docstring), and of its parts."""
    import torch
    from decode import prompts
    from decode_limit import padded
    from transformers import AutoTokenizer

    from udpo.env.backends import decoding
    from udpo.env.backends.stacked import StackedAdapters

    tokenizer = AutoTokenizer.from_pretrained(peft.get_base_model().name_or_path)
    input_ids, attention = padded(tokenizer, prompts(rows, context, seed=0))
    adapters = [names[k % len(names)] for k in range(rows)]

    def sample(new_tokens: int) -> None:
        torch.manual_seed(0)
        decoding.sample(
            peft, input_ids, attention, max_new_tokens=new_tokens, temperature=0.7, top_p=1.0, stops=set(),
            adapters=adapters,
        )  # fmt: skip

    with recording(type(peft.get_base_model())) as forwards, timing(decoding, "prompt_pass") as prompt:
        start = time.perf_counter()
        sample(steps + 1)
        total = time.perf_counter() - start
    ops = count_operators(lambda: sample(3)) - count_operators(lambda: sample(2))  # one step more
    decode = [f.seconds for f in forwards if f.width == 1]
    loop = (total - prompt[0] - sum(decode)) / len(decode)  # the draw, the bookkeeping: per step
    step = statistics.median(decode) + loop

    base = peft.get_base_model()
    cfg = base.config
    blocks = base.model.layers
    x = {}  # a decode step's activations, one per input width

    def inputs(width: int) -> torch.Tensor:
        return x.setdefault(width, torch.randn(rows, 1, width, dtype=m.dtype))

    from peft.tuners.lora import LoraLayer

    lora = [mod for mod in blocks.modules() if isinstance(mod, LoraLayer)]
    linears = [
        mod for mod in blocks.modules() if isinstance(mod, torch.nn.Linear) and not _in_lora(mod, lora)
    ]
    with torch.no_grad():
        matmuls = seconds(
            lambda: [torch.nn.functional.linear(inputs(w.in_features), w.weight) for w in linears]
        )
        stack = StackedAdapters(peft, capacity=rows, names=adapters)
        stack.select(stack.slots(adapters))
        with stack:
            stacked = seconds(lambda: [layer(inputs(layer.in_features)) for layer in lora])
        bases = seconds(lambda: [layer.base_layer(inputs(layer.in_features)) for layer in lora])
        heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        dim = cfg.hidden_size // heads
        q = torch.randn(rows, heads, 1, dim, dtype=m.dtype)
        # every step attends over the whole buffer (prompt and answer columns; those not written yet masked)
        k = torch.randn(rows, kv_heads, attention.shape[1] + steps + 1, dim, dtype=m.dtype)
        mask = torch.ones(rows, 1, 1, k.shape[2], dtype=torch.bool)
        mask[:, :, :, : k.shape[2] // 8] = False  # some padding, as a batch of unequal prompts has
        sdpa = torch.nn.functional.scaled_dot_product_attention
        attend = seconds(
            lambda: [sdpa(q, k, k, attn_mask=mask, enable_gqa=True) for _ in range(cfg.num_hidden_layers)]
        )
        hidden = inputs(cfg.hidden_size)
        head = seconds(lambda: base.lm_head(hidden))
        logits = base.lm_head(hidden)[:, -1].float()
        uniforms = torch.rand(rows, 1)
        draw = seconds(lambda: decoding._draw(logits.float(), 0.7, 1.0, uniforms))
    parts = {
        "step": step,
        "base matmuls": matmuls,
        "LoRA": stacked - bases,
        "attention": attend,
        "lm head": head,
        "draw": draw,
    }
    parts["rest"] = step - sum(v for k, v in parts.items() if k != "step")
    parts["operators"] = ops
    parts["dispatch"] = ops * dispatch_seconds()
    parts["arithmetic floor"] = m.arithmetic(rows, 1)
    parts["weights floor"] = m.weights_read()
    return parts


def _in_lora(module, lora: list) -> bool:
    """Whether ``module`` is a LoRA layer's A or B (not a base layer)."""
    return any(module is a for layer in lora for a in (*layer.lora_A.values(), *layer.lora_B.values()))


def steps_table(results: dict[int, dict[str, float]]) -> str:
    columns = ["step", "base matmuls", "LoRA", "attention", "lm head", "draw", "rest", "dispatch",
               "arithmetic floor", "weights floor"]  # fmt: skip
    lines = [
        "ms per decode step | " + " | ".join(columns) + " | operators | step / max(floors)",
    ]
    for rows, p in results.items():
        floor = max(p["arithmetic floor"], p["weights floor"])
        cells = " | ".join(f"{1000 * p[c]:.1f}" for c in columns)
        lines.append(f"{rows} rows | {cells} | {p['operators']:.0f} | {p['step'] / floor:.1f}x")
    return "\n".join(lines)


def generation_lines(forwards: list[Forward], generate: float, m: Machine, indent: str = "  ") -> list[str]:
    """The generation part of ``forwards`` (those over a KV cache): prompt passes and decode steps with
    their floors, and ``generate``'s seconds outside the model."""
    prompt = [f for f in forwards if f.cached and f.width > 1]
    decode = [f for f in forwards if f.cached and f.width == 1]
    in_model = sum(f.seconds for f in prompt + decode)
    lines = []
    if prompt:
        floor = sum(m.arithmetic(f.rows, f.width) for f in prompt)
        lines.append(
            f"{indent}prompt passes: {len(prompt)}, {sum(f.rows * f.width for f in prompt)} positions, "
            f"{sum(f.seconds for f in prompt):.2f} s (arithmetic floor {floor:.2f} s)"
        )
    if decode:
        floor = sum(m.arithmetic(f.rows, 1) for f in decode)
        rows = sorted(f.rows for f in decode)
        lines.append(
            f"{indent}decode steps: {len(decode)} (rows {rows[0]}-{rows[-1]}, median {rows[len(rows) // 2]}), "
            f"{sum(f.seconds for f in decode):.2f} s = {1000 * statistics.median(f.seconds for f in decode):.1f} ms "
            f"median (arithmetic floor {floor:.2f} s, reading the weights once a step {len(decode) * m.weights_read():.2f} s)"
        )
    lines.append(
        f"{indent}generate outside the model (draw, loop, tokenization): {generate - in_model:.2f} s"
    )
    return lines


def debate_part(model_class, m: Machine, model: str, questions: int) -> list[str]:
    from udpo.cli import main as udpo
    from udpo.env.backends.hf import HFBackend

    with (
        tempfile.TemporaryDirectory() as out,
        recording(model_class) as forwards,
        timing(HFBackend, "generate") as generate,
    ):
        start = time.perf_counter()
        command = [*DEBATE, "--limit", str(questions)]
        code = udpo([*command, "--model", model, "--output-dir", str(Path(out) / "mad")])
        wall = time.perf_counter() - start
    if code:
        raise SystemExit(f"udpo debate failed ({code})")
    tokens = sum(f.rows for f in forwards if f.cached)  # each pass over the cache draws a token per row
    lines = [
        f"debate ({' '.join(command)}): {wall:.1f} s, {tokens} tokens drawn, {len(generate)} generate calls"
    ]
    lines += generation_lines(forwards, sum(generate), m)
    lines.append(f"  outside generate (loading, prompts, parsing, writing): {wall - sum(generate):.2f} s")
    return lines


def iteration_part(model_class, m: Machine, model: str) -> list[str]:
    from launch_paths import iteration_figures, train_records

    from udpo.config import parse_config
    from udpo.env.backends.hf import HFBackend
    from udpo.training.trainer import Trainer

    with tempfile.TemporaryDirectory() as out:
        argv = ["--config", str(REPO / "recipes/quickstart.yaml"), "--model", model, "--output_dir", out,
                "--progress", "false", *ONE_ITERATION]  # fmt: skip
        with (
            Trainer(parse_config(argv)) as trainer,
            recording(model_class) as forwards,
            timing(HFBackend, "generate") as generate,
            timing(trainer, "update") as update,
        ):
            trainer.train()
        figures = iteration_figures(train_records(Path(out)))
    lines = [
        f"quickstart iteration: rollout {figures['rollout']:.1f} s, reward {figures['reward']:.2f} s, "
        f"update {figures['update']:.1f} s, sync {figures['sync']:.2f} s"
    ]
    lines += generation_lines(forwards, sum(generate), m)
    scored = [f for f in forwards if not f.cached]
    for grad, passes in ((True, 3.0), (False, 1.0)):
        chosen = [f for f in scored if f.grad == grad]
        if chosen:
            floor = sum(m.arithmetic(f.rows, f.width, passes) for f in chosen)
            lines.append(
                f"  log-prob passes {'with' if grad else 'without'} gradients: {len(chosen)}, "
                f"{sum(f.rows * f.width for f in chosen)} positions, {sum(f.seconds for f in chosen):.2f} s "
                f"forward (arithmetic floor {floor:.2f} s{', forward and backward' if grad else ''})"
            )
    rest = sum(update) - sum(f.seconds for f in scored)
    lines.append(f"  rest of the update (backward, objective, optimizer): {rest:.2f} s")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--rows", default="6,24,48", help="decode rows of the steps part, comma-separated")
    parser.add_argument("--context", type=int, default=128, help="prompt words of the steps part")
    parser.add_argument("--steps", type=int, default=8, help="decode steps timed per row count")
    parser.add_argument("--adapters", type=int, default=3)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--questions", type=int, default=8, help="the debate's questions (the README's 8)")
    parser.add_argument("--parts", default="steps,debate,iteration")
    args = parser.parse_args()
    os.environ["UDPO_DTYPE"] = args.dtype  # what dtype auto resolves to in the real runs
    parts = args.parts.split(",")

    from udpo.threads import configure_threads

    configure_threads()
    import torch
    from decode import load

    from udpo.env.backends.attention import use_grouped_sdpa
    from udpo.env.backends.machine import DTYPES, describe_numeric_path
    from udpo.threads import describe

    dtype = DTYPES[args.dtype]
    peft, names = load(args.model, dtype, "cpu", max(1, args.adapters))
    base = peft.get_base_model()
    use_grouped_sdpa(base)
    m = machine(base, dtype)
    capability = torch.backends.cpu.get_cpu_capability()
    print(f"{describe_numeric_path()}; torch kernels: {capability}; {args.dtype}; torch threads {describe()}")
    print(
        f"{m.flops_per_position / 1e9:.3f} GFLOP per position, {m.weight_bytes / 2**20:.0f} MiB of weights, "
        f"read at {m.read_gb_s:.1f} GB/s ({1000 * m.weights_read():.1f} ms); matmul {m.gflops(1):.1f} GFLOP/s at 1 row"
    )
    if "steps" in parts:
        results = {}
        for rows in map(int, args.rows.split(",")):
            results[rows] = step_parts(peft, names, rows, args.context, args.steps, m)
            print(f"{rows} rows: matmul {m.gflops(rows):.1f} GFLOP/s", flush=True)
        print(steps_table(results), flush=True)
    model_class = type(base)
    if "debate" in parts:
        print("\n".join(debate_part(model_class, m, args.model, args.questions)), flush=True)
    if "iteration" in parts:
        print("\n".join(iteration_part(model_class, m, args.model)), flush=True)


if __name__ == "__main__":
    main()
