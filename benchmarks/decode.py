"""Benchmark: the hf backend's decode paths side by side, and the anchor, transformers' static-cache generate.

    python benchmarks/decode.py [--model PATH] [--shape 135m|1b|7b] [--rows 96] [--prompt-tokens 48] [--max-tokens 64]
                                [--adapters 3] [--paths eager,stacked] [--anchor] [--threads N]
                                [--dtype auto|bf16|fp32] [--repeats 2] [--seed 0]

One batch of ``rows`` chat prompts of about ``--prompt-tokens`` tokens, sampled at temperature 1 for
``--max-tokens`` new tokens through :class:`~udpo.env.backends.hf.HFBackend` (one ``generate`` call, as
a debate round makes), once per decode path (``--paths``; see ``pick_decode``: auto is graph on CUDA,
eager on CPU; ``graph_static`` is the graph with a compile per bucket shape, ``decode_shapes="static"``,
beside the default's one compile for all), each with ``--adapters`` random LoRA adapters (row k runs
adapter k mod K: every call mixes them) and with none. ``--bare-paths`` picks the paths also run without adapters
(default: all of them). ``--anchor`` adds ``generate(cache_implementation="static")`` on the plain
model (transformers compiles its decode step as a CUDA graph on GPU; on CPU it runs uncompiled), the
figure the GPU path is measured against.

Every path gets one untimed call first (compilation, capture, buffer allocation: its seconds are printed
as "first call"), then the best of ``--repeats`` timed calls, the paths alternating. Prints tokens/s and ms per step for each,
the stacked/eager ratio, and each path's ratio to the anchor; the CPU's name and the torch threads
(set explicitly) head the output.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from udpo.env.backends import ChatRequest, SamplingParams
from udpo.env.backends.hf import HFBackend
from udpo.env.backends.machine import cpu_model, pick_decode, pick_dtype
from udpo.env.models import resolve_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import check_model  # noqa: E402  (scripts/check_model.py)

#: the trainer's default adapter shape
LORA = {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}
ANCHOR = "generate(static)"
#: the CUDA graph compiled per bucket shape (HFBackend's decode_shapes="static")
STATIC_GRAPH = "graph_static"
WORDS = [
    "what",
    "is",
    "the",
    "sum",
    "of",
    "these",
    "two",
    "numbers",
    "check",
    "each",
    "step",
    "and",
    "give",
    "the",
    "final",
    "answer",
]


@dataclass
class Measure:
    path: str
    adapters: int
    tokens: int
    seconds: float
    steps: int
    first_call: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


def prompts(rows: int, n_tokens: int, seed: int) -> list[list[dict[str, str]]]:
    """``rows`` different user messages of about ``n_tokens`` words."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(rows):
        picks = torch.randint(len(WORDS), (n_tokens,), generator=gen).tolist()
        out.append([{"role": "user", "content": " ".join(WORDS[i] for i in picks)}])
    return out


def load(
    model: str,
    dtype: torch.dtype,
    device: str,
    adapters: int,
    shape: str | None = None,
    layers: int | None = None,
):
    """The model, with ``adapters`` random LoRA adapters (non-zero B) named agent0, agent1, ...; the
    adapters' names. With a ``shape`` (scripts/check_model.py's), the model is that shape built in memory
    on ``device`` (random weights, ``layers`` of them if given; ``model``, a folder, gets its config and
    tokenizer alone)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    if shape is not None:
        base = check_model.build_in_memory(model, layers, shape=shape, device=device)[0].to(dtype).eval()
    else:
        base = AutoModelForCausalLM.from_pretrained(resolve_model(model), dtype=dtype).to(device).eval()
    if not adapters:
        return base, []
    names = [f"agent{i}" for i in range(adapters)]
    config = LoraConfig(**LORA, init_lora_weights=False)
    torch.manual_seed(1000)
    peft_model = get_peft_model(base, config, adapter_name=names[0])
    for name in names[1:]:
        peft_model.add_adapter(name, config)
    return peft_model.to(device).eval(), names


def side_by_side(calls: dict[str, Callable[[], int]], repeats: int) -> dict[str, tuple[float, float, int]]:
    """Per call: (first call's seconds, best timed call's seconds, tokens of that call). The timed calls
    alternate (every call once per repeat), so a change of load on the machine meets all of them."""

    def once(call: Callable[[], int]) -> tuple[float, int]:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        tokens = call()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return time.perf_counter() - start, tokens

    first = {name: once(call)[0] for name, call in calls.items()}
    runs: dict[str, list[tuple[float, int]]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            runs[name].append(once(call))
    return {name: (first[name], *min(runs[name])) for name in calls}


def backend_call(model, tokenizer, device, path, names, args) -> tuple[HFBackend, Callable[[], int]]:
    """An HFBackend decoding with ``path``, and one ``generate`` call of the batch through it (its tokens)."""
    decode, shapes = ("graph", "static") if path == STATIC_GRAPH else (path, "dynamic")
    backend = HFBackend(
        model_obj=model, tokenizer=tokenizer, device=device, decode=decode, decode_shapes=shapes,
        max_batch=args.rows,
    )  # fmt: skip
    sampling = SamplingParams(temperature=1.0, max_tokens=args.max_tokens, seed=args.seed)
    slots = names or [None]
    requests = [
        ChatRequest(messages, sampling, adapter=slots[k % len(slots)])
        for k, messages in enumerate(prompts(args.rows, args.prompt_tokens, args.seed))
    ]
    return backend, lambda: sum(len(c.completion_ids) for c in backend.generate(requests))


def anchor_call(model, tokenizer, device, args) -> Callable[[], int]:
    """``generate`` with a static cache, sampling exactly ``max_tokens`` per row (no early stop)."""
    texts = [
        tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=False)
        for m in prompts(args.rows, args.prompt_tokens, args.seed)
    ]
    tokenizer.padding_side = "left"
    batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
    kwargs = dict(do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=args.max_tokens)
    kwargs |= dict(
        min_new_tokens=args.max_tokens, cache_implementation="static", pad_token_id=tokenizer.pad_token_id
    )

    @torch.no_grad()
    def call() -> int:
        out = model.generate(**batch, **kwargs)
        return (out.shape[1] - batch["input_ids"].shape[1]) * out.shape[0]

    return call


def path_label(path: str, backend: HFBackend, device: str) -> str:
    """The path's name as measured: for auto, the path it chose (after a failed graph, the one it fell
    back to); with the shapes that met dynamo's recompile limit and decoded uncompiled, if any."""
    notes = []
    if path == "auto":
        notes.append(backend.decode)
        if backend.decode != pick_decode("auto", device):
            notes.append("graph failed")
    uncompiled = len(backend._static.uncompiled) if backend._static is not None else 0
    if uncompiled:
        notes.append(f"{uncompiled} shape(s) uncompiled: recompile limit")
    return f"{path} ({', '.join(notes)})" if notes else path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument(
        "--shape",
        choices=["135m", "1b", "7b"],
        help="build this shape in memory on the device (random weights; --model: the folder for its config "
        "and tokenizer) instead of loading --model",
    )
    parser.add_argument("--rows", type=int, default=96)
    parser.add_argument(
        "--prompt-tokens", type=int, default=48, help="words per prompt (about as many tokens)"
    )
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--adapters", type=int, default=3, help="LoRA adapters mixed over the rows (0: none)")
    parser.add_argument(
        "--paths",
        default="eager,stacked",
        help=f"comma-separated: auto, eager, stacked, graph, {STATIC_GRAPH}",
    )
    parser.add_argument(
        "--bare-paths",
        help="the paths also measured without adapters (comma-separated; default: --paths; '' for none)",
    )
    parser.add_argument("--anchor", action="store_true", help="add transformers' static-cache generate")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch CPU threads")
    parser.add_argument("--dtype", choices=["auto", "bf16", "fp32"], default="auto")
    parser.add_argument("--repeats", type=int, default=2, help="timed calls per path (best kept)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--json", help="also write the figures to this file (benchmarks/gpu_targets.py reads it)"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = pick_dtype(args.dtype, device)
    gpu = torch.cuda.get_device_name() if device == "cuda" else "no GPU"
    print(f"CPU {cpu_model()}, {torch.get_num_threads()} torch threads; {gpu}; torch {torch.__version__}")
    print(
        f"{args.rows} rows x {args.max_tokens} new tokens, prompts of ~{args.prompt_tokens} words, "
        f"{str(dtype).removeprefix('torch.')}, temperature 1, model {args.model}"
    )
    from transformers import AutoTokenizer

    if args.shape:  # the config and tokenizer written, no weights (the meta device holds none)
        check_model.build_in_memory(args.model, shape=args.shape, device="meta")
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(args.model))
    paths = [p for p in args.paths.split(",") if p]
    bare = paths if args.bare_paths is None else [p for p in args.bare_paths.split(",") if p]
    results: list[Measure] = []

    def write() -> None:  # after each group: a run cut short keeps the groups it finished
        if args.json:
            figures = [{**asdict(m), "tokens_per_s": m.tokens_per_s} for m in results]
            record = {
                "device": gpu if device == "cuda" else f"CPU {cpu_model()}",
                "dtype": str(dtype).removeprefix("torch."),
                "model": args.model,
                "rows": args.rows,
                "max_tokens": args.max_tokens,
                "results": figures,
            }
            Path(args.json).write_text(json.dumps(record, indent=2))

    for k in sorted({args.adapters, 0}, reverse=True):
        group = bare if k == 0 and args.adapters else paths
        if not group and not (k == 0 and args.anchor):
            continue
        model, names = load(args.model, dtype, device, k, args.shape)
        backends = {path: backend_call(model, tokenizer, device, path, names, args) for path in group}
        calls = {path: call for path, (_, call) in backends.items()}
        if k == 0 and args.anchor:
            calls[ANCHOR] = anchor_call(model, tokenizer, device, args)
        for name, (first, seconds, tokens) in side_by_side(calls, args.repeats).items():
            if name in backends:
                name = path_label(name, backends[name][0], device)
            results.append(Measure(name, len(names), tokens, seconds, args.max_tokens, first))
        for backend, _ in backends.values():
            backend.close()
        del model, calls, backends
        write()
    print(
        f"\n{'path':<18} {'adapters':>8} {'tokens':>7} {'seconds':>8} {'tok/s':>9} {'ms/step':>8} {'first call':>10}"
    )
    for m in results:
        print(
            f"{m.path:<18} {m.adapters:>8} {m.tokens:>7} {m.seconds:>8.2f} {m.tokens_per_s:>9.1f} "
            f"{1000 * m.seconds / m.steps:>8.1f} {m.first_call:>9.1f}s"
        )
    by = {(m.path, m.adapters): m for m in results}
    for k in sorted({args.adapters, 0}, reverse=True):
        if ("stacked", k) in by and ("eager", k) in by:
            ratio = by["stacked", k].tokens_per_s / by["eager", k].tokens_per_s
            print(f"stacked / eager, {k} adapters: {ratio:.2f}x")
    anchor = by.get((ANCHOR, 0))
    if anchor is not None:
        for m in results:
            if m is not anchor:
                print(
                    f"{m.path}, {m.adapters} adapters / generate(static): {m.tokens_per_s / anchor.tokens_per_s:.2f}x"
                )


if __name__ == "__main__":
    main()
