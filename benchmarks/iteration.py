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

``--json FILE`` is written after every iteration (a run killed mid-way keeps what it finished) and once
more at the end: the iterations asked for and done, the error a failed run ended with (an out-of-memory,
say), and on a GPU the update plan autosize printed (its estimated activations, the decode buffers it set
aside and what the process held before training), which ``benchmarks/gpu_targets.py`` holds each phase's peak against.

``--profile-update FILE``: after the timed iterations, the last iteration's update runs once more, on
the same debates, under ``torch.profiler`` (``benchmarks/profiling.py``), outside the timed figures (the
profiler slows it); FILE gets its breakdown (JSON: the device's busy and idle time, kernel launches, host
syncs, the time of each step the update labels, the top operators), the log-prob passes it ran
(``forward``: passes, positions, tokens, padding, and the limits of a pass: ``rows_per_pass``
(``logprob_batch_size``) and ``positions_per_pass`` (``logprob_token_budget``); ``micro_batches``) and the
timed iterations' median update
(``unprofiled_update_s``). The gzipped Chrome trace goes beside FILE when under 2 MB, else into the run's
folder (``--out``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "scripts"), str(REPO / "benchmarks")]

import check_model  # noqa: E402  (scripts/check_model.py)
import profiling  # noqa: E402  (benchmarks/profiling.py)
from launch_paths import iteration_figures, train_records  # noqa: E402  (benchmarks/launch_paths.py)

TRACE = "update_profile.trace.json.gz"  # --profile-update's trace, in the run's folder


def line(figures: dict[str, float]) -> str:
    return "  ".join(f"{k} {v:.2f}" for k, v in figures.items())


def done_records(run: Path) -> list[dict]:
    """The training iterations ``run`` has logged so far (none before its metrics file exists; a line
    being written is left for the next look)."""
    try:
        return train_records(run)
    except (OSError, json.JSONDecodeError):
        return []


def watch(run: Path, write, stop: threading.Event, every: float = 1.0) -> None:
    """Until ``stop``: ``write(records)`` each time ``run`` has logged another iteration."""
    seen = 0
    while not stop.wait(every):
        records = done_records(run)
        if len(records) > seen:
            seen = len(records)
            write(records)


def keeping(update: Callable, kept: list[dict]) -> Callable:
    """``update``, keeping the (keyword) arguments of its latest call in ``kept``."""

    def call(batch, advantages, fresh_count: int, iteration: int):
        kept[:] = [dict(batch=batch, advantages=advantages, fresh_count=fresh_count, iteration=iteration)]
        return update(**kept[0])

    return call


def profile_update(
    update: Callable, arguments: dict, trainer, device: str, out: Path, train: list[dict], keep: Path
) -> None:
    """One more ``update(**arguments)`` (the trainer's, on the last update's debates, advantages, fresh
    count and iteration) under the profiler; ``keep`` gets its breakdown with the log-prob passes it ran
    (the policy's forward statistics, and the pass limits: rows and positions), the micro-batches and the
    timed median update of ``train`` (the iterations after the first, or the only one), or the error it
    stopped with: a profile that fails fails nothing else. The trace is written to ``out``, and copied
    beside ``keep`` when small."""
    keep.parent.mkdir(parents=True, exist_ok=True)
    try:
        result = profiling.profile_call(lambda: update(**arguments), device, trace=out / TRACE)
    except Exception as err:  # the timed figures are written: report it, go on
        print(f"the profiled update failed: {type(err).__name__}: {err}", flush=True)
        keep.write_text(json.dumps({"error": f"{type(err).__name__}: {err}"}))
        return
    stats, scoring = (
        trainer.policy.forward_stats,
        trainer.updater.scoring(),
    )  # reset by the update: its passes
    result["forward"] = {"passes": stats.passes, "positions": stats.positions, "tokens": stats.tokens,
                         "padding": stats.padding, "empty_passes": stats.empty_passes, "rows": stats.rows,
                         "completions": stats.completions,
                         "rows_per_pass": scoring["batch_size"], "positions_per_pass": scoring["token_budget"],
                         "micro_batches": trainer.updater.micro_batch_count}  # fmt: skip
    result["unprofiled_update_s"] = iteration_figures(train[1:] or train)["update"]
    print(profiling.table(result), flush=True)
    if (result["trace_bytes"] or profiling.TRACE_BYTES) < profiling.TRACE_BYTES:
        shutil.copy(out / TRACE, keep.with_name(keep.name.removesuffix(".json") + ".trace.json.gz"))
    keep.write_text(json.dumps(result, indent=1))


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
    parser.add_argument(
        "--profile-update",
        metavar="FILE",
        help="after the timed iterations, profile the last update once more and write its breakdown here",
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
        header = {
            "shape": args.shape,
            "layers": model.config.num_hidden_layers,
            "parameters": params,
            "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
            "n_agents": config.n_agents,
            "rounds": config.rounds,
            "questions_per_iteration": config.questions_per_iteration,
            "max_tokens": config.max_tokens,
            "iterations_asked": args.iterations,
        }

        def write(train: list[dict], **more) -> None:
            if not args.json:
                return
            each = [iteration_figures([record]) for record in train]
            after = iteration_figures(train[1:]) if len(train) > 1 else None
            record = {**header, "iterations": each, "after_first": after, **more}
            tmp = Path(f"{args.json}.tmp")
            tmp.write_text(json.dumps(record, indent=2))
            tmp.replace(args.json)  # a reader never meets a file half written

        plan: dict[str, float] = {}
        stop = threading.Event()
        watcher = threading.Thread(target=watch, args=(root / "run", lambda t: write(t, **plan), stop))
        try:
            with Trainer(config, model=model, tokenizer=tokenizer) as trainer:
                update = trainer.update_plan
                if device == "cuda" and update.peak_bytes is not None:
                    plan = {
                        "plan_held_gib": torch.cuda.memory_allocated() / 2**30,
                        "plan_activations_gib": update.peak_bytes / 2**30,
                        "plan_kept_gib": update.kept_bytes / 2**30,
                        "plan_free_gib": (update.free_bytes or 0) / 2**30,
                    }
                run_update, last = trainer.update, []  # the last update's arguments (--profile-update)
                if args.profile_update:
                    trainer.update = keeping(run_update, last)
                watcher.start()
                trainer.train()
                if last:
                    stop.set()
                    watcher.join()
                    train = train_records(root / "run")
                    write(train, **plan)  # the timed figures first: a profile cut short loses none of them
                    profile_update(
                        run_update, last[0], trainer, device, root, train, Path(args.profile_update)
                    )
        except BaseException as err:  # an out-of-memory among them: what was done is kept, with the error
            stop.set()
            if watcher.is_alive():
                watcher.join()
            write(done_records(root / "run"), **plan, error=f"{type(err).__name__}: {err}")
            raise
        stop.set()
        if watcher.is_alive():
            watcher.join()
        train = train_records(root / "run")
        each = [iteration_figures([record]) for record in train]
        for record, figures in zip(train, each, strict=True):
            print(f"iteration {record['iteration']}: {line(figures)}")
        after = iteration_figures(train[1:]) if len(train) > 1 else None
        if after is not None:
            print(f"after the first ({len(train) - 1} iterations, median): {line(after)}")
        write(train, **plan)


if __name__ == "__main__":
    main()
