"""One trainer per run directory: an exclusive lock on ``RUN_DIR/.lock`` while a trainer lives.

Two processes training into one folder (a command started twice, two ``udpo compare`` processes on the
same runs) would interleave their appends to metrics.jsonl and the trajectory files and replace each
other's checkpoints. The lock is an advisory ``flock`` on an open file: the kernel drops it when the
holder closes the file or exits, however it exits (SIGKILL included), so a killed run never leaves a
stale lock behind and resumes as before. The file names its holder (pid and host) for the error and for
``udpo compare --status``; it stays in the folder after the run (removing it while another process may
be opening it would let two processes lock two different files).
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from pathlib import Path
from typing import IO

from udpo.training.errors import RunBusyError

LOCK_FILE = ".lock"


def acquire(run_dir: str | os.PathLike, patience: float = 1.0) -> IO[str]:
    """Lock ``run_dir`` (created if missing) for this process; returns the open lock file, whose
    ``close()`` releases it. Raises :class:`RunBusyError` naming the holder when another process still
    holds it after ``patience`` seconds (which also covers :func:`locked`'s momentary probe)."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    handle = (run_dir / LOCK_FILE).open("a+", encoding="utf-8")
    deadline = time.monotonic() + patience
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() < deadline:
                time.sleep(0.05)
                continue
            handle.close()
            raise RunBusyError(
                f"{run_dir} is being trained by another process ({holder(run_dir) or 'holder unknown'}); "
                "let it finish, or stop it and resume with --resume latest"
            ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
    handle.flush()
    return handle


def locked(run_dir: str | os.PathLike) -> bool:
    """Whether a process holds ``run_dir``'s lock now (a shared lock taken and dropped at once)."""
    try:
        handle = (Path(run_dir) / LOCK_FILE).open(encoding="utf-8")
    except OSError:
        return False
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        return False  # closing the file drops the shared lock


def holder(run_dir: str | os.PathLike) -> str | None:
    """Who holds, or last held, ``run_dir``'s lock ("pid N on HOST"); None when nobody ever did."""
    try:
        text = (Path(run_dir) / LOCK_FILE).read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return text or None
