"""Tiny training settings shared by the trainer tests (real SmolLM2, seconds per iteration on 2 cores)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]

#: N=2 agents, T=1 round, 16 new tokens, 2 one-digit additions per iteration
TINY = {
    "task": "arithmetic",
    "task_options": {"difficulty": 1, "n_questions": 30},
    "n_agents": 2,
    "rounds": 1,
    "max_tokens": 16,
    "questions_per_iteration": 2,
    "debate_batch_size": 4,
    "learning_rate": 1e-3,
    "warmup_steps": 0,
    "lr_scheduler_type": "constant",
    "eval_questions": 2,
    "save_steps": 1,
    "progress": False,
}
#: explicit coefficients: no warm-up calibration debates
EXPLICIT = {
    "warmup_fraction": 0.0,
    "alpha": [0.3],
    "beta": [0.3],
    "gamma": [0.3],
    "lambda_": [1.0],
    "eta": [0.01],
}


def tiny_config(model_path: str, output_dir: Path, **overrides):
    from udpo.config import TrainConfig

    return TrainConfig(**{**TINY, "model": model_path, "output_dir": str(output_dir), **overrides})


def write_recipe(path: Path, model_path: str, **overrides) -> Path:
    path.write_text(yaml.safe_dump({**TINY, "model": model_path, **overrides}))
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def start(recipe: Path, *extra: str) -> subprocess.Popen:
    """``python train_udpo.py --config recipe ...`` in the background, stdout and stderr together."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, str(REPO / "train_udpo.py"), "--config", str(recipe), *extra]
    return subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def token_parity(trajectory, agent: int) -> float:
    """Share of even token ids in the agent's last completion: a reward that differs between debates even
    for a tiny random model that never answers right (tests of the update's mechanics use it)."""
    ids = trajectory.turns[agent][-1].completion_ids
    return sum(1 for t in ids if t % 2 == 0) / max(len(ids), 1)
