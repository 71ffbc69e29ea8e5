"""The few collective operations the trainer needs, written once for 1..P processes.

Each process debates a shard of an iteration's questions; trajectories are gathered so every process
sees the whole batch (rewards, baselines and the replay buffer are then identical everywhere); adapter
gradients are summed across processes with one all-reduce per update. The policy owns its modules
(several adapters on one base, one active at a time), so gradients are synchronized explicitly instead
of through a DDP wrapper; the result is the same average DDP would compute.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")


def active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def shard(n: int, rank: int, world: int) -> list[int]:
    """Indices of ``range(n)`` that process ``rank`` of ``world`` handles (round-robin)."""
    return list(range(rank, n, world))


def gather_in_order(local: Sequence[T], indices: Sequence[int], total: int) -> list[T]:
    """Every process's ``local`` items, placed at their global ``indices``: the full list of ``total``."""
    pairs = list(zip(indices, local, strict=True))
    if active():
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, pairs)
        pairs = [p for part in gathered for p in part]
    out: list[Any] = [None] * total
    for idx, item in pairs:
        out[idx] = item
    missing = [k for k, item in enumerate(out) if item is None]
    if missing:
        raise RuntimeError(f"items {missing[:5]} of {total} were produced by no process")
    return out


def gather_objects(obj: T) -> list[T]:
    """``obj`` of every process, in rank order (a one-element list when running alone)."""
    if not active():
        return [obj]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, obj)
    return gathered


def sum_gradients(params: Sequence[torch.nn.Parameter]) -> None:
    """Sum ``.grad`` over processes in place (missing grads count as zeros) with one flat all-reduce."""
    if not active():
        return
    flat = torch.cat(
        [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).float() for p in params]
    )
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    offset = 0
    for p in params:
        n = p.numel()
        p.grad = flat[offset : offset + n].view_as(p).to(p.dtype)
        offset += n


def broadcast_parameters(params: Sequence[torch.nn.Parameter], src: int = 0) -> None:
    """Copy rank ``src``'s values of ``params`` to every process (identical starting adapters)."""
    if not active():
        return
    with torch.no_grad():
        for p in params:
            dist.broadcast(p.data, src)


def any_true(flag: bool) -> bool:
    """True on every process when ``flag`` is true on any."""
    if not active():
        return flag
    t = torch.tensor([1.0 if flag else 0.0])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item() > 0)


def mean_over_processes(values: dict[str, float]) -> dict[str, float]:
    """Average each named number over processes (same keys everywhere)."""
    if not active() or not values:
        return dict(values)
    keys = sorted(values)
    t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    t /= dist.get_world_size()
    return dict(zip(keys, t.tolist(), strict=True))


def barrier() -> None:
    if active():
        dist.barrier()
