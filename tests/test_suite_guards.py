"""The suite's own rules (tests/suite_guards.py), each shown failing: an unmarked test that asks for the real
model, loads its weights (in its process or a child process) or starts a Python interpreter fails, and a
test file over its time budget fails the run with its name. Each case runs pytest on a small probe file in
a subprocess, so each is marked slow itself."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # each test starts pytest in a subprocess

TESTS = Path(__file__).resolve().parent


def run_probe(tmp_path: Path, source: str, *args: str) -> subprocess.CompletedProcess:
    """``pytest -p suite_guards`` on ``source`` written as a test file of its own (outside this suite)."""
    (tmp_path / "test_probe.py").write_text(textwrap.dedent(source))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "pytest", "-p", "suite_guards", "-p", "no:cacheprovider", "-q", "-rA", *args]
    return subprocess.run(
        [*cmd, str(tmp_path / "test_probe.py")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_an_unmarked_test_asking_for_the_real_model_fails_before_its_fixtures(tmp_path):
    probe = run_probe(
        tmp_path,
        """
        import pytest

        SET_UP = []

        @pytest.fixture
        def model_path():
            SET_UP.append(1)  # never reached: the guard refuses first
            return "the real model"

        def test_unmarked(model_path):
            pass

        @pytest.mark.slow
        def test_marked(model_path):
            assert model_path == "the real model"

        def test_nothing_was_set_up_for_the_refused_one():
            assert SET_UP == [1]  # the marked test's, only
        """,
    )
    out = probe.stdout + probe.stderr
    assert probe.returncode == 1, out
    assert "1 error" in out and "2 passed" in out, out
    assert "test_unmarked uses model_path (the real model) but is not marked slow" in out


def test_an_unmarked_test_loading_the_default_model_fails_in_process_and_in_child_processes(tmp_path):
    probe = run_probe(
        tmp_path,
        """
        import multiprocessing

        LOAD = (
            "from transformers import AutoModelForCausalLM\\n"
            "from udpo.env.models import resolve_model\\n"
            "AutoModelForCausalLM.from_pretrained(resolve_model('smollm2-135m-instruct'))\\n"
        )

        def test_loads_in_process():
            exec(LOAD)

        def test_loads_in_a_child_process():  # a spawned child inherits the test's UDPO_CACHE
            with multiprocessing.get_context("spawn").Pool(1) as pool:
                pool.apply(exec, (LOAD, {}))

        def test_the_tokenizer_still_loads():
            from transformers import AutoTokenizer
            from udpo.env.models import resolve_model

            assert len(AutoTokenizer.from_pretrained(resolve_model("smollm2-135m-instruct"))) > 1000
        """,
    )
    out = probe.stdout + probe.stderr
    assert probe.returncode == 1, out
    assert "2 failed, 1 passed" in out, out
    assert out.count("UNMARKED_TEST_LOADED_THE_REAL_MODEL_MARK_IT_SLOW") >= 2, out
    assert "test_loads_in_process is not marked slow but loaded the real model's weights" in out, out


def test_an_unmarked_test_starting_a_python_process_fails_at_the_call(tmp_path):
    probe = run_probe(
        tmp_path,
        """
        import subprocess
        import sys

        import pytest

        def test_unmarked_starts_python():
            subprocess.run([sys.executable, "-c", "print('ran')"], check=True)

        def test_unmarked_starts_a_command_by_name():
            subprocess.run("udpo --help", shell=True, check=True)

        def test_unmarked_may_start_other_programs():
            assert subprocess.run(["true"]).returncode == 0

        @pytest.mark.slow
        def test_marked_starts_python():
            done = subprocess.run([sys.executable, "-c", "print('ran')"], capture_output=True, text=True)
            assert done.stdout == "ran\\n"
        """,
    )
    out = probe.stdout + probe.stderr
    assert probe.returncode == 1, out
    assert "2 failed, 2 passed" in out, out
    assert (
        "UNMARKED_TEST_STARTED_A_PROCESS_MARK_IT_SLOW: test_probe.py::test_unmarked_starts_python starts"
        in out
    )
    assert "test_unmarked_starts_a_command_by_name is not marked slow but started a process" in out, out


def test_a_file_over_its_budget_fails_the_run_with_its_name(tmp_path):
    source = """
        import time

        def test_one():
            time.sleep(0.6)

        def test_two():
            time.sleep(0.6)
        """
    over = run_probe(tmp_path, source, "--file-budget", "1")
    out = over.stdout + over.stderr
    assert over.returncode == 1, out
    assert "2 passed" in out, out
    assert "FAILED test file budget: test_probe.py took" in out and "over 1 s" in out, out
    within = run_probe(tmp_path, source, "--file-budget", "30")
    assert within.returncode == 0, within.stdout + within.stderr
    assert "slowest test files (budget 30 s a file)" in within.stdout
