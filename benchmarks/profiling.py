"""Where a stretch of training code spends its time: one call under ``torch.profiler``, boiled down.

:func:`profile_call` runs a function once under the profiler (CPU activity, and CUDA's where the function
runs on a GPU; no shapes or stacks recorded) and returns :func:`breakdown` of it, a small dict meant for
a JSON file small enough to keep in a record (a full trace of a 1B update is tens of MB):

- ``wall_s``: the call's wall time under the profiler (the device synchronized before and after);
  ``device_busy_s``: the union of every kernel's, copy's and fill's time on the device; ``idle_share``: the
  rest of the wall time (the device waiting on the host: launches, Python, host <-> device syncs);
- ``launches``: kernel launches (:data:`LAUNCHES`); ``syncs``: the host's waits for the device
  (:data:`SYNCS`), with the seconds spent in them and the operators that caused them
  (``aten::_local_scalar_dense``: ``.item()``/``float()``/``bool()``; ``aten::copy_``: ``.cpu()``,
  ``.tolist()`` or ``torch.tensor(..., device=...)`` of host data);
- ``phases``: per ``record_function`` label that starts with ``prefix`` (:mod:`udpo.training.update`
  labels its steps ``update/...``): how often it ran, its host seconds, the device seconds of the kernels
  launched inside it (from any thread: backward runs on autograd's device thread), the syncs inside it
  and the seconds the host waited in them;
- ``top_ops``: the operators with the most self device time (self CPU time without a device), with
  counts; ``top_kernels``: the kernels with the most device time;
- ``allocator`` (CUDA): the caching allocator's ``cudaMalloc`` / ``cudaFree`` calls and retries during the
  call (a retry frees every cached block and synchronizes).

The two tables use ``key_averages``; the rest reads the profiler's events once.

Run as a script, it prints a breakdown written elsewhere (a GPU check's figures):

    python benchmarks/profiling.py docs/lab/results/<check>/figures/update_profile_1b_n3.json
"""

from __future__ import annotations

import bisect
import gzip
import shutil
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.autograd import DeviceType
from torch.autograd.profiler_util import EventList, FunctionEvent, FunctionEventAvg
from torch.profiler import ProfilerActivity, profile

#: the CUDA runtime and driver calls that launch a kernel (a CUDA graph's replay is one launch)
LAUNCHES = (
    "cudaLaunchKernel",
    "cudaLaunchKernelExC",
    "cuLaunchKernel",
    "cuLaunchKernelEx",
    "cudaGraphLaunch",
)
#: the calls in which the host waits for the device (torch's blocking copies end in cudaStreamSynchronize)
SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")
#: the allocator statistics (torch.cuda.memory_stats) counted over the call
ALLOCATOR = {
    "num_device_alloc": "cuda_mallocs",
    "num_device_free": "cuda_frees",
    "num_alloc_retries": "retries",
}
TOP_OPS, TOP_KERNELS = 25, 10
#: a trace kept beside the breakdown only below this size, gzipped (a record stays small);
#: none written past this many events (about 20 bytes each gzipped, measured on CPU)
TRACE_BYTES, TRACE_EVENTS = 2 * 2**20, 150_000


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def profile_call(
    fn: Callable[[], Any], device: str, prefix: str = "update/", trace: Path | None = None
) -> dict[str, Any]:
    """Run ``fn()`` once under the profiler (on ``device``: "cuda..." adds CUDA activity) and return its
    :func:`breakdown` over the labels starting with ``prefix``. ``trace``: also write the Chrome trace
    there, gzipped (``trace_bytes`` in the result says how large it came out; None: not written, past
    :data:`TRACE_EVENTS`)."""
    cuda = device.startswith("cuda")
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    before = torch.cuda.memory_stats() if cuda else {}
    synchronize(device)
    with profile(activities=activities, record_shapes=False, with_stack=False) as prof:
        start = time.perf_counter()
        fn()
        synchronize(device)
        wall = time.perf_counter() - start
    after = torch.cuda.memory_stats() if cuda else {}
    result = {
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        **breakdown(prof.events(), wall, prefix, cuda),
    }
    if cuda:
        result["allocator"] = {name: after.get(k, 0) - before.get(k, 0) for k, name in ALLOCATOR.items()}
    if trace is not None:  # none past TRACE_EVENTS: a trace that large would not come back anyway
        result["trace_bytes"] = write_trace(prof, trace) if result["events"] <= TRACE_EVENTS else None
    return result


def write_trace(prof, path: Path) -> int:
    """The Chrome trace, gzipped, at ``path``; its size in bytes."""
    raw = path.with_suffix("")  # name.json.gz -> name.json
    prof.export_chrome_trace(str(raw))
    with raw.open("rb") as src, gzip.open(path, "wb") as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()
    return path.stat().st_size


def union_seconds(spans: list[tuple[float, float]]) -> float:
    """The length of the union of ``(start, end)`` spans (microseconds in, seconds out)."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total / 1e6


def annotation(e: FunctionEvent | FunctionEventAvg, prefix: str = "update/") -> bool:
    """Whether ``e`` is a ``record_function`` label (its device-side copy spans idle time too)."""
    name = e.key if isinstance(e, FunctionEventAvg) else e.name
    return bool(getattr(e, "is_user_annotation", False)) or name.startswith(prefix)


def device_work(events: EventList, prefix: str = "update/") -> list[tuple[float, float]]:
    """The (start, end) of every kernel, copy and fill on the device (microseconds), labels left out."""
    return [
        (e.time_range.start, e.time_range.end)
        for e in events
        if e.device_type != DeviceType.CPU and not annotation(e, prefix)
    ]


def breakdown(events: EventList, wall: float, prefix: str, cuda: bool) -> dict[str, Any]:
    """The figures of the module docstring from the ``events`` of a finished profiler (``prof.events()``)
    of a call of ``wall`` seconds; ``cuda``: whether it profiled CUDA activity."""
    labels = sorted(
        (e for e in events if e.device_type == DeviceType.CPU and e.name.startswith(prefix)),
        key=lambda e: e.time_range.start,
    )
    starts = [e.time_range.start for e in labels]

    def phase_of(t: float) -> str:
        """The innermost label whose span holds time ``t`` (labels nest; a later start is inner)."""
        k = bisect.bisect_right(starts, t) - 1
        while k >= 0:
            if labels[k].time_range.end >= t:
                return labels[k].name
            k -= 1
        return "(outside the labels)"

    phases: dict[str, dict[str, float]] = {}

    def phase(name: str) -> dict[str, float]:
        return phases.setdefault(
            name, {"count": 0, "host_s": 0.0, "device_s": 0.0, "syncs": 0, "sync_s": 0.0}
        )

    for e in labels:
        phase(e.name)["count"] += 1
        phase(e.name)["host_s"] += e.time_range.elapsed_us() / 1e6
    launches, syncs, sync_s = 0, 0, 0.0
    causes: Counter[str] = Counter()
    for e in events:
        if e.device_type != DeviceType.CPU:
            continue
        if e.kernels:  # an operator: its kernels' device time goes to the phase it started in
            phase(phase_of(e.time_range.start))["device_s"] += sum(k.duration for k in e.kernels) / 1e6
        elif e.name in LAUNCHES:
            launches += 1
        elif e.name in SYNCS:  # the operator it waited for: .item(), a blocking copy, ...
            waited = e.time_range.elapsed_us() / 1e6
            syncs, sync_s = syncs + 1, sync_s + waited
            causes[e.cpu_parent.name if e.cpu_parent is not None else "(no operator)"] += 1
            phase(phase_of(e.time_range.start))["syncs"] += 1
            phase(phase_of(e.time_range.start))["sync_s"] += waited
    averages = [a for a in events.key_averages() if not annotation(a, prefix)]
    ops = [a for a in averages if a.device_type == DeviceType.CPU]
    ops.sort(key=lambda a: (a.self_device_time_total if cuda else 0, a.self_cpu_time_total), reverse=True)
    kernels = sorted(
        (a for a in averages if a.device_type != DeviceType.CPU),
        key=lambda a: a.self_device_time_total,
        reverse=True,
    )
    spans = device_work(events, prefix)
    busy = union_seconds(spans) if spans else None  # None: no device activity recorded
    return {
        "events": len(events),
        "wall_s": wall,
        "device_busy_s": busy,
        "idle_share": None if busy is None else max(0.0, 1 - busy / wall),
        "launches": launches if cuda else None,
        "syncs": {"count": syncs, "seconds": sync_s, "by_operator": dict(causes.most_common())}
        if cuda
        else None,
        "phases": {name: {k: round(v, 6) for k, v in p.items()} for name, p in phases.items()},
        "top_ops": [
            {
                "name": a.key,
                "count": a.count,
                "self_device_s": a.self_device_time_total / 1e6 if cuda else None,
                "self_cpu_s": a.self_cpu_time_total / 1e6,
            }
            for a in ops[:TOP_OPS]
        ],
        "top_kernels": [
            {"name": a.key[:120], "count": a.count, "device_s": a.self_device_time_total / 1e6}
            for a in kernels[:TOP_KERNELS]
        ],
    }


def table(result: dict[str, Any]) -> str:
    """The breakdown as text: the headline, the phases, then the top operators."""
    head = f"profiled on {result['device']}: wall {result['wall_s']:.3f} s"
    if result["device_busy_s"] is not None:
        head += (
            f", device busy {result['device_busy_s']:.3f} s ({100 * result['idle_share']:.0f}% idle), "
            f"{result['launches']} kernel launches, {result['syncs']['count']} host syncs "
            f"({result['syncs']['seconds']:.3f} s waited: {result['syncs']['by_operator']})"
        )
    lines = [head, f"{'phase':<36} {'count':>5} {'host s':>8} {'device s':>9} {'syncs':>6}"]
    for name, p in sorted(result["phases"].items(), key=lambda kv: -kv[1]["host_s"]):
        lines.append(f"{name:<36} {p['count']:>5} {p['host_s']:>8.3f} {p['device_s']:>9.3f} {p['syncs']:>6}")
    lines.append(f"{'operator':<60} {'count':>7} {'self device s':>14} {'self CPU s':>11}")
    for op in result["top_ops"]:
        device = "-" if op["self_device_s"] is None else f"{op['self_device_s']:.4f}"
        lines.append(f"{op['name'][:60]:<60} {op['count']:>7} {device:>14} {op['self_cpu_s']:>11.4f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import argparse
    import json

    p = argparse.ArgumentParser(
        description="Print a profile breakdown (the JSON profile_call's result was written to)."
    )
    p.add_argument("profile", type=Path, help="the JSON file, e.g. figures/update_profile_1b_n3.json")
    args = p.parse_args(argv)
    result = json.loads(args.profile.read_text())
    if "error" in result and "wall_s" not in result:
        print(f"{args.profile}: the profiled call failed: {result['error']}")
        return 1
    print(table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
