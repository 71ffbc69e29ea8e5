"""Host memory: VmRSS parsing, and malloc_trim really returning freed heap pages to the system."""

from __future__ import annotations

import ctypes
import ctypes.util

import pytest

from udpo.training.memory import memory_metrics, resident_gib, status_bytes, trim_heap


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
