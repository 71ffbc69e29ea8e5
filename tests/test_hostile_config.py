"""Hostile recipes through both training entry points (``udpo train`` and ``python train_udpo.py``):
each is refused with one line naming the setting, before any model weights are read."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from train_helpers import TINY

from udpo.cli import main as udpo_main
from udpo.config import TrainConfig, parse_config

REPO = Path(__file__).resolve().parents[1]
BOMB = "".join(
    f"- &{a} [{', '.join([f'*{b}'] * 9) if b else ', '.join(['x'] * 9)}]\n"
    for a, b in zip("abcdefgh", [None, *"abcdefg"], strict=True)
)


def train_udpo_main():
    """``main`` of the repository's train_udpo.py script."""
    spec = importlib.util.spec_from_file_location("train_udpo_script", REPO / "train_udpo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


@pytest.fixture
def no_weights(monkeypatch):
    """Any attempt to read model weights fails the test (an AssertionError is caught by no entry point)."""
    from transformers import AutoModelForCausalLM

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the bad setting was refused")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", refuse)


def recipe(tmp_path: Path, model: str, text: str) -> Path:
    """The tiny recipe with ``text`` appended (later keys win in YAML)."""
    path = tmp_path / "recipe.yaml"
    base = yaml.safe_dump({**TINY, "model": model, "output_dir": str(tmp_path / "run")})
    path.write_bytes(base.encode() + text.encode("utf-8", "surrogateescape"))
    return path


def cases(tmp: Path) -> list[tuple[str, str, list[str]]]:
    """(recipe text appended to the tiny recipe, what the error line must say, extra arguments)."""
    a_file = tmp / "a_file"
    a_file.write_text("not a folder")
    no_config = tmp / "model_without_config"
    no_config.mkdir()
    empty = tmp / "empty.jsonl"
    empty.write_text("")
    foreign = tmp / "someone_elses_folder"
    foreign.mkdir()
    (foreign / "metrics.jsonl").write_text('{"loss": 0.5}\n')
    return [
        ("top_p: 0\n", "top_p must be in (0, 1]", []),
        ("adam_beta1: 5\n", "adam_beta1 must be in [0, 1), got 5.0", []),
        ("adam_beta2: -1\n", "adam_beta2 must be in [0, 1), got -1.0", []),
        ("adam_epsilon: -1\n", "adam_epsilon must be a finite number > 0", []),
        (
            "gradient_accumulation_steps: 3\n",
            "gradient_accumulation_steps=3 splits an update of 2 debates",
            [],
        ),
        ("vllm_max_model_len: 0\n", "vllm_max_model_len must be >= 1", []),
        (
            "backend: vllm\nvllm_max_model_len: 16\n",
            "vllm_max_model_len=16 cannot hold a debate",
            [],
        ),
        ("vllm_gpu_memory_utilization: 5\n", "vllm_gpu_memory_utilization must be in (0, 1]", []),
        ("vllm_kv_cache_gib: -2\n", "vllm_kv_cache_gib must be a finite number > 0", []),
        ("algorithm: mappo\nreplay: true\n", "replay belong to udpo", []),
        ("algorithm: rmaac\nadversary_budget: 3\n", "adversary_budget must be in 0..n_agents-1", []),
        (
            "resume: /nonexistent/checkpoint\n",
            "resume: --resume /nonexistent/checkpoint: not a checkpoint",
            [],
        ),
        ("resume: latest\n", "resume: --resume latest: no checkpoint under", []),
        (f"output_dir: {a_file}\n", f"output_dir {a_file}: {a_file} is a file", []),
        (f"output_dir: {a_file}/run\n", f"{a_file} is a file, not a folder", []),
        (f"output_dir: {foreign}\n", "holds a metrics.jsonl that is not a UDPO run's", []),
        ("model: /nonexistent/model\n", "model: unknown model '/nonexistent/model'", []),
        (f"model: {no_config}\n", f"model: model folder {no_config} has no config.json", []),
        ("n_agents: 2\nagent_models: [/no/a, /no/b]\n", "agent_models[0]: unknown model '/no/a'", []),
        ("dtype: float7\n", "dtype must be auto, bf16", []),
        ("lora_target_modules: [q_proj, nope]\n", "lora_target_modules: nope name(s) no module of", []),
        ("lora_target_modules: []\n", "lora_target_modules needs at least one entry", []),
        ("num_train_epochs: .inf\n", "num_train_epochs must be a finite number > 0", []),
        ("learning_rate: .nan\n", "learning_rate must be a finite number > 0", []),
        ("n_agents: .inf\n", "n_agents must be an integer, got inf", []),
        (
            "n_agents: 100000\n",
            "n_agents=100000 is more than 1024: the team's metrics compare every pair",
            [],
        ),
        (  # no round to outgrow a context, but 1,000 replies of 2,048 tokens at once
            "n_agents: 1000\nrounds: 0\nmax_tokens: 2048\n",
            "can generate 2,048,000 tokens, more than the 1,048,576 one debate may hold in memory",
            [],
        ),
        (
            "backend: openai\nbase_url: http://localhost:9\nrounds: 100000\n",
            "(rounds + 1)=100001 replies",
            [],
        ),
        ("task: gsm8k\ndata_path: ' '\ntask_options: null\n", "the data path given is empty (' ')", []),
        ("seed: -1\n", "seed must be in [0, 2**31)", []),
        ("max_iterations: 0\n", "max_iterations must be >= 1", []),
        (
            "task_options: {bogus: 1}\n",
            "task_options: task arithmetic takes difficulty, n_questions, answer_only, not bogus",
            [],
        ),
        ("task_options: {difficulty: 99}\n", "difficulty must be levels among", []),
        (
            "task: nope\n",
            "unknown task 'nope'; choose one of gsm8k, truthfulqa, commonsenseqa, arithmetic",
            [],
        ),
        ("eval_split: nope\n", "eval_split: task arithmetic has no split 'nope'", []),
        ("task_options:\n" + "".join("  " + line for line in BOMB.splitlines(True)), "YAML aliases", []),
        ("profiles: &p [calm]\nalpha: *p\n", "YAML aliases", []),
        ("env: [1, 2]\n", "env must be a mapping", []),
        ("n_agents: [\n", "not valid YAML", []),
        ("question: \udcff\n", "not valid YAML", []),
        (
            "attack_eval: autoinject\nattack_eval_attacker: /no/attacker\n",
            "attack_eval_attacker: unknown",
            [],
        ),
        ("eval_callbacks: ['no_such_module_xyz:fn']\n", "eval_callbacks: cannot import", []),
        (f"task: gsm8k\ndata_path: {tmp}/missing.jsonl\ntask_options: null\n", f"{tmp}/missing.jsonl", []),
        (f"task: gsm8k\ndata_path: {empty}\ntask_options: null\n", f"{empty}: no records", []),
        ("", "task_options must be a mapping", ["--task_options", "[" * 100_000]),
        ("", "unknown config key(s) 'n_agent' (did you mean 'n_agents'?)", ["--n_agent", "2"]),
    ]


def one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one error line, got:\n{err}"
    return lines[0]


def test_hostile_recipes_fail_with_one_line_before_a_model_loads(
    tokenizer_path, tmp_path, monkeypatch, no_weights, capsys
):
    """The recipe names the default model's folder without its weights (its config and tokenizer): what
    the checks read; reading the weights would fail anyway."""
    run_script = train_udpo_main()
    for k, (text, needle, extra) in enumerate(cases(tmp_path)):
        folder = tmp_path / f"case{k}"
        folder.mkdir()
        path = recipe(folder, tokenizer_path, text)
        started = time.perf_counter()
        assert udpo_main(["train", "--config", str(path), *extra]) == 2, text
        line = one_line(capsys.readouterr().err)
        assert line.startswith("udpo train: error: ") and needle in line, (text, line)
        monkeypatch.setattr(sys, "argv", ["train_udpo.py", "--config", str(path), *extra])
        assert run_script() == 2, text
        line = one_line(capsys.readouterr().err)
        assert line.startswith("train_udpo.py: error: ") and needle in line, (text, line)
        assert not (folder / "run" / "metrics.jsonl").exists()
        assert time.perf_counter() - started < 30, text


def test_an_empty_recipe_means_all_defaults(tmp_path):
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert parse_config(["--config", str(empty)]) == TrainConfig()
    comments = tmp_path / "comments.yaml"
    comments.write_text("# nothing set yet\n")
    assert parse_config(["--config", str(comments), "--rounds", "3"]).rounds == 3


@pytest.mark.slow
@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("adam_beta1: 5\n", "adam_beta1 must be in [0, 1)"),  # refused by the config parser
        ("task: gsm8k\ntask_options: null\ndata_path: /nonexistent.jsonl\n", "/nonexistent.jsonl"),  # trainer
    ],
)
@pytest.mark.parametrize("entry", ["udpo", "script"])
def test_entry_points_in_a_real_process(tmp_path, text, needle, entry):
    """A real process: one error line and no loading output. The model folder is a decoy that no library
    can load (its config.json is empty): had anything tried to load it, the error would be another."""
    decoy = tmp_path / "decoy_model"
    decoy.mkdir()
    (decoy / "config.json").write_text("{}")
    path = recipe(tmp_path, str(decoy), text)
    cmd = (
        [sys.executable, "-m", "udpo.cli", "train"]
        if entry == "udpo"
        else [sys.executable, str(REPO / "train_udpo.py")]
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    result = subprocess.run(
        [*cmd, "--config", str(path)], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 2
    assert result.stdout == ""
    line = one_line(result.stderr)
    assert needle in line and "error:" in line
