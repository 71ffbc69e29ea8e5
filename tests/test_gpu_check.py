"""scripts/gpu_check.sh and what it runs, on CPU (issue 42): the script parses and skips its GPU-only parts
with a line saying so; the 7B shape is Llama-2-7B's and is built in memory, nothing but its config and
tokenizer on disk; benchmarks/iteration.py and benchmarks/study_plan.py run to completion on a tiny model
(slow: each starts processes or trains). The figures themselves need a GPU (docs/training.md)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GPU_CHECK = ROOT / "scripts" / "gpu_check.sh"


def script(path: Path):
    """The module of a script that is not on the path (scripts/, benchmarks/), loaded from its file."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module  # a dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def check_model():
    return script(ROOT / "scripts" / "check_model.py")


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
            "--json",
            str(tmp_path / "iteration.json"),
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
    record = json.loads((tmp_path / "iteration.json").read_text())
    assert (record["shape"], record["layers"], record["device"], record["n_agents"]) == ("135m", 1, "cpu", 3)
    assert len(record["iterations"]) == 1 and record["after_first"] is None  # one iteration: nothing after it
    assert record["iterations"][0]["iteration"] > 0 and "update_rss_peak_gib" in record["iterations"][0]


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
            "--json",
            str(tmp_path / "study.json"),
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
    record = json.loads((tmp_path / "study.json").read_text())
    assert (record["runs"], record["iterations"], record["workers"]) == (2, 1, 2) and record["wall_s"] > 0
    assert sorted(record["medians"]) == ["coin_control seed_0", "task_only seed_0"]


def write(folder: Path, name: str, record: dict) -> None:
    (folder / f"{name}.json").write_text(json.dumps(record))


def iteration(seconds: float, peak: float) -> dict:
    return {
        "rollout": seconds - 1.0,
        "reward": 0.0,
        "update": 1.0,
        "sync": 0.0,
        "iteration": seconds,
        "peak_gib": peak,
    }


def test_the_targets_table_compares_each_figure_with_its_goal_and_names_what_was_not_measured(tmp_path):
    targets = script(ROOT / "benchmarks" / "gpu_targets.py")
    load, render, table = targets.load, targets.render, targets.table
    decode = [
        {"path": "auto (graph)", "adapters": 3, "tokens_per_s": 14000.0},
        {"path": "auto (graph)", "adapters": 0, "tokens_per_s": 18000.0},
        {"path": "eager", "adapters": 3, "tokens_per_s": 2000.0},
        {"path": "generate(static)", "adapters": 0, "tokens_per_s": 21000.0},
    ]
    write(tmp_path, "decode_135m", {"device": "NVIDIA H100 80GB HBM3", "results": decode})
    write(tmp_path, "iteration_1b_n3", {"iterations": [iteration(30.0, 5.0), iteration(2.5, 5.5), iteration(2.9, 5.2)],
                                         "after_first": iteration(2.7, 5.5)})  # fmt: skip
    write(
        tmp_path,
        "iteration_1b_n10",
        {"iterations": [iteration(40.0, 7.0), iteration(6.0, 6.9)], "after_first": iteration(6.0, 6.9)},
    )
    write(
        tmp_path, "update_1b", {"update": {"after_s": 2.0, "bare_packed_s": 1.8, "after_vs_bare_packed": 0.9}}
    )
    (tmp_path / "study.json").write_text("{not json")  # a file cut short: left out, not fatal
    rows = {r.what: r for r in table(load(tmp_path))}
    graph3 = rows[
        "rollout tokens/s, 135M shape, auto (graph), 3 adapters / generate(static) compiled, no adapters"
    ]
    assert graph3.measured.startswith("0.67x") and graph3.met is False  # 14000 / 21000 < 0.7
    graph0 = rows[
        "rollout tokens/s, 135M shape, auto (graph), no adapters / generate(static) compiled, no adapters"
    ]
    assert graph0.measured.startswith("0.86x") and graph0.met is None  # reported, no goal
    assert (
        rows["rollout tokens/s, 1B shape, 3 adapters / generate(static) compiled, no adapters"].measured
        == "not measured"
    )
    it = rows["1B shape, N = 3 iteration (median after the first)"]
    assert it.measured.startswith("2.70 s") and it.met is True
    n3_peak = rows["1B shape, N = 3 peak GPU memory (any iteration)"]
    assert n3_peak.measured == "5.50 GiB" and n3_peak.met is True  # the most of all three iterations
    growth = rows["1B shape, N = 10 peak / N = 3 peak"]
    assert growth.measured.startswith("1.27x") and growth.met is False  # 7.0 / 5.5
    assert rows["7B shape, N = 3 trains (default sizes)"].measured == "not measured"
    assert rows["7B shape, N = 3 trains (default sizes)"].met is None
    assert rows[
        "1B shape: the update / a bare PEFT forward + backward over the same packed rows"
    ].measured.startswith("0.90x")
    assert (
        rows[
            "the proof study plan, shortened (runs x iterations, workers sharing the GPU): wall time"
        ].measured
        == "not measured"
    )
    text = render(table(load(tmp_path)), "NVIDIA H100 80GB HBM3")
    assert (
        text.startswith("GPU targets on NVIDIA H100 80GB HBM3") and "| **no** |" in text and "| yes |" in text
    )


def run_check(*args) -> subprocess.CompletedProcess:
    """``scripts/gpu_check.sh --quick ARGS`` on this CPU, with this interpreter as its ``python``."""
    return subprocess.run(
        ["bash", str(GPU_CHECK), "--quick", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={
            **os.environ,
            "GPU_CHECK_ALLOW_CPU": "1",
            "UDPO_NUM_THREADS": "1",
            "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        },
        timeout=600,
    )


@pytest.mark.slow
def test_gpu_check_skips_parts_past_its_budget_and_still_writes_the_summary(tmp_path):
    """The script's frame on CPU: no part runs (the budget of 1 s is spent starting up; the model, named and
    absent, is never built or read), each says so, and the summary of what was measured (nothing) lands in
    --report."""
    done = run_check("--out", tmp_path / "out", "--report", tmp_path / "report", "--model", tmp_path / "absent",
                     "--budget", 1, "--parts", "decode,7b,paths")  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "== decode: skipped (the check has run" in done.stdout and "past its budget of 1 s)" in done.stdout
    assert "== 7b: skipped (GPU only, not with --quick)" in done.stdout
    assert "== paths: skipped (the check has run" in done.stdout
    assert "decode1b" not in done.stdout  # not asked for: no line
    summary = (tmp_path / "report" / "summary.md").read_text()
    assert summary.startswith("GPU targets on an unnamed device") and summary.count("not measured") == 8
    assert json.loads((tmp_path / "report" / "figures.json").read_text()) == {}


@pytest.mark.slow
def test_decode_and_update_figures_reach_the_targets_table(check_model, tmp_path):
    """The two benchmarks the GPU-only parts run that the tests above do not: decode.py's figures (here on
    CPU, the eager path under auto) become the table's rollout row; train_step.py runs only the update
    modes asked for and writes the update's ratio to a bare pass over the same packed rows."""
    model = check_model.build(tmp_path / "model", layers=1)
    figures = tmp_path / "figures"
    figures.mkdir()
    env = {**os.environ, "UDPO_NUM_THREADS": "1"}
    decode = [sys.executable, "benchmarks/decode.py", "--model", model, "--rows", "4", "--max-tokens", "4",
              "--paths", "auto", "--anchor", "--repeats", "1", "--json", str(figures / "decode_135m.json")]  # fmt: skip
    done = subprocess.run(decode, capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((figures / "decode_135m.json").read_text())
    by = {(r["path"], r["adapters"]): r for r in record["results"]}
    assert set(by) == {("auto (eager)", 3), ("auto (eager)", 0), ("generate(static)", 0)}
    ratio = by["auto (eager)", 3]["tokens_per_s"] / by["generate(static)", 0]["tokens_per_s"]
    rows = {r.what: r for r in script(ROOT / "benchmarks" / "gpu_targets.py").table({"decode_135m": record})}
    row = rows[
        "rollout tokens/s, 135M shape, auto (eager), 3 adapters / generate(static) compiled, no adapters"
    ]
    assert row.measured.startswith(f"{ratio:.2f}x") and row.met == (ratio >= 0.7)

    update = [sys.executable, "benchmarks/train_step.py", "--only", "update", "--model", model, "--rounds", "1",
              "--questions", "1", "--max_tokens", "4", "--repeats", "1", "--update-modes", "after,bare_packed",
              "--json", str(tmp_path / "update.json")]  # fmt: skip
    done = subprocess.run(update, capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads((tmp_path / "update.json").read_text())["update"]
    assert sorted(k for k in figures if k.endswith("_s")) == ["after_s", "bare_packed_s"]  # no other mode ran
    assert figures["after_vs_bare_packed"] == pytest.approx(figures["bare_packed_s"] / figures["after_s"])
    assert "update before" not in done.stdout and "over the same packed rows: " in done.stdout


@pytest.mark.slow
def test_a_failing_part_is_reported_and_the_parts_after_it_still_run(tmp_path):
    """A model folder that does not exist fails both parts asked for: the first's failure does not stop the
    check, the second runs and fails too, the summary names both and the script exits non-zero."""
    done = run_check("--out", tmp_path / "out", "--model", tmp_path / "absent", "--parts", "decode,paths")
    assert done.returncode != 0
    assert "== decode: FAILED (exit" in done.stdout and "== paths: FAILED (exit" in done.stdout
    assert done.stdout.index("== decode: FAILED") < done.stdout.index("== paths (")
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert summary.startswith(
        "GPU targets on an unnamed device; parts that FAILED (see the log): decode, paths"
    )
    assert done.stdout.rstrip().endswith("FAILED: decode paths")
