"""The few collective operations the trainer needs, written once for 1..P processes.

Each process debates a shard of an iteration's questions; trajectories are gathered so every process
sees the whole batch (rewards, baselines and the replay buffer are then identical everywhere); adapter
gradients are summed across processes with one all-reduce per update. The policy owns its modules
(several adapters on one base, one active at a time), so gradients are synchronized explicitly instead
of through a DDP wrapper; the result is the same average DDP would compute.

Two rules keep this safe on every backend:

- Tensors handed to a collective live on :func:`device`: the current GPU under NCCL (which refuses CPU
  tensors), the CPU under gloo.
- Collectives are rank-symmetric: every process makes the same calls in the same order, whatever its
  share of the work. Code whose work per process differs (a shard of uneven size, forward passes planned
  from the shard's lengths) first agrees on the largest count with :func:`max_over_processes` and pads
  with empty work; otherwise gloo aborts ("collective mismatch") and NCCL hangs.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")


def active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def device() -> torch.device:
    """Where the tensors of a collective must live: the current CUDA device under NCCL, else the CPU."""
    if active() and "nccl" in str(dist.get_backend()).lower():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


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
    ).to(device())
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    offset = 0
    for p in params:
        n = p.numel()
        p.grad = flat[offset : offset + n].view_as(p).to(device=p.device, dtype=p.dtype)
        offset += n


def broadcast_parameters(params: Sequence[torch.nn.Parameter], src: int = 0) -> None:
    """Copy rank ``src``'s values of ``params`` to every process (identical starting adapters)."""
    if not active():
        return
    with torch.no_grad():
        for p in params:
            t = p.data.to(device())
            dist.broadcast(t, src)
            p.data.copy_(t)


def any_true(flag: bool) -> bool:
    """True on every process when ``flag`` is true on any."""
    if not active():
        return flag
    return max_over_processes(int(flag)) > 0


def max_over_processes(n: int) -> int:
    """The largest of the processes' ``n`` (``n`` itself when running alone)."""
    if not active():
        return n
    t = torch.tensor([n], dtype=torch.int64, device=device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def mean_over_processes(values: dict[str, float]) -> dict[str, float]:
    """Average each named number over processes (same keys everywhere)."""
    if not active() or not values:
        return dict(values)
    keys = sorted(values)
    t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=device())
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    t /= dist.get_world_size()
    return dict(zip(keys, t.tolist(), strict=True))


def barrier() -> None:
    if active():
        dist.barrier()


def leave() -> None:
    """End this process's part in the process group (the trainer registers it to run at exit). A process
    that exits while the group's threads still run aborts ("terminate called without an active
    exception"), which 3 of 13 ZeRO-3 launches did when only trackers ended the group."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


# --- DeepSpeed ZeRO-3: parameters partitioned across processes ------------------------------------
def partitioned(params: Sequence[torch.nn.Parameter]) -> list[torch.nn.Parameter]:
    """The parameters of ``params`` that ZeRO-3 has partitioned (each process holds a slice)."""
    return [p for p in params if hasattr(p, "ds_id")]


@contextmanager
def gathered(params: Sequence[torch.nn.Parameter], modifier_rank: int | None = None) -> Iterator[None]:
    """Inside the block, ``params`` hold their full values on every process (a collective: all enter it).

    modifier_rank: what that process writes into them is kept (scattered back) on exit; with None, writes
    are lost. Parameters that are not partitioned (one process, DDP, ZeRO-2) are left as they are."""
    parts = partitioned(params)
    if not parts:
        yield
        return
    import deepspeed

    with deepspeed.zero.GatheredParameters(parts, modifier_rank=modifier_rank):
        yield


@contextmanager
def whole_model(engine) -> Iterator[None]:
    """Run a ZeRO-3 engine's module with its full weights and without ZeRO's hooks inside the block.

    Generation needs it: under the hooks every forward pass gathers each layer from all processes, so
    processes whose debates end after different numbers of tokens would make different collective calls.
    Here the weights are gathered once (all processes enter together) and each process then generates
    alone. A no-op for anything but a ZeRO-3 engine."""
    offload = getattr(getattr(engine, "optimizer", None), "parameter_offload", None)
    if offload is None:
        yield
        return
    module = offload.module
    with gathered(list(module.parameters())):
        for p in module.parameters():
            p.ds_active_sub_modules.clear()
        for hook in [*offload.forward_hooks, *offload.backward_hooks]:
            hook.remove()
        offload.forward_hooks, offload.backward_hooks = [], []
        try:
            yield
        finally:
            coordinator = getattr(offload, "param_coordinator", None)
            if coordinator is not None and not coordinator.is_invalid_trace():
                coordinator._invalidate_trace()  # the recorded order of modules no longer holds
            offload._register_deepspeed_module(module)
