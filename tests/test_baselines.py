"""MAPPO and RMAAC in the shared trainer, on the tiny model that answers one digit (tests/tiny_models.py:
parsed answers for the adversary to swap, team rewards that differ between debates): a run killed with
SIGKILL resumes exactly (the critic included), the critic is checkpointed and exported with the team, and
RMAAC's adversary perturbs what agents read in training debates but not in evaluations."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
import train_helpers
from safetensors.torch import load_file
from train_helpers import read_jsonl, start, tiny_config, train_here, write_recipe

from udpo.training import checkpoint_store as ckpt

#: what both baselines train with here: 3 iterations, no evaluation (the kill test), a KL anchor, fp32
# (the exactness of the resumed run is compared bit for bit)
SETTINGS = {"max_iterations": 3, "eval_questions": 0, "eta": [0.01], "dtype": "fp32", "bf16": False}


@pytest.fixture(scope="module")
def digit_model(tokenizer_path, tmp_path_factory) -> str:
    """The tiny model that answers one digit: peers' answers parse, so the adversary has answers to swap."""
    return train_helpers.digit_model(tokenizer_path, tmp_path_factory)


def kill_after_checkpoint(recipe: Path, run: Path, name: str) -> None:
    proc = start(recipe)
    latest = run / "checkpoints" / "latest"
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None:
        if latest.exists() and latest.read_text().strip() == name:
            break
        time.sleep(0.05)
    assert proc.poll() is None, f"run ended before it could be killed:\n{proc.stdout.read()}"
    proc.send_signal(signal.SIGKILL)  # somewhere in the next iteration
    proc.wait()


def whole_and_killed(tmp_path: Path, model: str, **settings) -> tuple[Path, Path]:
    """The run of ``settings`` uninterrupted, and again killed after its first checkpoint and resumed. Only
    the killed run needs a process of its own; the others run here, on the threads it has (the same
    numbers, to the bit)."""
    runs = []
    for kind in ("whole", "killed"):
        run = tmp_path / kind
        recipe = write_recipe(tmp_path / f"{kind}.yaml", model, output_dir=str(run), **settings)
        if kind == "whole":
            train_here(recipe)
        else:
            kill_after_checkpoint(recipe, run, "iter_000001")
            train_here(recipe, "--resume", "latest")
        runs.append(run)
    return runs[0], runs[1]


def tensors(folder: Path) -> dict:
    return {f.name: load_file(str(f)) for f in sorted(folder.rglob("*.safetensors"))}


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["mappo", "rmaac"])
def test_baseline_killed_with_sigkill_resumes_exactly(algorithm, digit_model, tmp_path):
    """The same run uninterrupted and killed in iteration 2 then resumed: the same debates, the same
    metrics, the same adapters and critic at the end."""
    whole, killed = whole_and_killed(
        tmp_path,
        digit_model,
        algorithm=algorithm,
        # rmaac: a seed whose debates give the critic a peer answer to swap within 3 iterations (seed 0
        # gave none since the eager sampler draws one number per row of a call; seeds 1-3 gave 2-3)
        seed=1 if algorithm == "rmaac" else 0,
        **SETTINGS,
    )

    def debates(run):
        return [
            (d["question_id"], d["answers"], [[t["text"] for t in row] for row in d["turns"]])
            for d in read_jsonl(run / "trajectories" / "train.jsonl")
        ]

    assert debates(killed) == debates(whole)
    # what differs between two runs of the same numbers: wall-clock ("time", "time/rollout", ...), memory
    drop = ("time", "tokens_per_s", "seconds", "memory")

    def train_metrics(run):
        return [
            {k: v for k, v in r.items() if not any(k.startswith(d) or k == d for d in drop)}
            for r in read_jsonl(run / "metrics.jsonl")
            if r["kind"] == "train"
        ]

    w, k = train_metrics(whole), train_metrics(killed)
    assert [r["iteration"] for r in k] == [1, 2, 3]
    assert k == w
    assert all("critic/value_loss" in r for r in w)
    final = "checkpoints/iter_000003"
    a, b = tensors(whole / final), tensors(killed / final)
    assert a.keys() == b.keys() and "value_head.safetensors" in a
    for name in a:
        for key in a[name]:
            assert (a[name][key] == b[name][key]).all(), (name, key)
    if algorithm == "rmaac":  # the critic learned after iteration 1, and the adversary used it
        swaps = [
            t["details"]["adversary"]
            for d in read_jsonl(whole / "trajectories" / "train.jsonl")
            for row in d["turns"]
            for t in row
            if "adversary" in t.get("details", {})
        ]
        assert swaps, "the adversary never swapped an answer"
        assert all(s["value"] < s["clean_value"] for s in swaps)


def test_rmaac_checkpoints_and_exports_the_critic(digit_model, tmp_path):
    """A short RMAAC run with evaluation (in this process: the entry point is the kill test's): its
    checkpoints hold the critic, ``udpo export`` carries it, evaluations run plain Standard MAD (no
    adversary), the algorithm's metrics are logged."""
    from udpo.cli import main
    from udpo.training.trainer import Trainer

    run = tmp_path / "run"
    with Trainer(tiny_config(digit_model, run, algorithm="rmaac", max_iterations=2, eta=[0.0])) as trainer:
        trainer.train()
    latest = ckpt.resolve(run, "latest")
    assert sorted(p.name for p in (latest / "critic").iterdir()) == [
        "adapter.safetensors",
        "value_head.safetensors",
    ]
    assert main(["export", str(run), "--out", str(tmp_path / "team")]) == 0
    assert tensors(tmp_path / "team" / "critic").keys() == tensors(latest / "critic").keys()
    evals = read_jsonl(run / "eval" / "iter_000002" / "trajectories.jsonl")
    assert evals and not any(
        "adversary" in t.get("details", {}) for d in evals for row in d["turns"] for t in row
    )
    assert not (run / "trajectories" / "warmup.jsonl").exists()  # the baselines skip the warm-up debates
    train = [r for r in read_jsonl(run / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["iteration"] for r in train] == [1, 2] and all("critic/value_loss" in r for r in train)
