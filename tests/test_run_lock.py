"""One writer per run folder: a second process is refused with the holder named, a killed holder
leaves no stale lock, the trainer, train_udpo.py, ``udpo debate`` and ``udpo eval`` refuse a locked
folder before loading anything, and two ``udpo compare`` processes share the runs instead of training
one twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from study_helpers import finished_run
from train_helpers import start, tiny_config, write_recipe

from udpo.cli import main
from udpo.env.run_folder import LOCK
from udpo.study.plan import CompareConfig
from udpo.study.runner import DONE, format_progress, run_compare
from udpo.training import checkpointing, run_lock
from udpo.training.run_lock import RunBusyError

pytestmark = pytest.mark.slow  # each test holds a lock in another process

HOLD = """
import sys, time
from udpo.training.run_lock import acquire
handle = acquire(sys.argv[1])
print("held", flush=True)
time.sleep(600)
"""


def hold_in_another_process(run_dir: Path) -> subprocess.Popen:
    """A process that locks ``run_dir`` and keeps it until killed."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


@pytest.fixture
def held(tmp_path):
    run_dir = tmp_path / "run"
    proc = hold_in_another_process(run_dir)
    yield run_dir, proc
    proc.kill()
    proc.wait()


def test_a_second_process_is_refused_and_the_holder_is_named(held):
    run_dir, proc = held
    assert run_lock.locked(run_dir)
    assert run_lock.holder(run_dir).startswith(f"pid {proc.pid} on ")
    begun = time.monotonic()
    with pytest.raises(RunBusyError, match=f"being written by another process \\(pid {proc.pid} on "):
        run_lock.acquire(run_dir, patience=0.3)
    assert time.monotonic() - begun >= 0.3  # it waited its patience before giving up
    assert run_lock.locked(run_dir)  # probing did not take the lock away


def test_a_killed_holder_leaves_no_stale_lock(held):
    run_dir, proc = held
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not run_lock.locked(run_dir)
    handle = run_lock.acquire(run_dir, patience=0)
    assert run_lock.holder(run_dir) == f"pid {os.getpid()} on {os.uname().nodename}"
    # held here now: another process is refused, and closing the file releases it
    probe = "import sys; from udpo.training.run_lock import acquire; acquire(sys.argv[1], patience=0)"
    refused = subprocess.run([sys.executable, "-c", probe, str(run_dir)], capture_output=True, text=True)
    assert refused.returncode != 0 and "being written by another process" in refused.stderr
    handle.close()
    assert not run_lock.locked(run_dir)
    assert subprocess.run([sys.executable, "-c", probe, str(run_dir)]).returncode == 0


def test_the_trainer_refuses_a_locked_run_dir_before_loading_anything(held, tokenizer_path):
    from udpo.training.trainer import Trainer

    run_dir, proc = held
    with pytest.raises(RunBusyError, match=f"pid {proc.pid}"):
        Trainer(tiny_config(tokenizer_path, run_dir))
    assert sorted(p.name for p in run_dir.iterdir()) == [LOCK]  # nothing written


def test_train_udpo_exits_with_the_holder_named(held, tokenizer_path, tmp_path):
    run_dir, proc = held
    run = start(write_recipe(tmp_path / "recipe.yaml", tokenizer_path), "--output_dir", str(run_dir))
    output, _ = run.communicate(timeout=300)
    assert run.returncode != 0
    assert f"being written by another process (pid {proc.pid} on " in output and "--resume latest" in output
    assert sorted(p.name for p in run_dir.iterdir()) == [LOCK]


def test_compare_leaves_a_run_another_process_trains_to_it(tmp_path):
    """Two compare processes share the work: a locked run is skipped (not trained twice), the others are
    trained, started runs first, and the tables wait for the skipped run."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(json.dumps({"task": "arithmetic", "eval_questions": 2, "max_iterations": 1}))
    config = CompareConfig(
        recipe=str(recipe), methods=["udpo", "mappo", "rmaac"], seeds=[0], output_dir=str(tmp_path / "out")
    )
    busy = hold_in_another_process(config.run_dir("mappo", 0))
    started = config.run_dir("rmaac", 0) / "checkpoints" / "iter_000000"
    started.mkdir(parents=True)
    (started / "trainer_state.json").write_text("{}")
    (started.parents[1] / "metrics.jsonl").write_text(  # the trainer is writing its next line
        '{"kind": "train", "iteration": 1}\n{"kind": "eval", "iteration": 1}\n{"kind": "tra'
    )
    trained = []

    def fake_train(tc):  # what the trainer does first: lock the folder; then it leaves a finished run
        handle = run_lock.acquire(tc.output_dir, patience=0.1)
        trained.append((Path(tc.output_dir).parent.name, tc.resume))
        finished_run(Path(tc.output_dir), Path(tc.output_dir).parent.name, [True, False], [True, True])
        handle.close()

    try:
        status = format_progress(config)
        assert any("mappo          seed 0: waiting (training now: pid " in line for line in status)
        assert (
            "rmaac          seed 0: started, latest checkpoint iter_000000, iteration 1 of 1, final evaluation"
            in status
        )
        assert run_compare(config, train=fake_train, progress=False) is None  # mappo is not done
    finally:
        busy.kill()
        busy.wait()
    assert trained == [("rmaac", "latest"), ("udpo", None)]
    assert not (config.run_dir("mappo", 0) / DONE).exists()
    assert (config.run_dir("udpo", 0) / DONE).exists() and (config.run_dir("rmaac", 0) / DONE).exists()
    assert not any("training now" in line for line in format_progress(config))


OTHER_WORKER = """
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[2])
from study_helpers import finished_run
from udpo.study.plan import CompareConfig
from udpo.study.runner import DONE, run_compare
from udpo.training import checkpointing, run_lock

def train(tc):  # the trainer's order: lock the folder, check it, train
    with run_lock.held(tc.output_dir):
        checkpointing.check_run_dir(tc, deepspeed=False, critic=False)
        finished_run(Path(tc.output_dir), "udpo", [True, False], [True, True])
        (Path(tc.output_dir) / DONE).unlink()  # the runner writes it, after the trainer
        print("trained", flush=True)

run_compare(CompareConfig(**json.loads(sys.argv[1])), train=train, progress=False)
"""


def test_a_run_another_worker_takes_while_this_one_loads_is_trained_once(tmp_path):
    """Two ``udpo study`` workers reach the same run: this one has looked at it (not started, not done) and
    is loading its trainer when the other looks. Before, the other trained the run whole in that time, and
    this one's trainer then found a run it had not been told to resume and stopped the worker ("already
    holds a run"; seen on the device check's 2-worker study). The look and the training are now one hold of
    the run's lock: the other worker leaves the run to this one."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(json.dumps({"task": "arithmetic", "eval_questions": 2, "max_iterations": 1}))
    plan = {"recipe": str(recipe), "methods": ["udpo"], "seeds": [0], "output_dir": str(tmp_path / "out")}
    config = CompareConfig(**plan)
    trained, other = [], []

    def train(tc):  # this worker's trainer: while it loads, the other worker runs the plan
        done = subprocess.run(
            [sys.executable, "-c", OTHER_WORKER, json.dumps(plan), str(Path(__file__).parent)],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        other.append(done.stdout)
        with run_lock.held(tc.output_dir):
            checkpointing.check_run_dir(tc, deepspeed=False, critic=False)
            trained.append(tc.resume)
            finished_run(Path(tc.output_dir), "udpo", [True, False], [True, True])

    run_compare(config, train=train, progress=False)
    assert trained == [None] and config.recorded("udpo", 0)
    assert "trained" not in other[0] and "left to the process that trains it" in other[0]
    assert not run_lock.locked(config.run_dir("udpo", 0))


def test_two_probes_at_once_see_a_free_folder_and_a_probe_keeps_the_holder_named(tmp_path):
    """What filelock cannot do, and why :func:`run_lock.locked` probes with a shared flock of its own:
    filelock's one probe is taking the exclusive lock, so a second probe at the same moment (another
    ``udpo study --status``, a worker looking at a run) would read the first as a writer. Here a probe
    is caught in the act (its shared lock held in another process)."""
    run_dir = tmp_path / "run"
    run_lock.acquire(run_dir, patience=0).close()
    probing = subprocess.Popen(
        [sys.executable, "-c", PROBE_HELD, str(run_dir / LOCK)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert probing.stdout.readline().strip() == "probing"
        assert not run_lock.locked(run_dir)  # another probe is not a writer
        assert run_lock.holder(run_dir) == f"pid {os.getpid()} on {os.uname().nodename}"
    finally:
        probing.kill()
        probing.wait()


PROBE_HELD = """
import fcntl, sys, time
handle = open(sys.argv[1], encoding="utf-8")
fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
print("probing", flush=True)
time.sleep(600)
"""


def test_a_lent_lock_serves_its_own_thread_only_and_is_freed_with_the_hold(tmp_path):
    run_dir = tmp_path / "run"
    refused = []

    def other_thread():  # flock: another open file of the same process is refused like another process
        try:
            run_lock.acquire(run_dir, patience=0.1).close()
        except RunBusyError as e:
            refused.append(str(e))

    with run_lock.held(run_dir, lend=True):
        borrowed = run_lock.acquire(run_dir, patience=0.1)  # the trainer the holder calls
        assert isinstance(borrowed, run_lock.Borrowed)
        borrowed.close()
        assert run_lock.locked(run_dir)  # closing a borrowed handle keeps the hold
        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
        assert len(refused) == 1 and "being written by another process" in refused[0]
    assert not run_lock.locked(run_dir)
    # not lent: this thread's own second acquire waits like anyone's
    with run_lock.held(run_dir), pytest.raises(RunBusyError):
        run_lock.acquire(run_dir, patience=0.1)


def test_compare_tables_are_written_by_one_process_at_a_time(tmp_path, monkeypatch):
    from udpo.study import runner

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(json.dumps({"task": "arithmetic"}))
    out = tmp_path / "out"
    config = CompareConfig(recipe=str(recipe), methods=["udpo"], seeds=[0], output_dir=str(out))
    busy = hold_in_another_process(out)  # another compare process writing the tables
    monkeypatch.setattr(runner, "TABLES_PATIENCE", 0.3)
    try:
        with pytest.raises(RunBusyError, match="continue with udpo study --tables-only"):
            runner.write_results(config)
    finally:
        busy.kill()
        busy.wait()
    assert sorted(p.name for p in out.iterdir()) == [LOCK]


@pytest.mark.parametrize("command", ["debate", "eval"])
def test_debate_and_eval_refuse_an_out_folder_another_process_writes(held, command, capsys):
    run_dir, proc = held
    argv = [
        command,
        "--task",
        "arithmetic",
        "--limit",
        "1",
        "--output-dir",
        str(run_dir),
        "--resume",
        "--no-progress",
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"being written by another process (pid {proc.pid} on " in err and "continue with --resume" in err
    assert sorted(p.name for p in run_dir.iterdir()) == [LOCK]
