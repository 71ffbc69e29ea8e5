"""One writer per run folder: an exclusive lock on the folder's lock file
(:attr:`udpo.env.run_folder.RunFolder.lock`) while a trainer lives, or while ``udpo debate`` / ``udpo
eval`` write their ``--output-dir``.

Two processes writing one folder (a command started twice, two ``udpo compare`` processes on the same
runs) would interleave their appends to metrics.jsonl and the trajectory files and replace each
other's checkpoints. The lock is ``filelock``'s native lock, an advisory ``flock`` on an open file: the
kernel drops it when the holder closes the file or exits, however it exits (SIGKILL included), so a
killed run never leaves a stale lock behind and resumes as before. The file names its holder (pid and
host) for the error and for ``udpo compare --status``; it stays in the folder after the run (removing it
while another process may be opening it would let two processes lock two different files).

A holder may lend its lock to what it calls in the same thread (:func:`held` with ``lend``): ``udpo
study`` holds a run's folder from its look at the run (done? started?) to the run's record, and the trainer
it calls inside takes the lock it was lent. So no other worker can finish or start the run between the
look and the training.
"""

from __future__ import annotations

import fcntl
import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

from filelock import FileLock, Timeout

from udpo.env.run_folder import RunFolder


class _Lent(threading.local):
    """Per thread, the folders whose locks it lends (:func:`held` with ``lend``)."""

    def __init__(self) -> None:
        self.folders: set[Path] = set()


_lent = _Lent()


class RunBusyError(RuntimeError):
    """Another process is writing the run folder."""


class LockHandle(Protocol):
    """What :func:`acquire` returns: ``close()`` gives the lock back."""

    def close(self) -> None: ...


class Borrowed:
    """A lock this thread was lent (:func:`held` with ``lend``): closing it leaves the lender's hold."""

    def close(self) -> None:
        pass


class Hold:
    """A lock this process took (:func:`acquire`): ``close()`` gives it back (once; again is fine)."""

    def __init__(self, lock: FileLock) -> None:
        self._lock = lock

    def close(self) -> None:
        self._lock.release()


def _name_holder(fd: int) -> None:
    """Write "pid N on HOST" into the lock file just taken (``filelock``'s ``on_acquired``)."""
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)


def acquire(run_dir: str | os.PathLike, patience: float = 1.0, resume: str = "--resume latest") -> LockHandle:
    """Lock ``run_dir`` (created if missing) for this process; returns a :class:`Hold`, whose
    ``close()`` releases it, or a :class:`Borrowed` handle where this thread was lent the lock. Raises
    :class:`RunBusyError` naming the holder when another process still holds it after ``patience``
    seconds (which also covers :func:`locked`'s momentary probe); ``resume``: the flag that continues the
    holder's work, for the message."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if run_dir.resolve() in _lent.folders:
        return Borrowed()
    # not thread-local: a hold is the process's, given back by whichever thread closes it;
    # preserve_lock_file: the file stays (see the module docstring)
    lock = FileLock(
        RunFolder(run_dir).lock,
        timeout=patience,
        thread_local=False,
        preserve_lock_file=True,
        on_acquired=_name_holder,
    )
    try:
        lock.acquire()
    except Timeout:
        raise RunBusyError(
            f"{run_dir} is being written by another process ({holder(run_dir) or 'holder unknown'}); "
            f"let it finish, or stop it and continue with {resume}"
        ) from None
    return Hold(lock)


@contextmanager
def held(
    run_dir: str | os.PathLike, resume: str = "--resume latest", patience: float = 1.0, lend: bool = False
) -> Iterator[None]:
    """Hold ``run_dir``'s lock for a block (:func:`acquire`). ``lend``: inside the block this thread's own
    :func:`acquire` of ``run_dir`` takes the held lock (a :class:`Borrowed` handle) instead of waiting
    for it."""
    handle = acquire(run_dir, patience=patience, resume=resume)
    folder = Path(run_dir).resolve()
    lends = lend and folder not in _lent.folders  # (a hold inside a lending one leaves the lending to it)
    if lends:
        _lent.folders.add(folder)
    try:
        yield
    finally:
        if lends:
            _lent.folders.discard(folder)
        handle.close()


def locked(run_dir: str | os.PathLike) -> bool:
    """Whether a process holds ``run_dir``'s lock now (a shared lock taken and dropped at once).

    A shared ``flock`` on the same file, not ``filelock``: its only probe is taking the exclusive lock,
    so two probes at once (two ``--status`` readers, a worker looking at a run) would each see the other
    as a holder, where a shared probe sees only a writer (``tests/test_run_lock.py``, two probes at once)."""
    try:
        handle = RunFolder(Path(run_dir)).lock.open(encoding="utf-8")
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
        text = RunFolder(Path(run_dir)).lock.read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return text or None


def acquire_on_main(run_dir: str | os.PathLike, main: bool) -> LockHandle | None:
    """The main process of a training run locks ``run_dir`` (:func:`acquire`); every process raises
    RunBusyError when another process holds it. Returns the main process's handle (None elsewhere)."""
    from udpo.training import distributed as dist

    busy: RunBusyError | None = None
    handle = None
    if main:
        try:
            handle = acquire(run_dir)
        except RunBusyError as e:
            busy = e
    if dist.any_true(busy is not None):
        raise busy or RunBusyError(f"{run_dir} is being written by another process")
    return handle
