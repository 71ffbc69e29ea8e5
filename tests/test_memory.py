"""Host memory: VmRSS parsing, malloc_trim really returning freed heap pages to the system, and the
peak memory of each phase of an iteration."""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap

import pytest
import torch

from udpo.training.memory import (
    PhasePeaks,
    memory_metrics,
    reset_resident_peak,
    resident_gib,
    status_bytes,
    trim_heap,
)


def test_status_lines_are_read_in_kib(tmp_path):
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nVmPeak:\t 9999 kB\nVmRSS:\t 3145728 kB\nThreads:\t4\n")
    assert resident_gib(status) == 3.0
    assert status_bytes("VmPeak", status) == 9999 * 1024
    status.write_text("Name:\tpython\n")  # a kernel that does not say
    assert resident_gib(status) is None
    assert resident_gib(tmp_path / "missing") is None


def test_resident_gib_of_this_process_is_plausible():
    rss = resident_gib()
    assert rss is not None and 0.01 < rss < 64
    assert memory_metrics()["memory/rss_gib"] == pytest.approx(resident_gib(), abs=0.05)


def test_trim_heap_returns_freed_pages_that_free_alone_keeps():
    """Blocks of 64 KiB come from the heap (below glibc's mmap threshold); the last one, kept, pins the
    heap's top above the others, so free() alone cannot give their pages back, and malloc_trim must."""
    if not trim_heap():
        pytest.skip("the C library has no malloc_trim (not glibc)")
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    size, count = 64 * 1024, 4096  # 256 MiB
    blocks = [libc.malloc(size) for _ in range(count)]
    assert all(blocks)
    for b in blocks:
        ctypes.memset(b, 1, size)  # make the pages resident
    held = resident_gib()
    for b in blocks[:-1]:
        libc.free(b)
    freed = resident_gib()
    assert trim_heap()
    trimmed = resident_gib()
    libc.free(blocks[-1])
    assert freed > held - 0.05  # free() kept the pages
    assert trimmed < freed - 0.2  # malloc_trim gave back most of the 0.25 GiB


def test_each_phase_reports_its_own_peak_and_the_iteration_keeps_the_highest(monkeypatch):
    """On a GPU (a fake allocator's counter here): each phase counts from its start, and the iteration's
    ``memory/peak_gib`` is still the highest of all, though the counter was reset between phases."""
    counter = {"peak": 0}

    def allocate(gib: float) -> None:
        counter["peak"] = max(counter["peak"], int(gib * 2**30))

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: counter["peak"])
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda: counter.update(peak=0))
    peaks = PhasePeaks()
    allocate(1.0)  # before the rollout: counted in the iteration's peak only
    with peaks("rollout"):
        allocate(5.0)
    allocate(0.5)  # the reward, between the phases
    with peaks("update"):
        allocate(3.0)
    got = peaks.metrics()
    assert {k: got[k] for k in ("memory/rollout_peak_gib", "memory/update_peak_gib", "memory/peak_gib")} == {
        "memory/rollout_peak_gib": 5.0,
        "memory/update_peak_gib": 3.0,
        "memory/peak_gib": 5.0,
    }
    with peaks("update"):  # the next iteration starts afresh
        allocate(2.0)
    got = peaks.metrics()
    assert "memory/rollout_peak_gib" not in got and got["memory/peak_gib"] == 2.0


def test_on_a_cpu_each_phase_reports_its_resident_peak():
    if not reset_resident_peak():
        pytest.skip("this kernel does not let a process restart its resident peak")
    peaks = PhasePeaks()
    with peaks("rollout"):
        # 256 MiB of fresh anonymous pages, each written: a malloc'd block could reuse heap pages this worker
        # already holds resident (earlier tests' freed memory) and raise no peak at all
        size, chunk = 256 * 2**20, b"\x01" * 2**20
        with mmap.mmap(-1, size) as block:
            for offset in range(0, size, len(chunk)):
                block[offset : offset + len(chunk)] = chunk
    with peaks("update"):
        pass
    got = peaks.metrics()
    assert "memory/peak_gib" not in got or torch.cuda.is_available()
    assert got["memory/rollout_rss_peak_gib"] >= got["memory/update_rss_peak_gib"] + 0.2
