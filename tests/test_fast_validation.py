"""A mistake on the command line is answered before anything heavy is imported.

Each bad command runs in a fresh interpreter (this test session has torch loaded already) through
``udpo.cli.main``; the process then reports whether torch, transformers or vllm got imported. Also:
the argparse types, and the token budget chosen per device and task when ``--max-tokens`` is not given.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from udpo.cli import argtypes
from udpo.cli.common import (
    CPU_MAX_TOKENS,
    GPU_MAX_TOKENS,
    default_max_tokens,
    resolve_max_tokens,
    runs_on_cpu,
)
from udpo.env.backends.base import DTYPE_NAMES

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "vllm")

#: (argv, a part of the one error line)
BAD = [
    (
        ["debate", "--task", "arithmetic", "--n-agents", "0"],
        "argument --n-agents/--n_agents: must be >= 1, got 0",
    ),
    (["debate", "--task", "arithmetic", "--rounds", "-1"], "argument --rounds: must be >= 0"),
    (["debate", "--task", "arithmetic", "--temperature", "nan"], "argument --temperature: expected a finite"),
    (["debate", "--task", "arithmetic", "--top-p", "1.5"], "argument --top-p/--top_p: must be in (0, 1]"),
    (
        ["debate", "--task", "arithmetic", "--max_tokens", "0"],
        "argument --max-tokens/--max_tokens: must be >= 1",
    ),
    (["debate", "--task", "arithmetic", "--limit", "0"], "argument --limit: must be >= 1"),
    (["debate", "--task", "arithmetic", "--seed", "-3"], "argument --seed: must be in [0, 2**32)"),
    (["debate", "--task", "arithmetic", "--dtype", "int4"], "argument --dtype: invalid choice"),
    (["debate", "--task", "arithmetic", "--split", "nope"], "unknown split 'nope' for task arithmetic"),
    (["debate", "--task", "arithmetic", "--model", "./no-such-model"], "unknown model './no-such-model'"),
    (["debate", "--task", "arithmetic", "--protocol", "sparse", "--degree", "7"], "degree must be in (0, 1]"),
    (["debate", "--task", "arithmetic", "--api-key-file", "/no/key"], "argument --api-key-file: /no/key"),
    (["eval", "--task", "arithmetic", "--p-message", "2"], "argument --p-message: must be in [0, 1]"),
    (
        ["eval", "--task", "arithmetic", "--attack-eval-m", "0"],
        "argument --attack-eval-m/--attack_eval_m: each value must be >= 1",
    ),
    (
        ["eval", "--task", "arithmetic", "--attack-eval", "autoinject", "--attack-eval-m", "3"],
        "m must be < N",
    ),
    (
        ["eval", "--task", "arithmetic", "--checkpoint", "/no/run"],
        "argument --checkpoint: /no/run: no such file",
    ),
    (["eval", "--task", "arithmetic", "--checkpoint", "RUN_DIR"], "has no team.json"),
    (["detect", "--word-limit", "0"], "argument --word-limit: must be >= 1"),
    (["detect", "--judge-model", "j"], "--judge-model need a backend that serves several models"),
    (["uncertainty", "--task", "commonsenseqa", "--aspects", "0"], "argument --aspects: must be >= 1"),
    (
        [
            "uncertainty",
            "--task",
            "commonsenseqa",
            "--method",
            "self-consistency",
            "--samples",
            "3",
            "--min-votes",
            "4",
        ],
        "--min-votes 4 cannot exceed --samples 3",
    ),
    (["diagnose", "/no/run", "--out", "/tmp/udpo-never"], "no run folder or trajectory file at /no/run"),
    (["diagnose", "RUN", "RUN", "--labels", "a", "--out", "/tmp/udpo-never"], "got 1 labels for 2 runs"),
    (["diagnose", "RUN", "--lam", "2", "--out", "/tmp/udpo-never"], "argument --lam: must be in [0, 1]"),
    (["export", "/no/run", "--out", "/tmp/udpo-never"], "/no/run has no team.json"),
    (["train", "--config", "recipes/quickstart.yaml", "--n_agents", "0"], "n_agents must be >= 1"),
    (["train", "--config", "recipes/quickstart.yaml", "--dtype", "int4"], "dtype must be auto"),
    (
        ["train", "--config", "recipes/quickstart.yaml", "--eval_split", "train"],
        "evaluation must be held out",
    ),
    (["train"], "no --config given"),
]

#: runs each case in this interpreter, in order, and prints one JSON line per case
PROBE = """
import contextlib, io, json, sys
from udpo.cli import main
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code
    heavy = [m for m in {heavy!r} if m in sys.modules]
    print(json.dumps({{"code": code, "err": err.getvalue(), "heavy": heavy}}))
"""


def fresh_python(code: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=REPO, env=env, timeout=300
    )


@pytest.mark.slow
def test_bad_arguments_fail_before_torch_is_imported(tmp_path):
    run = tmp_path / "run.jsonl"
    run.write_text('{"question_id": "q"}\n')  # a file: passes the "exists" check of diagnose
    named = {"RUN": str(run), "RUN_DIR": str(tmp_path)}
    cases = [([named.get(a, a) for a in argv], needle) for argv, needle in BAD]
    done = fresh_python(PROBE.format(heavy=HEAVY), json.dumps([argv for argv, _ in cases]))
    assert done.returncode == 0, done.stderr
    results = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(results) == len(cases), done.stdout + done.stderr
    for (argv, needle), result in zip(cases, results, strict=True):
        assert result["code"] == 2, (argv, result)
        last = result["err"].strip().splitlines()[-1]
        assert needle in last and "error" in last, (argv, result["err"])
        assert result["heavy"] == [], (argv, result["heavy"])  # imported by then: refused too late


@pytest.mark.slow
def test_train_udpo_script_checks_its_config_before_torch():
    code = (
        "import runpy, sys\n"
        "sys.argv = ['train_udpo.py', '--config', 'recipes/quickstart.yaml', '--n_agents', '0']\n"
        "try:\n"
        "    runpy.run_path('train_udpo.py', run_name='__main__')\n"
        "except SystemExit as e:\n"
        "    print('exit', e.code, 'torch' in sys.modules)\n"
    )
    done = fresh_python(code)
    assert done.stdout.split() == ["exit", "2", "False"], done.stdout + done.stderr
    assert "train_udpo.py: error: n_agents must be >= 1" in done.stderr


@pytest.mark.parametrize(
    ("parse", "text", "value"),
    [
        (argtypes.positive_int, "3", 3),
        (argtypes.nonnegative_int, "0", 0),
        (argtypes.seed, "4294967295", 2**32 - 1),
        (argtypes.nonnegative_float, "0.5", 0.5),
        (argtypes.probability, "1", 1.0),
        (argtypes.top_p, "0.9", 0.9),
        (argtypes.int_list(minimum=0), "0, 2,", [0, 2]),
    ],
)
def test_argtypes_accept(parse, text, value):
    assert parse(text) == value


@pytest.mark.parametrize(
    ("parse", "text", "message"),
    [
        (argtypes.positive_int, "0", "must be >= 1, got 0"),
        (argtypes.positive_int, "1.5", "expected an integer, got '1.5'"),
        (argtypes.seed, str(2**32), "must be in [0, 2**32)"),
        (argtypes.nonnegative_float, "-0.1", "must be >= 0, got -0.1"),
        (argtypes.nonnegative_float, "inf", "expected a finite number"),
        (argtypes.probability, "1.01", "must be in [0, 1]"),
        (argtypes.top_p, "0", "must be in (0, 1], got 0"),
        (argtypes.int_list(minimum=1), "1,0", "each value must be >= 1, got 0"),
        (argtypes.int_list(), ",", "expected at least one integer"),
        (argtypes.int_list(), "1,x", "comma-separated integers"),
        (argtypes.existing_path, "/no/such/thing", "no such file or folder"),
        (argtypes.existing_file, "/", "is a folder, not a file"),
    ],
)
def test_argtypes_refuse(parse, text, message):
    with pytest.raises(argparse.ArgumentTypeError, match=re.escape(message)):
        parse(text)


def test_dtype_names_are_those_the_hf_backend_maps():
    from udpo.env.backends.machine import DTYPES

    assert set(DTYPE_NAMES) == set(DTYPES)


def args(**kw) -> argparse.Namespace:
    base = {"task": "arithmetic", "backend": "hf", "device": None, "max_tokens": None}
    return argparse.Namespace(**{**base, **kw})


def test_the_token_budget_follows_the_device_and_the_task():
    assert default_max_tokens("arithmetic", on_cpu=True) == CPU_MAX_TOKENS["arithmetic"] == 96
    assert default_max_tokens("gsm8k", on_cpu=True) == 192
    assert default_max_tokens("some-new-task", on_cpu=True) == 128
    assert default_max_tokens("gsm8k", on_cpu=False) == GPU_MAX_TOKENS == 256
    assert runs_on_cpu(args(device="cpu")) and not runs_on_cpu(args(device="cuda:1"))
    assert not runs_on_cpu(args(backend="openai"))  # a server: its own hardware

    cpu = args(device="cpu")
    note = resolve_max_tokens(cpu)
    assert cpu.max_tokens == 96 and "96 (CPU default for arithmetic" in note
    server = args(backend="openai", task="truthfulqa")
    assert resolve_max_tokens(server) and server.max_tokens == 256
    chosen = args(device="cpu", max_tokens=40)
    assert resolve_max_tokens(chosen) is None and chosen.max_tokens == 40  # the user's choice stands


def test_help_states_the_default_budgets(capsys):
    from udpo.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["debate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "256 on a GPU or server; on CPU 96 for arithmetic" in text


def test_every_command_help_renders_its_percent_signs_once(capsys):
    """Descriptions are printed as written (argparse formats only the options' help), so a '%%' written
    there to escape a percent sign reaches the user doubled."""
    from udpo.cli import build_parser, main

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert "compare" in commands and "train" in commands
    for name in commands:
        with pytest.raises(SystemExit):
            main([name, "--help"])  # train forwards to the training parser
        text = capsys.readouterr().out
        assert "usage:" in text and "%%" not in text, name
