"""scripts/gpu_check.sh and what it runs, on CPU (issue 42): the script parses and skips its GPU-only parts
with a line saying so; the 7B shape is Llama-2-7B's and is built in memory, nothing but its config and
tokenizer on disk; benchmarks/iteration.py and benchmarks/study_plan.py run to completion on a tiny model
(slow: each starts processes or trains). The figures themselves need a GPU (docs/training.md)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GPU_CHECK = ROOT / "scripts" / "gpu_check.sh"


@pytest.fixture(scope="module")
def check_model():
    spec = importlib.util.spec_from_file_location("check_model", ROOT / "scripts" / "check_model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_check_parses_and_says_what_it_skips_without_a_gpu():
    subprocess.run(["bash", "-n", str(GPU_CHECK)], check=True)
    text = GPU_CHECK.read_text()
    assert 'benchmarks/iteration.py --config "$recipe" --shape 7b' in text
    assert 'benchmarks/study_plan.py --model "$model" --workers 2' in text
    assert "skipped (GPU only, not with --quick)" in text


def test_the_7b_shape_is_built_in_memory_with_only_its_config_and_tokenizer_on_disk(check_model, tmp_path):
    import torch

    # two of its 32 layers (check_model.LAYERS), on the meta device: the shape without the bytes
    model, tokenizer = check_model.build_in_memory(tmp_path / "m7b", 2, vocab=512, shape="7b", device="meta")
    config = model.config
    assert (config.hidden_size, config.intermediate_size, check_model.LAYERS["7b"]) == (4096, 11008, 32)
    assert (config.num_attention_heads, config.num_key_value_heads) == (32, 32)
    layer = sum(p.numel() for p in model.model.layers[0].parameters())
    assert layer == 4 * 4096**2 + 3 * 4096 * 11008 + 2 * 4096
    assert 6.4e9 < 32 * layer < 6.5e9  # Llama-2-7B's layers (its vocabulary is the small one trained here)
    assert next(model.parameters()).dtype == torch.bfloat16
    assert sorted(p.name for p in (tmp_path / "m7b").iterdir() if p.suffix in (".json", ".safetensors")) == [
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert model.name_or_path == str(tmp_path / "m7b") and tokenizer.chat_template


@pytest.mark.slow
def test_one_iteration_of_a_shape_built_in_memory_runs_on_cpu(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        "task: arithmetic\ntask_options: {difficulty: 1, n_questions: 40}\nn_agents: 3\nrounds: 1\n"
        "max_tokens: 4\nquestions_per_iteration: 1\nbackend: hf\ndtype: fp32\neval_questions: 0\n"
        "warmup_fraction: 0.0\nalpha: [0.3]\nbeta: [0.3]\ngamma: [0.3]\nlambda_: [1.0]\neta: [0.01]\n"
    )
    done = subprocess.run(
        [
            sys.executable,
            "benchmarks/iteration.py",
            "--config",
            str(recipe),
            "--layers",
            "1",
            "--iterations",
            "1",
            "--out",
            str(tmp_path / "out"),
        ],  # fmt: skip
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "UDPO_NUM_THREADS": "1"},
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "135m shape, 1 layers" in done.stdout and "built on cpu" in done.stdout
    assert "iteration 1: rollout" in done.stdout and "update_rss_peak_gib" in done.stdout
    assert not list((tmp_path / "out" / "model").glob("*.safetensors"))  # no weights written


@pytest.mark.slow
def test_a_shortened_study_plan_runs_on_two_workers_and_prints_its_wall_time(check_model, tmp_path):
    model = check_model.build(tmp_path / "model", layers=1)
    done = subprocess.run(
        [
            sys.executable,
            "benchmarks/study_plan.py",
            "--model",
            model,
            "--workers",
            "2",
            "--iterations",
            "1",
            "--eval-questions",
            "2",
            "--out",
            str(tmp_path / "out"),
            "max_tokens",
            "4",
        ],  # fmt: skip
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "worker 0: pid" in done.stdout and "GPU memory share 0.5 (on CUDA)" in done.stdout
    assert "task_only seed_0: median iteration" in done.stdout
    assert "2 runs x 1 iterations, 2 held-out questions, 2 workers: wall time" in done.stdout
