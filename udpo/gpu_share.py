"""Several runs on one GPU: each process's share of the card's memory (``UDPO_GPU_MEMORY_SHARE``).

``udpo study PLAN --workers K`` starts K processes that all train on the same device. Without a share,
each would size its update from the card's free memory as if it were alone (:mod:`udpo.training.autosize`)
and the first to reach its peak would take what the others planned on. With a share ``s`` in (0, 1]:

- the launcher gives every worker ``s`` (``--gpu-memory-share``, else ``UDPO_GPU_MEMORY_SHARE`` of its own
  environment, else ``1 / K``) in the worker's environment (:func:`worker_share`, :func:`environment`);
- the trainer, starting on a CUDA device, caps its caching allocator at ``s`` of the card
  (``torch.cuda.set_per_process_memory_fraction``, :func:`apply`);
- the update is sized from ``min(free, s x total - held)`` (:func:`usable_bytes`; ``held``: what this
  process's allocator already reserved: the model, the adapters), so K workers never each plan for the
  whole card;
- a colocated vLLM engine takes its share of ``s``, not of the card (``udpo.training.rollouts``).

On a CPU the share is read and checked (a bad value is an error everywhere) but changes nothing. Only the
standard library is imported here: the command line checks the value before torch loads.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

ENV = "UDPO_GPU_MEMORY_SHARE"


def check_share(share: float | str, source: str = ENV) -> float:
    """``share`` as a float in (0, 1], or a ValueError naming ``source`` (the variable or the flag)."""
    try:
        value = float(share)
    except (TypeError, ValueError):
        raise ValueError(f"{source} must be a number in (0, 1], got {share!r}") from None
    if not (math.isfinite(value) and 0 < value <= 1):
        raise ValueError(f"{source} must be in (0, 1] (a fraction of the GPU's memory), got {share!r}")
    return value


def from_environment(environ: Mapping[str, str] | None = None) -> float | None:
    """The share ``UDPO_GPU_MEMORY_SHARE`` sets (checked), or None where it is unset or empty."""
    env = os.environ if environ is None else environ
    text = env.get(ENV, "").strip()
    return check_share(text) if text else None


def worker_share(
    workers: int, share: float | None = None, environ: Mapping[str, str] | None = None
) -> float | None:
    """The share each of ``workers`` processes on one GPU gets: ``share`` (the flag) if given, else
    ``UDPO_GPU_MEMORY_SHARE`` of ``environ`` (default: this process's), else ``1 / workers``; None (the whole
    card) for one worker without either."""
    if workers < 1:
        raise ValueError(f"--workers must be >= 1, got {workers}")
    if share is not None:
        return check_share(share, "--gpu-memory-share")
    given = from_environment(environ)
    if given is not None:
        return given
    return 1 / workers if workers > 1 else None


def environment(share: float | None) -> dict[str, str]:
    """The environment entries that hand ``share`` to a worker (none for None)."""
    return {} if share is None else {ENV: repr(check_share(share))}


def usable_bytes(free: int, total: int, held: int, share: float | None) -> int:
    """The device memory this process may still fill: ``free`` without a share, else the least of ``free``
    and what is left of its share of ``total`` once the ``held`` bytes it already reserved are counted."""
    if share is None:
        return free
    return max(0, min(free, int(check_share(share) * total) - held))


def indexed(device: str) -> str:
    """``device`` with its index: a bare ``cuda`` (what accelerate names the device of a single process)
    becomes ``cuda:<current device>``, since torch's per-device calls (the allocator's cap among them)
    refuse a CUDA device without an index; any other device is returned as it is."""
    if device != "cuda":
        return device
    import torch

    return f"cuda:{torch.cuda.current_device()}"


def apply(device: str, environ: Mapping[str, str] | None = None) -> float | None:
    """Read the share (checked on every device) and, on a CUDA ``device`` (``cuda`` or ``cuda:N``), cap
    this process's allocator at it (``torch.cuda.set_per_process_memory_fraction`` on
    :func:`indexed` ``(device)``); returns the share, None where none is set."""
    share = from_environment(environ)
    if share is not None and device.startswith("cuda"):
        import torch

        torch.cuda.set_per_process_memory_fraction(share, torch.device(indexed(device)))
    return share


def describe(share: float | None, device: str) -> str | None:
    """The startup line naming the share, or None where there is nothing to say (no share, or a CPU)."""
    if share is None or not device.startswith("cuda"):
        return None
    return (
        f"GPU memory share: {share:.3g} of {device} ({ENV}; torch.cuda.set_per_process_memory_fraction, "
        f"the update sized within it)"
    )
