"""Run the same tiny trainings on two trees and say whether they did the same thing.

A refactor that claims "no change of behaviour" is checked by this: tiny UDPO (with replay), MAPPO and
RMAAC runs on the digit-answering tiny model of ``tests/tiny_models.py``, each trained for two
iterations, stopped, resumed to four, then evaluated under an AutoTransform attack, on the tree of
``--old`` and on the tree of ``--new`` (two git commits, checked out as temporary worktrees), at the same
paths. Compared: every file the runs write (``.safetensors`` byte for byte, ``.json``/``.jsonl``/``.csv``
with wall-clock fields masked; run locks, which hold a process id, left out) and each command's stdout and stderr (times, rates and memory masked).

    python scripts/same_runs.py --old e4ab44b --new HEAD

Exit status 0 and "identical" when nothing differs; otherwise the first differences, and status 1.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

sys.path.insert(0, str(REPO / "tests"))  # the tiny model and training settings the tests use
from train_helpers import EXPLICIT  # noqa: E402
from train_helpers import TINY as TEST_TINY  # noqa: E402

#: the tests' tiny settings with explicit coefficients, at 3 agents, 12 new tokens, 2 debates a question,
#: two update epochs, fp32, an evaluation every 2 iterations
TINY = {
    **TEST_TINY,
    **EXPLICIT,
    "task_options": {"difficulty": 1, "n_questions": 40},
    "n_agents": 3,
    "max_tokens": 12,
    "temperature": 1.0,
    "debates_per_question": 2,
    "eval_questions": 3,
    "eval_steps": 2,
    "update_epochs": 2,
    "dtype": "fp32",
}
RUNS = {
    "udpo": {"algorithm": "udpo", "replay": True, "replay_fraction": 0.5, "replay_capacity": 8},
    "mappo": {"algorithm": "mappo"},
    "rmaac": {"algorithm": "rmaac"},
}
#: keys whose values are wall-clock measurements (masked before comparing)
TIME_KEY = re.compile(
    r"(time|seconds|_s$|wall|elapsed|duration|per_s|tokens_per|rate|timestamp|date|pid|rss|gib|memory|bytes)",
    re.I,
)
#: times, rates and sizes in printed text
TIME_TEXT = re.compile(r"\d+(\.\d+)?(e[-+]?\d+)?\s?(s|ms|min|h|it/s|s/it|tokens/s|GiB|MiB|GB|MB)\b")


def build_model(folder: Path) -> Path:
    from tiny_models import DIGITS, DIGITS_STOP, build_tiny_llama

    from udpo.env.models import resolve_model

    return Path(
        build_tiny_llama(
            folder,
            resolve_model("smollm2-135m-instruct"),
            initializer_range=0.3,
            favour=DIGITS,
            stop_after_favoured=DIGITS_STOP,
        )
    )


def run_tree(tree: Path, model: Path, out: Path) -> list[str]:
    """Every command's (name, stdout, stderr), the runs written under ``out``."""
    import yaml

    env = {
        **os.environ,
        "PYTHONPATH": str(tree),
        "PYTHONHASHSEED": "0",
        "UDPO_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
    }
    udpo = [sys.executable, "-m", "udpo.cli"]
    texts = []

    def call(name: str, args: list[str]) -> None:
        done = subprocess.run(udpo + args, cwd=tree, env=env, capture_output=True, text=True)
        texts.append(f"== {name} rc={done.returncode}\n{done.stdout}\n-- stderr\n{done.stderr}")
        if done.returncode:  # a command that fails on both sides proves nothing
            raise SystemExit(f"{name} failed on {tree}:\n{texts[-1][-3000:]}")

    for name, overrides in RUNS.items():
        recipe = out / f"{name}.yaml"
        recipe.write_text(
            yaml.safe_dump({**TINY, **overrides, "model": str(model), "output_dir": str(out / name)})
        )
        call(f"{name} 2", ["train", "--config", str(recipe), "--max_iterations", "2"])
        call(f"{name} 4", ["train", "--config", str(recipe), "--max_iterations", "4", "--resume", "latest"])
    call(
        "attack",
        [
            "eval", "--task", "arithmetic", "--limit", "3", "--checkpoint", str(out / "udpo"), "--n-agents", "3",
            "--rounds", "1", "--max-tokens", "12", "--dtype", "fp32", "--attack-eval", "autotransform",
            "--attack-eval-m", "1", "--attack-eval-attacker", "builtin", "--attack-cache", str(out / "cache"),
            "--output-dir", str(out / "attack"), "--no-progress",
        ],
    )  # fmt: skip
    return texts


def masked(value):
    if isinstance(value, dict):
        return {k: ("<t>" if TIME_KEY.search(k) else masked(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [masked(v) for v in value]
    return value


def fingerprint(path: Path) -> str:
    if path.suffix in (".json", ".jsonl"):
        lines = path.read_text().splitlines() if path.suffix == ".jsonl" else [path.read_text()]
        return "\n".join(
            json.dumps(masked(json.loads(line)), sort_keys=True) for line in lines if line.strip()
        )
    if path.suffix in (".csv", ".txt", ".md", ".yaml", ".log"):
        return TIME_TEXT.sub("<t>", path.read_text())
    return hashlib.sha256(path.read_bytes()).hexdigest()


def snapshot(out: Path, texts: list[str]) -> dict[str, str]:
    files = {
        str(p.relative_to(out)): fingerprint(p)
        for p in sorted(out.rglob("*"))
        if p.is_file() and p.name != ".lock"
    }
    files["<commands>"] = TIME_TEXT.sub("<t>", "\n".join(texts))
    return files


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", required=True, help="commit of the tree before the change")
    parser.add_argument("--new", default="HEAD", help="commit of the tree after it (default HEAD)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="same_runs_"))
    model = build_model(work / "model")
    results = {}
    for side in ("old", "new"):
        tree = work / f"tree_{side}"
        subprocess.run(
            ["git", "-C", str(REPO), "worktree", "add", "-q", "--detach", str(tree), getattr(args, side)],
            check=True,
        )
        out = work / "out"  # the same path on both sides
        out.mkdir()
        try:
            results[side] = snapshot(out, run_tree(tree, model, out))
        finally:
            shutil.move(str(out), str(work / f"out_{side}"))
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], check=True)
    old, new = results["old"], results["new"]
    differ = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
    print(
        f"{len(old)} files and the commands' output compared ({args.old} against {args.new}); outputs in {work}"
    )
    if not differ:
        print("identical")
        return 0
    for key in differ[:20]:
        print(f"differs: {key}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
