"""Thread choice (udpo.threads): the formula on hand cases, explicit settings winning, bad values."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from udpo.threads import ENV, available_cores, choose_threads, configure_threads


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
    kept = configure_threads(environ={"OMP_NUM_THREADS": "2"})
    assert kept.threads == 2 and "OMP_NUM_THREADS=2" in kept.reason
    for bad in ("two", "0"):
        with pytest.raises(ValueError, match=ENV):
            configure_threads(environ={ENV: bad})


def test_each_rank_of_a_run_that_fills_the_machine_gets_one_thread(restore_threads):
    choice = configure_threads(environ={"LOCAL_WORLD_SIZE": str(available_cores())})
    assert choice.threads == torch.get_num_threads() == 1


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
