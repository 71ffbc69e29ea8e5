"""Two processes under torchrun (gloo on CPU): each debates a shard of the questions, gradients are
summed across processes, and both end with identical adapters that differ from the initial ones and
identical replay buffers. The team is the tiny model that answers one digit (tests/tiny_models.py): its
rewards differ between debates, so the update moves the adapters."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import train_helpers
from train_helpers import EXPLICIT, read_jsonl, write_recipe

REPO = Path(__file__).resolve().parents[1]

WORKER = """
import hashlib, json, sys
from pathlib import Path

import torch

from udpo.config import parse_config
from udpo.training.trainer import Trainer

out = Path(sys.argv[1])
trainer = Trainer(parse_config(sys.argv[2:]))
requests = []
generate = trainer.backend.generate
def counting(reqs):
    requests.append(len(reqs))
    return generate(reqs)
trainer.backend.generate = counting

def digest():
    flat = torch.cat([p.detach().flatten() for p in trainer.params])
    return hashlib.sha256(flat.numpy().tobytes()).hexdigest()

before = digest()
trainer.train()
report = {
    "rank": trainer.rank, "world": trainer.world, "type": trainer.accelerator.distributed_type.value,
    "before": before, "after": digest(), "requests": sum(requests),
    "replay": hashlib.sha256(json.dumps(
        [[[turn.behavior_logprobs for turn in row] for row in t.turns] for t in trainer.replay.items]
    ).encode()).hexdigest(),
}
(out / f"rank{trainer.rank}.json").write_text(json.dumps(report))
trainer.close()
"""


def train_on_two_processes(tmp_path: Path, recipe: Path) -> list[dict]:
    """The recipe trained by WORKER on two CPU processes (torch.distributed.run); each rank's report."""
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(worker), str(tmp_path), "--config", str(recipe)]  # fmt: skip
    result = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]


@pytest.fixture(scope="module")
def digit_model(tokenizer_path, tmp_path_factory) -> str:
    return train_helpers.digit_model(tokenizer_path, tmp_path_factory)


@pytest.mark.slow
def test_two_processes_shard_debates_and_sync_gradients(digit_model, tmp_path):
    run, iterations = tmp_path / "run", 2
    recipe = write_recipe(
        tmp_path / "recipe.yaml",
        digit_model,
        output_dir=str(run),
        max_iterations=iterations,
        replay=True,
        **EXPLICIT,
    )
    reports = train_on_two_processes(tmp_path, recipe)
    assert all(r["world"] == 2 and r["type"] == "MULTI_CPU" for r in reports)
    assert reports[0]["before"] == reports[1]["before"]  # same initial adapters
    assert reports[0]["after"] == reports[1]["after"]  # gradients synced: identical updates
    assert reports[0]["after"] != reports[0]["before"]  # and the adapters did move
    # each process recomputed the behavior log-probs of its own debates and shared them: every replay
    # buffer holds the same numbers
    assert reports[0]["replay"] == reports[1]["replay"]
    # each process debated half of the questions: 2 per iteration and 2 per evaluation (before and
    # after), N=2 agents x (T+1)=2 rounds each
    total = (iterations * 2 + 2 * 2) * 2 * 2
    assert [r["requests"] for r in reports] == [total // 2, total // 2]
    # rank 0 wrote every process's debates once, in order
    debates = read_jsonl(run / "trajectories" / "train.jsonl")
    assert [d["meta"]["iteration"] for d in debates] == [1, 1, 2, 2]
    train = [r for r in read_jsonl(run / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["iteration"] for r in train] == [1, 2]
    assert (run / "checkpoints" / "iter_000002" / "team.json").is_file()


@pytest.mark.slow
def test_two_processes_drop_and_refill_alike(digit_model, tmp_path):
    """Dynamic sampling on two processes: both see every debate, so both drop the same questions and draw
    the same extra ones (shared unevenly when their number is odd), and their updates stay identical."""
    run = tmp_path / "run"
    recipe = write_recipe(
        tmp_path / "recipe.yaml",
        digit_model,
        output_dir=str(run),
        max_iterations=3,
        questions_per_iteration=3,
        debates_per_question=2,
        baseline="group",
        eval_questions=0,
        replay=True,
        **EXPLICIT,
    )
    reports = train_on_two_processes(tmp_path, recipe)
    assert reports[0]["after"] == reports[1]["after"] != reports[0]["before"]
    assert reports[0]["replay"] == reports[1]["replay"]
    train = [r for r in read_jsonl(run / "metrics.jsonl") if r["kind"] == "train"]
    debates = read_jsonl(run / "trajectories" / "train.jsonl")
    assert len(debates) == sum(r["debates"] for r in train) == 2 * sum(r["groups/debated"] for r in train)
    assert sum(d["meta"].get("dropped", False) for d in debates) == 2 * sum(
        r["groups/dropped"] for r in train
    )
    assert sum(r["groups/extra_draws"] for r in train) > 0, "nothing refilled: pick another seed"
    # the requests: every debate once over both processes, N=2 agents x (T+1)=2 rounds each
    assert sum(r["requests"] for r in reports) == len(debates) * 2 * 2
