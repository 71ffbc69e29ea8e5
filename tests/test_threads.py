"""Thread choice (udpo.threads): the formula on hand cases, explicit settings winning, bad values, and a
launcher's default told apart from the user's choice."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from train_helpers import EXPLICIT, write_recipe

from udpo.threads import (
    ENV,
    Parent,
    accelerate_flag,
    available_cores,
    choose_threads,
    configure_threads,
    describe,
)

REPO = Path(__file__).resolve().parents[1]
#: how ``udpo.threads`` sees the shell a plain ``python train_udpo.py`` was typed in (not a launcher)
SHELL = Parent(environ={}, argv=["bash"])


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize(
    ("cores", "busy", "processes", "threads"),
    [
        (2, 0.0, 1, 2),  # an idle 2-core machine: both cores
        (2, 1.1, 1, 1),  # one other busy process: the free core only
        (2, 0.4, 2, 1),  # two torchrun ranks: a core each
        (16, 3.0, 4, 3),  # (16 - 3) // 4
        (2, 7.0, 1, 1),  # busier than the cores: still one thread
        (8, -1.0, 1, 8),  # a negative estimate counts as idle
    ],
)
def test_threads_are_the_free_cores_shared_among_the_runs_processes(cores, busy, processes, threads):
    assert choose_threads(cores, busy, processes) == threads


def test_choose_threads_rejects_no_cores():
    with pytest.raises(ValueError, match=">= 1"):
        choose_threads(0, 0.0, 1)


def test_an_explicit_thread_count_wins(restore_threads):
    choice = configure_threads(environ={ENV: "1", "LOCAL_WORLD_SIZE": "1"})
    assert (choice.threads, torch.get_num_threads()) == (1, 1)
    torch.set_num_threads(2)
    kept = configure_threads(environ={"OMP_NUM_THREADS": "2"}, parent=SHELL)
    assert kept.threads == 2 and "OMP_NUM_THREADS=2" in kept.reason
    for bad in ("two", "0"):
        with pytest.raises(ValueError, match=ENV):
            configure_threads(environ={ENV: bad})


def test_each_rank_of_a_run_that_fills_the_machine_gets_one_thread(restore_threads):
    choice = configure_threads(environ={"LOCAL_WORLD_SIZE": str(available_cores())}, parent=SHELL)
    assert choice.threads == torch.get_num_threads() == 1


ACCELERATE = ["/venv/bin/python", "/venv/bin/accelerate", "launch"]
#: what ``accelerate launch`` puts in its children's environment (OMP_NUM_THREADS always)
ACCELERATE_CHILD = {"ACCELERATE_DYNAMO_BACKEND": "NO", "ACCELERATE_MIXED_PRECISION": "no"}
#: what torchrun's workers carry (OMP_NUM_THREADS=1 when it was unset in torchrun's own environment)
TORCHRUN_CHILD = {"TORCHELASTIC_RUN_ID": "none", "LOCAL_WORLD_SIZE": str(available_cores())}


@pytest.mark.parametrize(
    ("child", "launcher"),
    [
        (ACCELERATE_CHILD, Parent(environ={"PATH": "/bin"}, argv=[*ACCELERATE, "train_udpo.py"])),
        (TORCHRUN_CHILD, Parent(environ={"PATH": "/bin"}, argv=["/venv/bin/torchrun", "train_udpo.py"])),
        (ACCELERATE_CHILD, Parent(environ=None, argv=None)),  # no /proc: a launched process's 1 is a default
    ],
    ids=["accelerate", "torchrun", "unreadable-parent"],
)
def test_a_launchers_default_is_replaced_by_the_processs_share(child, launcher, restore_threads):
    torch.set_num_threads(available_cores())
    env = {**child, "OMP_NUM_THREADS": "1"}
    processes = int(env.get("LOCAL_WORLD_SIZE", "1"))
    choice = configure_threads(environ=env, parent=launcher)
    assert (
        f"{processes} process(es) of this run (OMP_NUM_THREADS=1 was the launcher's default)" in choice.reason
    )
    assert choice.threads == torch.get_num_threads()
    if processes == available_cores():  # the run fills the machine: one thread each, whatever the load
        assert choice.threads == 1


@pytest.mark.parametrize(
    ("child", "launcher", "omp"),
    [
        # OMP_NUM_THREADS in the shell that started the launcher (accelerate passes it on as it was)
        (ACCELERATE_CHILD, Parent(environ={"OMP_NUM_THREADS": "1"}, argv=[*ACCELERATE, "t.py"]), "1"),
        (TORCHRUN_CHILD, Parent(environ={"OMP_NUM_THREADS": "1"}, argv=["torchrun", "t.py"]), "1"),
        # the marks came from further up (the parent has them too): the parent is not the launcher
        (ACCELERATE_CHILD, Parent(environ=dict(ACCELERATE_CHILD), argv=["bash", "run.sh"]), "1"),
        # no launcher at all: a test harness that set the variable for its child alone
        ({}, Parent(environ={}, argv=["pytest"]), "1"),
        (ACCELERATE_CHILD, Parent(environ=None, argv=None), "3"),  # no /proc: only 1 is a launcher's value
    ],
    ids=["accelerate", "torchrun", "not-the-launcher", "no-launcher", "unreadable-parent"],
)
def test_the_users_own_omp_num_threads_is_kept(child, launcher, omp, restore_threads):
    torch.set_num_threads(2)
    choice = configure_threads(environ={**child, "OMP_NUM_THREADS": omp}, parent=launcher)
    assert (choice.threads, choice.reason) == (2, f"OMP_NUM_THREADS={omp} (set by the user)")
    assert torch.get_num_threads() == 2


@pytest.mark.parametrize(
    "flag",
    [
        ["--num_cpu_threads_per_process", "3"],
        ["--num_cpu_threads_per_process=3"],
        ["--num-cpu-threads-per-process", "3"],
    ],
)
def test_accelerates_thread_flag_is_the_users_choice_and_applied(flag, restore_threads):
    # accelerate's DeepSpeed path drops the flag (its children see torchrun's OMP_NUM_THREADS=1): applied
    launcher = Parent(environ={}, argv=[*ACCELERATE, *flag, "--num_processes", "2", "train_udpo.py"])
    choice = configure_threads(environ={**TORCHRUN_CHILD, "OMP_NUM_THREADS": "1"}, parent=launcher)
    assert (choice.threads, torch.get_num_threads()) == (3, 3)
    assert choice.reason == "--num_cpu_threads_per_process 3 of accelerate launch"
    # UDPO_NUM_THREADS is still first
    first = configure_threads(environ={**ACCELERATE_CHILD, "OMP_NUM_THREADS": "3", ENV: "1"}, parent=launcher)
    assert (first.threads, first.reason) == (1, f"{ENV}=1")
    with pytest.raises(ValueError, match="--num_cpu_threads_per_process must be a whole number"):
        configure_threads(
            environ=ACCELERATE_CHILD, parent=Parent({}, [*ACCELERATE, "--num_cpu_threads_per_process=x"])
        )


def test_accelerate_flag_reads_both_spellings_and_nothing_else():
    assert accelerate_flag([*ACCELERATE, "--num_cpu_threads_per_process", "4", "t.py"]) == "4"
    assert accelerate_flag([*ACCELERATE, "--num-cpu-threads-per-process=2", "t.py"]) == "2"
    assert accelerate_flag([*ACCELERATE, "--num_processes", "2", "t.py", "--threads", "3"]) is None
    assert accelerate_flag([*ACCELERATE, "--num_cpu_threads_per_process"]) is None  # no value given


def test_the_header_names_the_choice_while_it_holds(restore_threads):
    configure_threads(environ={ENV: "1"}, parent=SHELL)
    assert describe() == f"1 ({ENV}=1)"
    torch.set_num_threads(2)  # changed behind the choice's back: no longer its reason
    assert describe() == f"2 (torch's own count; {ENV}=k chooses)"


def udpo(*args: str, threads: str) -> subprocess.CompletedProcess:
    """``udpo ARGS`` in a fresh interpreter with UDPO_NUM_THREADS; prints torch's threads afterwards."""
    code = "import sys, torch; from udpo.cli import main; main(sys.argv[1:]); print(torch.get_num_threads())"
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env={**env, ENV: threads}
    )


@pytest.mark.slow
def test_the_cli_sets_threads(tmp_path):
    empty = tmp_path / "empty.jsonl"  # passes the argument checks, fails after the threads are chosen
    empty.write_text("\n")
    diagnosed = udpo("diagnose", str(empty), "--out", str(tmp_path / "out"), threads="1")
    assert diagnosed.stdout.split() == ["1"] and "no debates in this file" in diagnosed.stderr
    bad = udpo("diagnose", str(empty), "--out", str(tmp_path / "out"), threads="many")
    assert f"udpo diagnose: error: {ENV} must be a whole number" in bad.stderr


def test_the_busy_estimate_is_a_count_of_cpus():
    from udpo.threads import _busy_now

    busy = _busy_now(window=0.05)
    assert 0.0 <= busy <= (os.cpu_count() or 1)


#: a one-iteration training of the tiny model: long enough to print the run's header
LAUNCHED = {**EXPLICIT, "max_iterations": 1, "eval_questions": 0, "save_steps": 1}
HEADER = re.compile(
    r"torch threads per process: (\d+) \((\d+) cores, about (\d+) busy with other work, (\d+) process\(es\) "
    r"of this run \(OMP_NUM_THREADS=1 was the launcher's default\); set UDPO_NUM_THREADS to choose\)"
)
#: accelerate launch, told what it would otherwise warn about
ACCELERATE_LAUNCH = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1",
                     "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]  # fmt: skip
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]


def launch(*cmd: str, **env: str) -> subprocess.CompletedProcess:
    """``cmd`` from the repository, in an environment where the user chose no thread count, plus ``env``."""
    chosen = (ENV, "OMP_NUM_THREADS", "MKL_NUM_THREADS")
    base = {k: v for k, v in os.environ.items() if k not in chosen}
    result = subprocess.run(
        cmd, cwd=REPO, env={**base, "TOKENIZERS_PARALLELISM": "false", **env}, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return result


@pytest.mark.slow
@pytest.mark.parametrize(
    ("launcher", "processes"), [(ACCELERATE_LAUNCH, 1), (TORCHRUN, 2)], ids=["accelerate", "torchrun"]
)
def test_a_launched_training_takes_its_share_of_the_cores(launcher, processes, tiny_model, tmp_path):
    recipe = write_recipe(tmp_path / "recipe.yaml", tiny_model, output_dir=str(tmp_path / "run"), **LAUNCHED)
    result = launch(*launcher, "train_udpo.py", "--config", str(recipe))
    header = HEADER.search(result.stderr)
    assert header is not None, result.stderr[-4000:]
    threads, cores, busy, ranks = map(int, header.groups())
    assert (cores, ranks) == (available_cores(), processes)
    assert threads == choose_threads(cores, busy, ranks)  # not the launcher's 1


CHOICE = "from udpo.threads import configure_threads; c = configure_threads(); print(c.threads, c.reason)"


@pytest.mark.slow
def test_a_thread_count_the_user_gave_the_launcher_is_kept(tmp_path):
    script = tmp_path / "choice.py"
    script.write_text(CHOICE)
    in_the_shell = launch(*ACCELERATE_LAUNCH, str(script), OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    assert in_the_shell.stdout.splitlines()[-1] == "1 OMP_NUM_THREADS=1 (set by the user)"
    flag = ["--num_cpu_threads_per_process", "1"]
    by_flag = launch(*ACCELERATE_LAUNCH, *flag, str(script), PYTHONPATH=str(REPO))
    assert by_flag.stdout.splitlines()[-1] == "1 --num_cpu_threads_per_process 1 of accelerate launch"
