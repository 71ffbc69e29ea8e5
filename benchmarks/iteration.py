"""Benchmark: a recipe's first training iterations on a model shape built in memory, with their split.

    python benchmarks/iteration.py --config RECIPE [--shape 135m|1b|7b] [--layers N] [--iterations 2]
        [--out DIR] [KEY VALUE ...]

Builds ``--shape`` (``scripts/check_model.py``: SmolLM2-135M's, Llama-3.2-1B's or Llama-2-7B's
architecture, random weights) on the device it trains on, CUDA where there is one: the 7B shape's 13 GB of
bf16 weights never touch the disk (its folder gets the config and the tokenizer alone). Then trains the
recipe on it in this process for ``--iterations`` iterations (extra ``KEY VALUE`` pairs override it, as
``--KEY VALUE`` would; the update's sizes are the recipe's, auto by default) and prints each iteration's
seconds (rollout, reward, update, sync), rollout tokens/s and peak memory (GPUs: the iteration's and the
rollout's and update's apart; CPUs: their resident peaks), then the same over the iterations after the
first (the first compiles the decode step on a GPU). ``--out DIR`` keeps the run folder (default: a
temporary folder).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "scripts"), str(REPO / "benchmarks")]

import check_model  # noqa: E402  (scripts/check_model.py)
from multiprocess import iteration_figures, train_records  # noqa: E402  (benchmarks/multiprocess.py)


def line(figures: dict[str, float]) -> str:
    return "  ".join(f"{k} {v:.2f}" for k, v in figures.items())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", required=True, help="training recipe (YAML)")
    parser.add_argument("--shape", choices=sorted(check_model.SHAPES), default="135m")
    parser.add_argument("--layers", type=int, default=None, help="default: the shape's")
    parser.add_argument("--iterations", type=int, default=2)
    parser.add_argument("--out", help="keep the run folder here (default: a temporary folder)")
    parser.add_argument(
        "--json", help="also write the figures to this file (benchmarks/gpu_targets.py reads it)"
    )
    parser.add_argument("extra", nargs="*", help="KEY VALUE pairs overriding the recipe")
    args = parser.parse_args()
    if len(args.extra) % 2:
        parser.error("extra settings come in KEY VALUE pairs")

    from udpo.threads import configure_threads

    configure_threads()
    import torch

    from udpo.config import parse_config
    from udpo.training.trainer import Trainer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    extra = [x for k, v in zip(args.extra[::2], args.extra[1::2], strict=True) for x in (f"--{k}", v)]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.out or tmp)
        model, tokenizer = check_model.build_in_memory(
            root / "model", args.layers, shape=args.shape, device=device
        )
        params = sum(p.numel() for p in model.parameters())
        print(
            f"{args.shape} shape, {model.config.num_hidden_layers} layers, {params / 1e9:.2f}B parameters "
            f"({next(model.parameters()).dtype}) built on {device}",
            flush=True,
        )
        argv = ["--config", args.config, "--model", str(root / "model"), "--output_dir", str(root / "run"),
                "--max_iterations", str(args.iterations), "--progress", "false", *extra]  # fmt: skip
        config = parse_config(argv)
        with Trainer(config, model=model, tokenizer=tokenizer) as trainer:
            trainer.train()
        train = train_records(root / "run")
        each = [iteration_figures([record]) for record in train]
        for record, figures in zip(train, each, strict=True):
            print(f"iteration {record['iteration']}: {line(figures)}")
        after = iteration_figures(train[1:]) if len(train) > 1 else None
        if after is not None:
            print(f"after the first ({len(train) - 1} iterations, median): {line(after)}")
        if args.json:
            record = {
                "shape": args.shape,
                "layers": model.config.num_hidden_layers,
                "parameters": params,
                "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                "n_agents": config.n_agents,
                "rounds": config.rounds,
                "questions_per_iteration": config.questions_per_iteration,
                "max_tokens": config.max_tokens,
                "iterations": each,
                "after_first": after,
            }
            Path(args.json).write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
