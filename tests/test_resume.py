"""Checkpoints and exact resumption: atomic writes, rewinding append-only files, and a run killed with
SIGKILL mid-way that resumes with no lost or duplicated iteration (on the real model, then exported);
the other killed runs train the tiny random model (tests/tiny_models.py)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest
from train_helpers import EXPLICIT, read_jsonl, start, tiny_config, train_here, write_recipe

from udpo.config import ConfigError, parse_config
from udpo.training import checkpoint_store as ckpt
from udpo.training.checkpoint_store import CheckpointError
from udpo.training.team import TeamManifest

REPO = Path(__file__).resolve().parents[1]


def fake_checkpoint(run: Path, iteration: int) -> Path:
    staging = ckpt.staging_dir(run, iteration)
    (staging / "payload.txt").write_text(f"iteration {iteration}")
    ckpt.write_json(staging / ckpt.STATE, {"iteration": iteration})
    return ckpt.commit(run, staging, iteration)


def test_commit_is_atomic_and_latest_points_at_the_newest(tmp_path):
    run = tmp_path / "run"
    first = fake_checkpoint(run, 1)
    assert first.name == "iter_000001" and ckpt.resolve(run, "latest") == first
    fake_checkpoint(run, 2)
    assert ckpt.resolve(run, "latest").name == "iter_000002"
    # a crash while writing leaves only a staging folder, which is never taken for a checkpoint
    (ckpt.staging_dir(run, 3) / "half.bin").write_bytes(b"\0" * 10)
    assert [p.name for p in ckpt.list_checkpoints(run)] == ["iter_000001", "iter_000002"]
    assert ckpt.resolve(run, "latest").name == "iter_000002"
    # a lost pointer falls back to the newest complete checkpoint
    (run / "checkpoints" / "latest").unlink()
    assert ckpt.resolve(run, "latest").name == "iter_000002"
    fake_checkpoint(run, 3)
    assert [p.name for p in ckpt.prune(run, keep=2)] == ["iter_000001"]
    # re-reaching an iteration (resumed from an older checkpoint) replaces it whole
    (run / "checkpoints" / "iter_000002" / "stale.txt").write_text("from the abandoned run")
    fake_checkpoint(run, 2)
    assert sorted(p.name for p in (run / "checkpoints" / "iter_000002").iterdir()) == [
        "payload.txt",
        "trainer_state.json",
    ]
    assert ckpt.resolve(run, "latest").name == "iter_000002"


def test_resolve_errors_name_the_problem(tmp_path):
    with pytest.raises(ckpt.CheckpointError, match="no checkpoint under"):
        ckpt.resolve(tmp_path, "latest")
    with pytest.raises(ckpt.CheckpointError, match="not a checkpoint folder, trainer_state.json missing"):
        ckpt.resolve(tmp_path, str(tmp_path))


def test_rewind_cuts_append_only_files_back(tmp_path):
    log = tmp_path / "log.jsonl"
    log.write_text("a\nb\n")
    marks = ckpt.file_marks(tmp_path, ["log.jsonl", "absent.jsonl"])
    assert marks == {"log.jsonl": {"lines": 2, "bytes": 4}, "absent.jsonl": {"lines": 0, "bytes": 0}}
    log.write_text("a\nb\nc\nd")  # two more lines after the checkpoint, the last one half written
    (tmp_path / "absent.jsonl").write_text("x\n")
    assert ckpt.rewind_files(tmp_path, marks) == {"log.jsonl": 2, "absent.jsonl": 1}
    assert log.read_text() == "a\nb\n" and not (tmp_path / "absent.jsonl").exists()
    log.write_text("a\n")
    with pytest.raises(ckpt.CheckpointError, match="lost data"):
        ckpt.rewind_files(tmp_path, marks)
    log.write_text("ab\ncd\n")
    with pytest.raises(ckpt.CheckpointError, match="hold 1 lines, the checkpoint recorded 2"):
        ckpt.rewind_files(tmp_path, {"log.jsonl": {"lines": 2, "bytes": 3}})


@pytest.mark.slow
def test_killed_run_resumes_without_lost_or_repeated_iterations(model_path, tmp_path):
    """The one training run of these files on the real model: killed with SIGKILL in iteration 2 of 2,
    refused without --resume, resumed, then exported with ``udpo export``, and the export loads onto the
    base model with the final checkpoint's adapters."""
    import torch
    from peft import PeftModel, get_peft_model_state_dict
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from udpo.cli import main

    run, iterations, per_iteration = tmp_path / "run", 2, 1
    recipe = write_recipe(
        tmp_path / "recipe.yaml",
        model_path,
        output_dir=str(run),
        max_iterations=iterations,
        questions_per_iteration=per_iteration,
        max_tokens=4,  # the fewest iterations, debates and tokens that still show it
        eval_questions=0,
        replay=True,
        replay_fraction=0.34,
        **EXPLICIT,
    )  # with replay: its buffer must survive the kill too (1 replayed debate per update)
    proc = start(recipe)
    latest = run / "checkpoints" / "latest"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if latest.exists() and latest.read_text().strip() == "iter_000001":
            break
        time.sleep(0.05)
    assert proc.poll() is None, f"run ended before it could be killed:\n{proc.stdout.read()}"
    proc.send_signal(signal.SIGKILL)  # somewhere in iteration 2
    proc.wait()

    again = start(recipe)  # without --resume the used run directory is refused
    out, _ = again.communicate(timeout=120)
    assert again.returncode == 2 and "--resume latest" in out

    resumed = start(recipe, "--resume", "latest")
    out, _ = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, out

    train = [r for r in read_jsonl(run / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["iteration"] for r in train] == list(range(1, iterations + 1))
    assert [r["replayed"] for r in train] == [0] + [1] * (iterations - 1)
    assert [r["replay/size"] for r in train] == [per_iteration * k for k in range(1, iterations + 1)]
    debates = read_jsonl(run / "trajectories" / "train.jsonl")
    assert len(debates) == iterations * per_iteration
    assert [d["meta"]["iteration"] for d in debates] == [
        k for k in range(1, iterations + 1) for _ in range(per_iteration)
    ]
    ckpts = run / "checkpoints"
    assert [p.name for p in ckpt.list_checkpoints(run)] == [f"iter_{k:06d}" for k in range(iterations + 1)]
    assert not [p.name for p in ckpts.iterdir() if p.name.startswith(".")]  # no staging leftovers
    for k in range(iterations + 1):
        state = ckpt.read_state(ckpts / f"iter_{k:06d}")
        assert state["iteration"] == k and state["optimizer_steps"] == k
        assert state["files"]["trajectories/train.jsonl"]["lines"] == k * per_iteration
        assert TeamManifest.load(ckpts / f"iter_{k:06d}").iteration == k

    # the resumed run exports (its latest checkpoint), and the export loads onto the real base model
    team_dir = tmp_path / "team"
    assert main(["export", str(run), "--out", str(team_dir)]) == 0
    team = TeamManifest.load(team_dir)
    assert team.iteration == iterations and team.n_agents == 2
    final = TeamManifest.load(ckpts / f"iter_{iterations:06d}").adapter_paths()
    base = AutoModelForCausalLM.from_pretrained(team.base_model, dtype=torch.float32)
    ids = torch.tensor([[1, 9690, 198, 2683, 314, 253, 19, 30, 31]])
    with torch.no_grad():
        plain = base(input_ids=ids).logits
    model = None
    for name, folder in team.adapter_paths(team_dir).items():
        if model is None:
            model = PeftModel.from_pretrained(base, folder, adapter_name=name)
        else:
            model.load_adapter(folder, adapter_name=name)
        model.set_adapter(name)
        saved = load_file(f"{final[name]}/adapter_model.safetensors")  # the final checkpoint's adapter
        loaded = get_peft_model_state_dict(model, adapter_name=name)
        assert loaded.keys() == saved.keys() and saved, name
        assert all(torch.equal(loaded[k], saved[k]) for k in saved), name
        with torch.no_grad():
            logits = model(input_ids=ids).logits
        assert logits.shape == plain.shape and torch.isfinite(logits).all()


#: an eval callback that SIGKILLs its process the first time the last evaluation runs: after the
#: evaluation's summary.json is written, before the checkpoint records the evaluation
KILLER = """
import os
import signal
from pathlib import Path


def kill_once(trainer, iteration):
    marker = Path(os.environ["UDPO_TEST_KILL_MARKER"])
    if iteration == trainer.data.total_iterations and not marker.exists():
        marker.write_text("killed")
        os.kill(os.getpid(), signal.SIGKILL)
    return {"ran": 1}
"""


@pytest.mark.slow
def test_a_run_killed_in_its_last_evaluation_resumes_at_that_evaluation(tiny_model, tmp_path, monkeypatch):
    """Killed in a process of its own; resumed here (on the threads the killed run had: the same numbers)."""
    (tmp_path / "killer_cb.py").write_text(KILLER)
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("UDPO_TEST_KILL_MARKER", str(tmp_path / "killed"))
    run, iterations, per_iteration = tmp_path / "run", 2, 2
    recipe = write_recipe(
        tmp_path / "recipe.yaml",
        tiny_model,
        output_dir=str(run),
        max_iterations=iterations,
        questions_per_iteration=per_iteration,
        save_steps=iterations,
        eval_steps=0,
        eval_at_start=False,
        eval_callbacks=["killer_cb:kill_once"],
        **EXPLICIT,
    )
    killed = start(recipe)
    out, _ = killed.communicate(timeout=600)
    assert killed.returncode == -signal.SIGKILL, out
    last = run / "checkpoints" / f"iter_{iterations:06d}"
    assert ckpt.read_state(last)["last_evaluation"] is None  # written before the evaluation
    summary = run / "eval" / last.name / "summary.json"
    first_summary = json.loads(summary.read_text())  # written; its metrics line is not in the checkpoint

    train_here(recipe, "--resume", "latest")
    records = read_jsonl(run / "metrics.jsonl")
    assert [r["iteration"] for r in records if r["kind"] == "train"] == [1, 2]  # no iteration repeated
    evals = [r for r in records if r["kind"] == "eval"]
    assert [r["iteration"] for r in evals] == [iterations] and evals[0]["kill_once/ran"] == 1
    assert len(read_jsonl(run / "trajectories" / "train.jsonl")) == iterations * per_iteration
    assert json.loads(summary.read_text()) == first_summary  # the same evaluation seed, the same debates
    state = ckpt.read_state(last)
    assert (
        state["last_evaluation"] == iterations
        and state["history"]["after"]["accuracy"] == evals[0]["accuracy"]
    )
    assert state["files"]["metrics.jsonl"]["lines"] == len(records)

    train_here(recipe, "--resume", "latest")  # nothing left to do: no second evaluation
    assert read_jsonl(run / "metrics.jsonl") == records


@pytest.mark.slow
def test_a_start_killed_before_checkpoint_0_restarts_and_shared_checkpoints_run_no_code(tiny_model, tmp_path):
    """SIGKILL after metrics.jsonl exists but before checkpoint 0 (during the first evaluation, of 4
    questions: a window the poll does not miss on the tiny model): nothing to resume, so ``--resume latest``
    is refused when the config is read and a plain restart (here, in this process) works, replacing what
    the killed attempt wrote. Then the finished run's checkpoint, with a crafted rng.pt in place of its rng
    state, is refused by the trainer before a model loads, without running the payload."""
    from test_checkpoint_safety import malicious_pickle

    from udpo.training.trainer import Trainer

    run = tmp_path / "run"
    settings = {"output_dir": str(run), "max_iterations": 1, "eval_questions": 4, **EXPLICIT}
    recipe = write_recipe(tmp_path / "recipe.yaml", tiny_model, **settings)
    proc = start(recipe)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if (run / "metrics.jsonl").exists() and not (run / "checkpoints" / "latest").exists():
            break
        time.sleep(0.02)
    assert proc.poll() is None, f"run ended before it could be killed:\n{proc.stdout.read()}"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert (run / "metrics.jsonl").exists() and not ckpt.list_checkpoints(run)

    with pytest.raises(ConfigError, match="resume: --resume latest: no checkpoint under .* without --resume"):
        parse_config(["--config", str(recipe), "--resume", "latest"])
    train_here(recipe)
    records = read_jsonl(run / "metrics.jsonl")
    assert [r["kind"] for r in records].count("calibration") == 1  # the killed attempt's line is gone
    assert [r["iteration"] for r in records if r["kind"] == "eval"] == [0, 1]
    assert [r["iteration"] for r in records if r["kind"] == "train"] == [1]
    assert [p.name for p in ckpt.list_checkpoints(run)] == ["iter_000000", "iter_000001"]

    # a shared copy of the finished run, its rng state replaced by a crafted pickle
    shared = tmp_path / "shared"
    shutil.copytree(run, shared)
    marker = tmp_path / "payload_ran"
    (shared / "checkpoints" / "iter_000001" / "rng.json").unlink()
    (shared / "checkpoints" / "iter_000001" / "rng.pt").write_bytes(malicious_pickle(marker))
    config = tiny_config(tiny_model, shared, max_iterations=1, eval_questions=4, **EXPLICIT, resume="latest")
    with pytest.raises(
        CheckpointError, match="rng.pt is a pickle file; loading it could run any code it holds"
    ):
        Trainer(config)
    assert not marker.exists()
