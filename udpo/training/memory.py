"""What a training process holds in memory, and handing freed host memory back after each iteration.

On a CPU, every update pass has a shape of its own (packed rows of new widths), so the allocator sees
blocks of ever-new sizes: glibc keeps the freed ones in its free lists and a run's resident memory climbs
iteration after iteration (on this project's machine, a study process grew from 3.7 to over 7 GB in 100
iterations). ``malloc_trim(0)`` after each iteration returns the free pages to the system; it does not
touch live tensors, so no number of the run changes (``benchmarks/host_memory.py`` measures both).

:class:`TensorBytes` counts the bytes of the tensors a block of code creates while they live, on any
device (fake and meta tensors included): what ``benchmarks/update_memory.py`` holds the update's
memory estimate (:mod:`udpo.training.autosize`) against.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import weakref
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


@functools.cache
def _malloc_trim():
    """glibc's ``malloc_trim``, or None where the C library has none (macOS, musl)."""
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None


def trim_heap() -> bool:
    """Give the C heap's free pages back to the system; False where the C library cannot."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


def status_bytes(field: str = "VmRSS", status: str | Path = "/proc/self/status") -> int | None:
    """A memory line of ``/proc/self/status`` (``VmRSS`` resident now, ``VmHWM`` its peak) in bytes, or None
    where the kernel does not say."""
    try:
        lines = Path(status).read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024  # kB
    return None


def resident_gib(status: str | Path = "/proc/self/status") -> float | None:
    """This process's resident memory (``VmRSS``) in GiB, or None where ``/proc`` does not say."""
    rss = status_bytes("VmRSS", status)
    return None if rss is None else rss / 2**30


def reset_resident_peak(clear_refs: str | Path = "/proc/self/clear_refs") -> bool:
    """Start ``VmHWM`` (the resident-memory peak) afresh from the resident memory now; False where the
    kernel does not let this process (no ``/proc``, or a kernel older than 4.0)."""
    try:
        Path(clear_refs).write_text("5")
    except OSError:
        return False
    return True


class PhasePeaks:
    """The peak memory of each phase of an iteration (``with peaks("rollout"): ...``): the most GPU memory
    allocated in it (``torch.cuda.max_memory_allocated``, its counter reset as the phase starts) or, on a
    CPU, the process's peak resident memory in it (``VmHWM``, reset through ``/proc/self/clear_refs``).
    The iteration's own peak (``memory/peak_gib`` of :func:`memory_metrics`) still covers every phase."""

    def __init__(self) -> None:
        self.gpu = torch.cuda.is_available()
        self.peaks: dict[str, float] = {}
        self._before = 0  # GPU bytes: the iteration's peak before the running phase reset the counter

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        if self.gpu:
            self._before = max(self._before, torch.cuda.max_memory_allocated())
            torch.cuda.reset_peak_memory_stats()
        resident = not self.gpu and reset_resident_peak()
        yield
        if self.gpu:
            self.peaks[f"memory/{phase}_peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
        elif resident and (peak := status_bytes("VmHWM")) is not None:
            self.peaks[f"memory/{phase}_rss_peak_gib"] = round(peak / 2**30, 3)

    def metrics(self) -> dict[str, float]:
        """Each phase's peak so far, and the iteration's ``memory_metrics`` (every phase's peak within the
        iteration's); starts the next iteration afresh."""
        before, self._before = self._before, 0
        out = {**self.peaks, **memory_metrics(floor=before)}
        self.peaks = {}
        return out


def memory_metrics(floor: int = 0) -> dict[str, float]:
    """The iteration's memory keys, read after :func:`trim_heap`.

    ``memory/peak_gib``: the most GPU memory this process held since the last call (GPUs only; at least
    ``floor`` bytes, a peak read before the counter was last reset); ``memory/rss_gib``: the process's
    resident host memory now (where ``/proc`` tells it).
    """
    trim_heap()
    out = {}
    if torch.cuda.is_available():
        out["memory/peak_gib"] = round(max(floor, torch.cuda.max_memory_allocated()) / 2**30, 3)
        torch.cuda.reset_peak_memory_stats()
    rss = resident_gib()
    if rss is not None:
        out["memory/rss_gib"] = round(rss, 3)
    return out


class TensorBytes(TorchDispatchMode):
    """Inside ``with TensorBytes() as counter:``, the bytes of tensor storage that the block's operations
    create and that are still alive (``now``), and the most at any moment (``peak``), with what was alive
    then (:meth:`at_peak`: bytes by ``label``, operation, dtype). A storage counts once, from the
    operation that made it until its last tensor is freed; views and in-place results of storages made
    before the block (a model's weights) do not count, nor do buffers an operation uses inside itself.
    ``label``: what the caller is running (a module's name, say), recorded with each storage."""

    def __init__(self) -> None:
        super().__init__()
        self.now = self.peak = 0
        self.label = ""
        self._live: dict[int, tuple[int, str]] = {}
        self._at_peak: dict[int, tuple[int, str]] = {}

    def _freed(self, key: int) -> None:
        self.now -= self._live.pop(key)[0]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        inputs = {
            t.untyped_storage()._cdata for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)
        }
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            key = storage._cdata
            if key in self._live or key in inputs:
                continue
            self._live[key] = (
                storage.nbytes(),
                f"{self.label} {func.__name__} {str(t.dtype).removeprefix('torch.')}",
            )
            self.now += storage.nbytes()
            weakref.finalize(storage, self._freed, key)
            if self.now > self.peak:
                self.peak = self.now
                self._at_peak = dict(self._live)
        return out

    def at_peak(self) -> Counter[str]:
        """Bytes alive at the peak, by label, operation and dtype."""
        out: Counter[str] = Counter()
        for size, what in self._at_peak.values():
            out[what] += size
        return out
