"""Benchmark: debate rollouts with round batching vs one request per agent call vs one flat call.

    python benchmarks/rollout.py [--backend hf|vllm|both] [--questions 16] [--agents 3] [--rounds 1]
                                 [--max-tokens 64] [--adapters 3] [--repeats 2] [--seed 0]
                                 [--dtype auto|bf16|fp32] [--modes batched,per-agent,flat]
                                 [--max-lora-rank R]

Arithmetic questions (level 1), N agents, T debate rounds, fixed ``max_tokens``, temperature 0.7
and a seed. With ``--adapters K`` (default: one per agent) each agent is served by its own random
LoRA adapter, as in training. Three ways to produce the same debates, measured side by side:

- batched: ``DebateEnv``; every (question, agent) request of a round goes to the backend in one call;
- per-agent: the same debates, one question at a time and one ``generate([request])`` call per
  agent per round (how reference debate implementations drive a model);
- flat: every prompt of the batched run in one single ``generate`` call, with no round barrier
  (the engine's best case for this amount of work; round t+1's prompts need round t's answers,
  so a debate can never do this).

vLLM's prefix cache is emptied before each mode (within a mode it works as in real use: round t+1
extends each agent's round-t conversation).

``--modes`` picks which of the three run (per-agent is the slow one); ``--dtype`` is given to both
backends (auto: the backend's own default, bf16 on a CPU with bf16 matrix units for hf, the
checkpoint's dtype for vllm).

Prints completion tokens per second for each (batched and flat: the best of ``--repeats`` runs,
alternated, since other work on the machine skews single runs) and the ratios batched/flat and
batched/per-agent.
"""

from __future__ import annotations

import argparse
import platform
import tempfile
import time
from dataclasses import dataclass

from udpo.env.backends import Backend, ChatRequest, Completion, SamplingParams, make_backend
from udpo.env.debate import AgentSpec, DebateConfig, DebateEnv
from udpo.env.models import resolve_model
from udpo.env.tasks.arithmetic import Arithmetic

#: the trainer's default adapter shape
LORA = {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}


class CallLog(Backend):
    """Wraps a backend and records every call; ``one_at_a_time`` sends each request alone."""

    def __init__(self, inner: Backend, one_at_a_time: bool = False):
        self.inner = inner
        self.one_at_a_time = one_at_a_time
        self.calls: list[list[ChatRequest]] = []

    def generate(self, requests: list[ChatRequest]) -> list[Completion]:
        self.calls.append(list(requests))
        if self.one_at_a_time:
            return [self.inner.generate([r])[0] for r in requests]
        return self.inner.generate(requests)


@dataclass
class Measure:
    mode: str
    requests: int
    calls: int
    tokens: int
    seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


def random_adapters(model: str, k: int, folder: str) -> dict[str, str]:
    """K LoRA adapters (r=8, attention projections, random non-zero weights) saved as PEFT folders."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    config = LoraConfig(**LORA, init_lora_weights=False)
    base = AutoModelForCausalLM.from_pretrained(resolve_model(model), dtype=torch.float32)
    paths = {}
    for i in range(k):
        torch.manual_seed(1000 + i)
        peft_model = get_peft_model(base, config)
        paths[f"agent{i}"] = f"{folder}/agent{i}"
        peft_model.save_pretrained(paths[f"agent{i}"])
        base = peft_model.unload()
    return paths


def fresh_cache(backend: Backend) -> None:
    """Empty vLLM's prefix cache, so no mode reuses the prompts another mode already computed."""
    llm = getattr(backend, "llm", None)
    if llm is not None:
        llm.reset_prefix_cache()


def debate(backend: Backend, questions, config: DebateConfig, per_agent: bool) -> tuple[Measure, CallLog]:
    fresh_cache(backend)
    log = CallLog(backend, one_at_a_time=per_agent)
    cfg = DebateConfig(**{**config.__dict__, "debate_batch_size": 1 if per_agent else len(questions)})
    env = DebateEnv(Arithmetic(difficulty=1), log, cfg)
    start = time.perf_counter()
    trajectories = env.run(questions, progress=False)
    seconds = time.perf_counter() - start
    tokens = sum(len(turn.completion_ids) for t in trajectories for row in t.turns for turn in row)
    n_requests = sum(len(c) for c in log.calls)
    n_calls = n_requests if per_agent else len(log.calls)
    return Measure("per-agent" if per_agent else "batched", n_requests, n_calls, tokens, seconds), log


def flat(backend: Backend, requests: list[ChatRequest]) -> Measure:
    fresh_cache(backend)
    start = time.perf_counter()
    out = backend.generate(requests)
    seconds = time.perf_counter() - start
    return Measure("flat", len(requests), 1, sum(len(c.completion_ids) for c in out), seconds)


def run_backend(name: str, args, adapters: dict[str, str]) -> list[Measure]:
    options = {"model": args.model, "dtype": args.dtype}
    if name == "vllm":  # LoRA slots sized like the adapters, as the trainer configures them
        rank = args.max_lora_rank or LORA["r"]
        options.update(max_loras=max(1, len(adapters)), max_lora_rank=rank, seed=args.seed)
        options.update(lora_target_modules=LORA["target_modules"], kv_cache_gib=args.kv_cache_gib)
    backend = make_backend(name, **options)
    try:
        for adapter, path in adapters.items():
            backend.load_adapter(adapter, path)
        names = list(adapters) or [None]
        sampling = SamplingParams(temperature=0.7, max_tokens=args.max_tokens, seed=args.seed)
        config = DebateConfig(
            n_agents=args.agents,
            rounds=args.rounds,
            sampling=sampling,
            agents=[AgentSpec(adapter=names[i % len(names)]) for i in range(args.agents)],
        )
        questions = Arithmetic(difficulty=1, n_questions=args.questions).load("test", seed=args.seed)
        # one untimed run: first-call costs (adapter upload, kernel choice per shape) stay out of the timings
        debate(backend, questions, config, per_agent=False)
        results = []
        if "per-agent" in args.modes:
            results.append(debate(backend, questions, config, per_agent=True)[0])
        batched, flat_run = [], []
        for _ in range(args.repeats):  # alternate the two fast modes; keep each one's best run
            measure, log = debate(backend, questions, config, per_agent=False)
            batched.append(measure)
            if "flat" in args.modes:
                flat_run.append(flat(backend, [r for call in log.calls for r in call]))
        best = lambda runs: max(runs, key=lambda m: m.tokens_per_s)  # noqa: E731
        return [best(batched), *results, *([best(flat_run)] if flat_run else [])]
    finally:
        backend.close()


def report(name: str, results: list[Measure]) -> None:
    by = {m.mode: m for m in results}
    print(f"\n[{name}]")
    print(f"{'mode':<10} {'requests':>8} {'calls':>6} {'tokens':>7} {'seconds':>8} {'tokens/s':>9}")
    for m in results:
        print(
            f"{m.mode:<10} {m.requests:>8} {m.calls:>6} {m.tokens:>7} {m.seconds:>8.1f} {m.tokens_per_s:>9.1f}"
        )
    b = by["batched"].tokens_per_s
    for mode in ("flat", "per-agent"):
        if mode in by:
            print(f"batched / {mode:<9} = {b / by[mode].tokens_per_s:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["hf", "vllm", "both"], default="both")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--questions", type=int, default=16)
    parser.add_argument("--agents", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=1, help="debate rounds after round 0")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument(
        "--adapters", type=int, default=None, help="LoRA adapters (default: one per agent; 0: base)"
    )
    parser.add_argument("--kv-cache-gib", type=float, default=1.0, help="vllm KV cache on CPU")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--repeats", type=int, default=2, help="runs of the batched and flat modes (best kept)"
    )
    parser.add_argument(
        "--max-lora-rank", type=int, default=None, help="vllm: LoRA slots' rank (default: the adapters' r)"
    )
    parser.add_argument("--dtype", choices=["auto", "bf16", "fp32"], default="auto", help="both backends")
    parser.add_argument(
        "--modes",
        type=lambda text: set(text.split(",")),
        default={"batched", "per-agent", "flat"},
        help="comma-separated: batched (always run), per-agent, flat",
    )
    args = parser.parse_args()
    n_adapters = args.agents if args.adapters is None else args.adapters
    print(
        f"{args.questions} questions x {args.agents} agents x {args.rounds + 1} rounds, max_tokens={args.max_tokens}, "
        f"temperature 0.7, seed {args.seed}, {n_adapters} LoRA adapter(s), dtype {args.dtype}; {platform.processor() or platform.machine()}"
    )
    with tempfile.TemporaryDirectory(prefix="udpo-rollout-") as folder:
        adapters = random_adapters(args.model, n_adapters, folder) if n_adapters else {}
        for name in ("hf", "vllm") if args.backend == "both" else (args.backend,):
            report(name, run_backend(name, args, adapters))


if __name__ == "__main__":  # the vllm engine starts worker processes
    main()
