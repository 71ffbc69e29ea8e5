"""Benchmark: a training process's resident memory with and without handing freed heap back each iteration.

    UDPO_NUM_THREADS=1 python benchmarks/host_memory.py [--iterations 16] [--model tiny | NAME]
        [--recipe recipes/study/preregistered.yaml]

Trains the recipe (no evaluations, its other settings as written) twice in fresh interpreters on one
model: once as the trainer does (``udpo.training.memory.trim_heap`` after every iteration) and once with
that call replaced by a no-op. Both read ``memory/rss_gib`` from their ``metrics.jsonl``. The default
model is SmolLM2-135M-Instruct's shape cut to 2 layers with random weights (built in a temporary folder
from the real tokenizer): the same vocabulary, widths and packed-row shapes as the real model, in a
fraction of its time per iteration. Prints the resident GiB per iteration side by side, the final
ratio and the median seconds per iteration of each.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from udpo.env.run_folder import RunFolder

REPO = Path(__file__).resolve().parents[1]

CHILD = """
import json, sys
import udpo.training.memory as memory
if sys.argv[1] == "off":
    memory.trim_heap = lambda: False
from udpo.api import UDPOConfig, UDPOTrainer
from udpo.config.recipes import load_yaml
recipe = {**load_yaml(sys.argv[2]), **json.loads(sys.argv[3])}
with UDPOTrainer(args=UDPOConfig(**recipe)) as trainer:
    trainer.train()
"""


def tiny_smollm2(folder: Path) -> str:
    """SmolLM2-135M-Instruct's config with 2 layers and random weights, saved with its tokenizer."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from udpo.env.models import resolve_model

    real = resolve_model("smollm2-135m-instruct")
    config = AutoConfig.from_pretrained(real)
    config.num_hidden_layers = 2
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(str(folder))
    AutoTokenizer.from_pretrained(real).save_pretrained(str(folder))
    return str(folder)


def run(mode: str, recipe: str, settings: dict) -> list[dict]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, mode, recipe, json.dumps(settings)],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"training ({mode}) failed ({done.returncode}):\n{done.stderr[-3000:]}")
    lines = RunFolder(Path(settings["output_dir"])).metrics.read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("kind") == "train"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iterations", type=int, default=16)
    p.add_argument("--model", default="tiny", help="tiny (2-layer SmolLM2 shape) or a model name or folder")
    p.add_argument("--recipe", default=str(REPO / "recipes" / "study" / "preregistered.yaml"))
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        model = tiny_smollm2(Path(tmp) / "model") if args.model == "tiny" else args.model
        rows = {}
        for mode in ("on", "off"):
            settings = {
                "model": model,
                "max_iterations": args.iterations,
                "eval_questions": 0,
                "eval_steps": 0,
                "save_steps": args.iterations,
                "progress": False,
                "output_dir": str(Path(tmp) / f"run_{mode}"),
            }
            rows[mode] = run(mode, args.recipe, settings)
    print(f"model {args.model}, recipe {Path(args.recipe).name}, {args.iterations} iterations")
    print(f"{'iteration':>9} {'trim off GiB':>12} {'trim on GiB':>11}")
    for off, on in zip(rows["off"], rows["on"], strict=True):
        print(f"{off['iteration']:>9} {off['memory/rss_gib']:>12.2f} {on['memory/rss_gib']:>11.2f}")
    last_off, last_on = rows["off"][-1]["memory/rss_gib"], rows["on"][-1]["memory/rss_gib"]
    print(
        f"final resident memory: trim off {last_off:.2f} GiB, on {last_on:.2f} GiB, ratio {last_off / last_on:.2f}x"
    )
    seconds = {m: statistics.median(r["time/rollout"] + r["time/update"] for r in rows[m]) for m in rows}
    print(f"median s/iteration (rollout + update): trim off {seconds['off']:.1f}, on {seconds['on']:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
