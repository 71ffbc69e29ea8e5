"""``udpo debate`` end to end: the real model in a real process (files, summary, interrupt and resume, an
engine failure), and bad input named before anything loads (``udpo.cli.main`` in this process)."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from udpo.cli import main
from udpo.env.trajectory import read_trajectories

TINY = [
    "--task",
    "arithmetic",
    "--n-agents",
    "2",
    "--rounds",
    "1",
    "--max-tokens",
    "24",
    "--debate-batch-size",
    "1",
]


def udpo_here(capsys, *args: str) -> tuple[int, str]:
    """``udpo args`` in this process: (exit status, stderr); argparse's refusals exit with status 2."""
    try:
        rc = main(list(args))
    except SystemExit as e:
        rc = e.code
    return rc, capsys.readouterr().err


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_debate_interrupt_resume_and_engine_failure(tmp_path, model_path, capsys):
    """The real model in a real process stopped by SIGINT; the later commands run in this process."""
    out = tmp_path / "run"
    traj_file = out / "trajectories.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "udpo.cli", "debate", *TINY, "--limit", "3", "--output-dir", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # a session started in the background by a shell (`... &`) ignores SIGINT, and so would the child
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None:
        if traj_file.exists() and traj_file.read_text().count("\n") >= 1:
            break
        time.sleep(0.2)
    interrupted = proc.poll() is None
    if interrupted:
        proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    if interrupted:
        assert proc.returncode == 130, err
        assert "interrupted" in err
    kept = read_trajectories(traj_file)  # every line whole and valid
    assert 1 <= len(kept) <= 3
    before = traj_file.read_bytes()

    # the run's folder is not silently appended to
    rc, err = udpo_here(capsys, "debate", *TINY, "--limit", "3", "--output-dir", str(out))
    assert rc == 2 and "--resume" in err

    # an engine failure mid-way leaves what was written intact
    dead = f"http://127.0.0.1:{free_port()}/v1"
    rc, err = udpo_here(
        capsys,
        "debate",
        *TINY,
        "--limit",
        "3",
        "--output-dir",
        str(out),
        "--resume",
        "--backend",
        "openai",
        "--base-url",
        dead,
    )  # the same settings (the engine may change on resume), an engine that is not there
    if len(kept) < 3:
        assert rc == 2, err
        assert dead.split("/v1")[0] in err
    assert traj_file.read_bytes() == before

    assert main(["debate", *TINY, "--limit", "3", "--output-dir", str(out), "--resume", "--no-progress"]) == 0
    done = capsys.readouterr()
    assert "debate:" not in done.err  # no debate progress bar
    trajs = read_trajectories(traj_file)
    assert traj_file.read_bytes().startswith(before)
    assert sorted(t.question_id for t in trajs) == sorted({t.question_id for t in trajs})
    assert len(trajs) == 3
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n_questions"] == 3
    assert summary["accuracy"] == pytest.approx(sum(t.correct for t in trajs) / 3)
    assert summary["run"]["task"] == "arithmetic"
    printed = json.loads(done.out[done.out.index("{") : done.out.rindex("}") + 1])
    assert printed["n_questions"] == 3
    for t in trajs:
        assert len(t.answers) == 2 and all(len(row) == 2 for row in t.answers)
        turn = t.turns[0][1]
        assert turn.completion_ids and len(turn.logprobs) == len(turn.completion_ids)
        assert turn.messages[-1]["role"] == "user" and "Agent 2" in turn.messages[-1]["content"]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--task", "nope"], "argument --task: unknown task 'nope'; choose one of gsm8k"),
        (["--task", "arithmetic", "--model", "no/such-model-here", "--limit", "1"], "no/such-model-here"),
        (["--task", "arithmetic", "--model", "./missing-folder", "--limit", "1"], "missing-folder"),
        (["--task", "gsm8k", "--data-path", "/nonexistent/gsm.jsonl"], "/nonexistent/gsm.jsonl"),
        (["--task", "arithmetic", "--n-agents", "0"], "argument --n-agents/--n_agents: must be >= 1, got 0"),
    ],
)
def test_bad_input_is_named(tmp_path, args, needle, capsys):
    rc, err = udpo_here(capsys, "debate", *args, "--output-dir", str(tmp_path / "o"))
    assert rc == 2
    assert needle in err, err
    assert (
        not (Path(tmp_path) / "o" / "trajectories.jsonl").exists()
        or not (tmp_path / "o" / "trajectories.jsonl").read_text()
    )


def test_malformed_data_file_names_line(tmp_path, capsys):
    bad = tmp_path / "gsm.jsonl"
    bad.write_text('{"question": "1+1?", "answer": "#### 2"}\n{not json\n')
    rc, err = udpo_here(
        capsys, "debate", "--task", "gsm8k", "--data-path", str(bad), "--output-dir", str(tmp_path / "o")
    )
    assert rc == 2
    assert f"{bad}:2" in err or "line 2" in err, err
