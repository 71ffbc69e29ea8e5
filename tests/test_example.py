"""The API example, run as a user would: examples/train_on_my_data.py trains a team on the real model on its
own questions and reward (its own file: it is the longest real-model test, and the per-file budget counts it
alone)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_example_script_trains_on_its_own_data(tmp_path):
    """examples/train_on_my_data.py, run as a user would (on the real model; 2 iterations, the fewest its
    one warm-up step of the learning rate allows): it trains, logs its reward, evaluates, saves."""
    out = tmp_path / "example"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "train_on_my_data.py"),
            "--output-dir",
            str(out),
            "--iterations",
            "2",
            "--eval-questions",
            "2",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=1200,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "iteration 2: reward" in done.stdout and "held-out accuracy:" in done.stdout
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r.get("kind") == "train"]
    assert [r["iteration"] for r in train] == [1, 2]
    assert all("reward/__main__:says_it_once" in r for r in train)
    evals = [r["iteration"] for r in records if r.get("kind") == "eval"]
    assert evals == [0, 2]
    assert (out / "checkpoints" / "iter_000002").is_dir()
    summary = json.loads((out / "eval" / "iter_000002" / "summary.json").read_text())
    assert summary["n_questions"] == 2
