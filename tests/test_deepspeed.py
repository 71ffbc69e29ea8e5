"""DeepSpeed ZeRO-2 and ZeRO-3 with 2 processes on CPU (gloo), launched the way users launch them:
``accelerate launch --config_file recipes/accelerate/deepspeed_zero{2,3}.yaml --num_processes 2``.

Each run trains a tiny Llama, is killed with SIGKILL after a checkpoint (every process of the job), resumes
with ``--resume latest`` (no trust switch: the optimizer state is the project's own safetensors) and is
exported; its adapters (and lagged references) must equal a single-process run of the same recipe within
float tolerance. A ZeRO-2 checkpoint of 2 processes also resumes under ZeRO-3 on one process. The work is deliberately uneven: 3
debates per iteration over 2 processes, one request per generate call and one row per log-prob pass,
so the processes generate and score a different number of times (ZeRO-3 gathers every layer in each
forward pass: without the symmetric padding the processes would make different collective calls,
which gloo aborts and NCCL hangs on). Greedy decoding makes the debates the same however they are
sharded; the model's larger init makes greedy replies differ between questions.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file
from train_helpers import EXPLICIT, read_jsonl, write_recipe

if not os.environ.get("CI"):
    pytest.importorskip("deepspeed", reason="pip install 'udpo[deepspeed]' (scripts/install.sh installs it)")

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
ITERATIONS = 4
SETTINGS = {
    **EXPLICIT,
    "max_iterations": ITERATIONS,
    "questions_per_iteration": 3,  # 2 debates on one process, 1 on the other
    "eval_questions": 3,
    "max_tokens": 12,
    "temperature": 0.0,  # greedy: the same debates whatever the sharding
    "learning_rate": 0.01,
    "reward_functions": ["train_helpers:token_parity"],  # the tiny model never answers right
    "reference": "lagged",  # refreshed every iteration: ZeRO-3 must gather to copy it
    "ref_update_interval": 1,
    "logprob_batch_size": 1,  # one pass per row: the busier process runs more passes
    "debate_batch_size": 1,  # one question per generate call: more calls on the busier process
    "dtype": "fp32",  # adapters compared to 1e-4 across shardings: below bf16's resolution
    "bf16": False,
}
TOLERANCE = 1e-4  # 4 Adam steps at lr 0.01 of sums taken in another order; measured ~2e-6


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONPATH": str(REPO / "tests"),  # train_helpers:token_parity
    }


@pytest.fixture(scope="module")
def recipe(tokenizer_path, tmp_path_factory) -> Path:
    from tiny_models import build_tiny_llama

    folder = tmp_path_factory.mktemp("ds")
    model = build_tiny_llama(folder / "model", tokenizer_path, initializer_range=0.3)
    return write_recipe(folder / "recipe.yaml", model, **SETTINGS)


@pytest.fixture(scope="module")
def single(recipe) -> Path:
    """The same recipe in one process, no DeepSpeed."""
    run = recipe.parent / "single"
    cmd = [sys.executable, "train_udpo.py", "--config", str(recipe), "--output_dir", str(run)]
    result = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return run


def _launch(stage: int, recipe: Path, run: Path, *extra: str, processes: int = 2) -> list[str]:
    cmd = [sys.executable, "-m", "accelerate.commands.launch",
           "--config_file", f"recipes/accelerate/deepspeed_zero{stage}.yaml", "--num_processes", str(processes)]  # fmt: skip
    if stage == 3:
        # the recipe's ZeRO-3 settings, but every tensor partitioned: by default tensors of up to 100k
        # elements stay whole, and with them every tiny-model tensor (partitioning bugs would hide)
        ds = json.loads((REPO / "recipes/accelerate/ds_zero3.json").read_text())
        ds["zero_optimization"]["stage3_param_persistence_threshold"] = 0
        path = run.parent / f"ds_zero3_{run.name}.json"
        path.write_text(json.dumps(ds))
        cmd += ["--deepspeed_config_file", str(path)]
    return [*cmd, "train_udpo.py", "--config", str(recipe), "--output_dir", str(run), *extra]


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (torch's launcher starts its workers in sessions of their own)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _kill_after_checkpoint(cmd: list[str], run: Path, log: Path) -> None:
    """Run ``cmd`` until checkpoint 1 is complete, then SIGKILL the launcher and every worker at once."""
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 600
    latest = run / "checkpoints" / "latest"
    while not (latest.exists() and latest.read_text().strip() >= "iter_000001"):
        assert proc.poll() is None, log.read_text()[-4000:]
        assert time.monotonic() < deadline, "no checkpoint 1 within 10 minutes"
        time.sleep(0.05)
    for pid in [*_descendants(proc.pid), proc.pid]:
        os.kill(pid, signal.SIGKILL)
    proc.wait()
    trained = [r["iteration"] for r in read_jsonl(run / "metrics.jsonl") if r["kind"] == "train"]
    assert len(trained) < ITERATIONS, "the run ended before it was killed: nothing was resumed"


def _weights(checkpoint: Path, folder: str) -> dict[str, object]:
    return {
        f"{agent.name}/{key}": value
        for agent in sorted((checkpoint / folder).iterdir())
        for key, value in load_file(str(agent / "adapter_model.safetensors")).items()
    }


def _assert_close(a: dict, b: dict) -> None:
    assert a.keys() == b.keys() and a
    for key in a:
        assert a[key].shape == b[key].shape and a[key].numel() > 0, key
        assert (a[key] - b[key]).abs().max().item() <= TOLERANCE, key


def _resume(stage: int, recipe: Path, run: Path, processes: int = 2) -> str:
    """Resume ``run`` from its latest checkpoint to the end; returns the log."""
    result = subprocess.run(
        _launch(stage, recipe, run, "--resume", "latest", processes=processes),
        cwd=REPO, env=_env(), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-6000:]
    assert "terminate called" not in log  # every process left the group before exiting
    return log


def _assert_as_one_process(run: Path, single: Path, processes: int) -> Path:
    """The resumed run's last checkpoint: the project's own optimizer state, no pickle, and the single
    process run's adapters and lagged references."""
    final = run / "checkpoints" / f"iter_{ITERATIONS:06d}"
    expected = single / "checkpoints" / f"iter_{ITERATIONS:06d}"
    state = json.loads((final / "trainer_state.json").read_text())
    assert state["world_size"] == processes and not (final / "deepspeed").exists()
    assert {"optimizer.safetensors", "master.safetensors"} <= {p.name for p in final.iterdir()}
    _assert_close(_weights(final, "adapters"), _weights(expected, "adapters"))
    _assert_close(_weights(final, "reference"), _weights(expected, "reference"))
    return final


@pytest.mark.parametrize("stage", [2, 3])
def test_zero_two_processes_killed_resumed_exported_equal_one_process(stage, recipe, single, tmp_path):
    run = tmp_path / f"zero{stage}"
    _kill_after_checkpoint(_launch(stage, recipe, run), run, tmp_path / "killed.log")
    if stage == 2:  # the gathered optimizer state fits any partitioning: ZeRO-3 on one process resumes it too
        elsewhere = tmp_path / "zero2_then_zero3"
        shutil.copytree(run, elsewhere)
        log = _resume(3, recipe, elsewhere, processes=1)
        assert "checkpoint written by 2 processes, resuming with 1" in log
        _assert_as_one_process(elsewhere, single, processes=1)
    _resume(stage, recipe, run)

    final = _assert_as_one_process(run, single, processes=2)
    initial = _weights(run / "checkpoints" / "iter_000000", "adapters")
    assert any((initial[k] - v).abs().max() > 1e-3 for k, v in _weights(final, "adapters").items())

    train = [r for r in read_jsonl(run / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["iteration"] for r in train] == list(range(1, ITERATIONS + 1))  # each logged once
    assert any(r["update/empty_passes"] > 0 for r in train)  # the work was uneven
    # the same per-adapter clipping and gradient norms as the single-process run
    alone = [r for r in read_jsonl(single / "metrics.jsonl") if r["kind"] == "train"]
    for mine, theirs in zip(train, alone, strict=True):
        for adapter in ("agent_0", "agent_1"):
            assert mine[f"grad_norm/{adapter}"] == pytest.approx(theirs[f"grad_norm/{adapter}"], rel=1e-3)

    team = tmp_path / "team"
    export = subprocess.run(
        [sys.executable, "-m", "udpo.cli", "export", str(run), "--out", str(team)],
        cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert export.returncode == 0, export.stderr[-3000:]
    _assert_close(_weights(team, "adapters"), _weights(final, "adapters"))


NAN_ON_RANK_1 = """
import sys

import torch.distributed as dist

from udpo.algorithms.udpo import UDPO
from udpo.config import parse_config
from udpo.training.trainer import Trainer, TrainingError

real_loss = UDPO.loss


def loss(self, *args):
    value, info = real_loss(self, *args)
    return (value * float("nan") if dist.get_rank() == 1 else value), info


UDPO.loss = loss
trainer = Trainer(parse_config(sys.argv[1:]))
try:
    trainer.train()
except TrainingError as e:
    print(f"rank {trainer.rank} stopped: {e}", flush=True)
finally:
    trainer.close()
"""


def test_a_nan_on_one_process_stops_every_process_with_a_checkpoint(recipe, tmp_path):
    """The non-finite check runs under DeepSpeed too, and every process stops together: a process that
    raised alone would leave the others waiting in the next collective."""
    worker = tmp_path / "worker.py"
    worker.write_text(NAN_ON_RANK_1)
    run = tmp_path / "run"
    cmd = _launch(3, recipe, run)
    cmd[cmd.index("train_udpo.py")] = str(worker)
    result = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=600)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-6000:]
    assert "rank 1 stopped: non-finite value at iteration 1: loss of agent 0 is nan" in log
    assert "rank 0 stopped: non-finite value at iteration 1: loss of agent 0 is not finite on another" in log
    assert (run / "checkpoints" / "iter_000000" / "trainer_state.json").is_file()
    saved = _weights(run / "checkpoints" / "iter_000000", "adapters")
    assert saved and all(v.numel() > 0 for v in saved.values())  # gathered, not ZeRO-3's empty slices
