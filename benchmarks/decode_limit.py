"""Benchmark: how close generation comes to the hardware's limit at the decode shape.

    python benchmarks/decode_limit.py [--backend hf|vllm|both] [--dtype auto|fp32|bf16] [--batch 48]
                                      [--max-tokens 32] [--steps 16] [--adapters 3] [--compile]
                                      [--model smollm2-135m-instruct]

Numbers at one shape (``--batch`` arithmetic prompts of about 90 tokens, ``--max-tokens`` new
tokens each), measured in one run:

- the matmul roofline: a ``batch x hidden @ hidden x intermediate`` matmul in ``--dtype``, its GFLOPS
  divided by the model's FLOPs per generated token (2 x the parameters a token passes through, the
  output layer included): what the arithmetic alone would allow;
- the bare decode step: one forward of ``batch x 1`` token over a KV cache of the prompts' length
  (``--steps`` of them, no sampling, no stopping checks): what the model's own forward costs, with the
  attention the hf backend uses (``sdpa_gqa``; ``--stock-attention``: transformers' ``sdpa``);
- achieved: the backend's ``generate`` of the same prompts (temperature 1, ``max_tokens``), completion
  tokens per second; and the hf backend again with the rows spread over ``--adapters`` LoRA adapters,
  as in a debate (each agent its own adapter, all in one batch).
- with ``--compile``: the decode step over a static KV buffer (the sampler's), eager and compiled by
  ``torch.compile`` (inductor, freezing), and how many steps repay the compilation at this shape.

Prints each as tokens/s and the ratios achieved / bare step and achieved / roofline. Threads: torch's
current setting (``UDPO_NUM_THREADS`` / ``OMP_NUM_THREADS``); say what else ran on the machine.

``--dtype`` defaults to ``auto``, resolved as ``dtype: auto`` is for the work measured here, generation
(``udpo.env.backends.machine.choose_dtype(..., work="generate")``): what ``UDPO_DTYPE`` forces, else fp32
on a CPU without bf16 matrix units, else the faster of bf16 and fp32 in the probed decode step of the
model's shape (cached); the line it prints names the dtype and why.
"""

from __future__ import annotations

import argparse
import time

import torch

from udpo.env.backends import ChatRequest, SamplingParams, make_backend
from udpo.env.backends.chat import chat_prompt_ids
from udpo.env.backends.machine import DTYPES, choose_dtype, dtype_name
from udpo.env.models import resolve_model
from udpo.env.tasks.arithmetic import Arithmetic


def prompts(n: int) -> list[list[dict[str, str]]]:
    task = Arithmetic(difficulty=1, n_questions=max(n, 8))
    questions = task.load("test")[:n]
    system = {"role": "system", "content": "You are one of several solvers checking each other's arithmetic."}
    return [[system, {"role": "user", "content": task.prompt(q)}] for q in questions]


def roofline(model, batch: int, dtype: torch.dtype, repeats: int = 20) -> tuple[float, float]:
    """(GFLOPS of the decode-shaped matmul, FLOPs per generated token)."""
    cfg = model.config
    a = torch.randn(batch, cfg.hidden_size, dtype=dtype)
    b = torch.randn(cfg.hidden_size, cfg.intermediate_size, dtype=dtype)
    a @ b  # warm-up
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    seconds = (time.perf_counter() - start) / repeats
    gflops = 2 * batch * cfg.hidden_size * cfg.intermediate_size / seconds / 1e9
    per_token = 2 * sum(p.numel() for n, p in base_parameters(model) if "embed_tokens" not in n)
    if getattr(cfg, "tie_word_embeddings", False):
        per_token += 2 * cfg.vocab_size * cfg.hidden_size  # the output layer shares the embedding
    return gflops, per_token


def base_parameters(model) -> list:
    """``model``'s named parameters less any LoRA adapters' (a row passes through one adapter, not all)."""
    return [(n, p) for n, p in model.named_parameters() if "lora_" not in n]


def padded(tokenizer, chats: list) -> tuple[torch.Tensor, torch.Tensor]:
    """The chats' prompts, left-padded: (input ids, attention mask)."""
    ids = [chat_prompt_ids(tokenizer, c, {}) for c in chats]
    width = max(map(len, ids))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    input_ids = torch.tensor([[pad] * (width - len(x)) + x for x in ids])
    attention = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids])
    return input_ids, attention


@torch.no_grad()
def bare_decode(model, tokenizer, chats: list, steps: int) -> float:
    """Tokens/s of ``steps`` forward passes of one token per row over the prompts' KV cache."""
    input_ids, attention = padded(tokenizer, chats)
    out = model(input_ids=input_ids, attention_mask=attention, use_cache=True)
    cache, token = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
    ones = torch.ones(len(chats), 1, dtype=attention.dtype)
    times = []
    for _ in range(steps):
        attention = torch.cat([attention, ones], dim=1)
        start = time.perf_counter()
        out = model(input_ids=token, attention_mask=attention, past_key_values=cache, use_cache=True)
        times.append(time.perf_counter() - start)
        cache, token = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
    times.sort()
    return len(chats) / times[len(times) // 2]  # the median step


@torch.no_grad()
def static_decode(model, tokenizer, chats: list, steps: int, compiled: bool) -> tuple[float, float]:
    """(tokens/s of the median step, seconds of the first step) of the decode step over a static KV
    buffer, as the hf sampler runs it: eager, or ``torch.compile``d by inductor with freezing (weights
    folded in and prepacked for oneDNN). The first compiled step includes the compilation."""
    from transformers import StaticCache

    input_ids, attention = padded(tokenizer, chats)
    rows, width = input_ids.shape
    cache = StaticCache(config=model.config, max_cache_len=width + steps + 1)
    attention = torch.cat([attention, attention.new_ones(rows, steps + 1)], dim=1)
    positions = (attention[:, :width].cumsum(-1) - 1).clamp(min=0)

    def step(token, positions):
        return model(
            input_ids=token,
            attention_mask=attention,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
        ).logits

    out = step(input_ids, positions)
    token, positions = out[:, -1].argmax(-1, keepdim=True), positions[:, -1:] + 1
    if compiled:
        from torch._inductor import config as inductor

        inductor.freezing = True
        step = torch.compile(step, dynamic=False)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        out = step(token, positions)
        times.append(time.perf_counter() - start)
        token, positions = out[:, -1].argmax(-1, keepdim=True), positions + 1
    rest = sorted(times[1:])
    return rows / rest[len(rest) // 2], times[0]


def achieved(backend, chats: list, max_tokens: int) -> float:
    sampling = SamplingParams(temperature=1.0, max_tokens=max_tokens, seed=0)
    requests = [ChatRequest(c, sampling) for c in chats]
    backend.generate(requests[:2])  # warm-up
    start = time.perf_counter()
    done = backend.generate(requests)
    return sum(len(c.completion_ids) for c in done) / (time.perf_counter() - start)


def with_adapters(model, tokenizer, chats: list, max_tokens: int, n: int) -> float:
    """Tokens/s of the hf backend when the rows are spread over ``n`` LoRA adapters (non-zero, r=8, every
    linear layer of the blocks), the way a debate's agents share one batch. Wraps ``model`` in place."""
    from peft import LoraConfig, get_peft_model

    from udpo.env.backends.hf import HFBackend

    config = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", init_lora_weights=False)
    peft = get_peft_model(model, config, adapter_name="agent_0")
    for k in range(1, n):
        peft.add_adapter(f"agent_{k}", config)
    backend = HFBackend(model_obj=peft.eval(), tokenizer=tokenizer)
    sampling = SamplingParams(temperature=1.0, max_tokens=max_tokens, seed=0)
    requests = [ChatRequest(c, sampling, adapter=f"agent_{k % n}") for k, c in enumerate(chats)]
    backend.generate(requests[:2])  # warm-up
    start = time.perf_counter()
    done = backend.generate(requests)
    return sum(len(c.completion_ids) for c in done) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backend", choices=["hf", "vllm", "both"], default="hf")
    parser.add_argument(
        "--dtype",
        choices=["auto", "fp32", "bf16"],
        default="auto",
        help="default: dtype auto's for generation",
    )
    parser.add_argument("--batch", type=int, default=48)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument(
        "--compile", action="store_true", help="also time the static-buffer step eager and torch.compile'd"
    )
    parser.add_argument(
        "--adapters", type=int, default=3, help="also time hf with rows over N LoRA adapters (0: no)"
    )
    parser.add_argument(
        "--stock-attention", action="store_true", help="time the bare step with transformers' sdpa attention"
    )
    args = parser.parse_args()
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from udpo.env.backends.attention import use_grouped_sdpa

    path = resolve_model(args.model)
    choice = choose_dtype(args.dtype, "cpu", "generate", AutoConfig.from_pretrained(path))
    print(choice.describe())
    args.dtype = dtype_name(choice.dtype)
    dtype = DTYPES[args.dtype]
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    if not args.stock_attention:
        use_grouped_sdpa(model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    chats = prompts(args.batch)
    gflops, per_token = roofline(model, args.batch, dtype)
    limit = gflops * 1e9 / per_token
    step = bare_decode(model, tokenizer, chats, args.steps)
    print(
        f"threads {torch.get_num_threads()}, {args.dtype}, batch {args.batch}, {args.max_tokens} new tokens"
    )
    print(f"matmul {gflops:.0f} GFLOPS, {per_token / 1e9:.3f} GFLOP per token: roofline {limit:.0f} tokens/s")
    print(f"bare decode step: {step:.0f} tokens/s ({step / limit:.1%} of the roofline)")
    if args.compile:
        eager, _ = static_decode(model, tokenizer, chats, args.steps, compiled=False)
        fast, first = static_decode(model, tokenizer, chats, args.steps, compiled=True)
        saved = 1 / eager - 1 / fast  # seconds per token
        print(
            f"static-buffer step: eager {eager:.0f} tokens/s, torch.compile (inductor, freezing) {fast:.0f} "
            f"tokens/s ({fast / eager:.2f}x); compiling took {first:.1f} s, paid back after "
            f"{first / saved / args.batch:.0f} steps of {args.batch} rows ({first / saved:.0f} tokens) at this shape"
        )
    for name in ("hf", "vllm") if args.backend == "both" else (args.backend,):
        options = {"model_obj": model, "tokenizer": tokenizer} if name == "hf" else {"model": path}
        backend = make_backend(name, dtype=args.dtype, **options)
        try:
            rate = achieved(backend, chats, args.max_tokens)
        finally:
            backend.close()
        print(
            f"{name} generate: {rate:.0f} tokens/s = {rate / step:.1%} of the bare step, {rate / limit:.1%} of the roofline"
        )
    if args.adapters:
        rate = with_adapters(model, tokenizer, chats, args.max_tokens, args.adapters)
        print(
            f"hf generate, rows over {args.adapters} LoRA adapters: {rate:.0f} tokens/s = {rate / step:.1%} of the "
            f"bare step, {rate / limit:.1%} of the roofline"
        )


if __name__ == "__main__":
    main()
