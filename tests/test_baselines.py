"""MAPPO and RMAAC in the shared trainer, on the real model: a run killed with SIGKILL resumes exactly
(the critic included), the critic is checkpointed and exported with the team, and RMAAC's adversary
perturbs what agents read in training debates but not in evaluations."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file
from train_helpers import read_jsonl, start, write_recipe

from udpo.training import checkpoint_store as ckpt

#: what both baselines train with here: 3 iterations, no evaluation (the kill test), a KL anchor
# fp32: in 3 iterations RMAAC's adversary swapped answers under fp32 but not in one bf16 run (its
# swaps depend on the sampled debates; not investigated further, see the CPU-throughput closing note)
SETTINGS = {"max_iterations": 3, "eval_questions": 0, "eta": [0.01], "dtype": "fp32", "bf16": False}


def run_to_end(recipe: Path, *extra: str) -> str:
    proc = start(recipe, *extra)
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out
    return out


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


def tensors(folder: Path) -> dict:
    return {f.name: load_file(str(f)) for f in sorted(folder.rglob("*.safetensors"))}


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["mappo", "rmaac"])
def test_baseline_killed_with_sigkill_resumes_exactly(algorithm, model_path, tmp_path):
    """The same run uninterrupted and killed in iteration 2 then resumed: the same debates, the same
    metrics, the same adapters and critic at the end."""
    runs = {}
    for kind in ("whole", "killed"):
        run = tmp_path / kind
        recipe = write_recipe(
            tmp_path / f"{kind}.yaml", model_path, output_dir=str(run), algorithm=algorithm, **SETTINGS
        )
        if kind == "whole":
            run_to_end(recipe)
        else:
            kill_after_checkpoint(recipe, run, "iter_000001")
            run_to_end(recipe, "--resume", "latest")
        runs[kind] = run
    whole, killed = runs["whole"], runs["killed"]

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


@pytest.mark.slow
def test_rmaac_checkpoints_and_exports_the_critic(model_path, tmp_path):
    """A short RMAAC run with evaluation: its checkpoints hold the critic, ``udpo export`` carries it,
    evaluations run plain Standard MAD (no adversary), the algorithm's metrics are logged."""
    from udpo.cli import main

    run = tmp_path / "run"
    recipe = write_recipe(
        tmp_path / "r.yaml", model_path, output_dir=str(run), algorithm="rmaac", max_iterations=2, eta=[0.0]
    )
    run_to_end(recipe)
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
