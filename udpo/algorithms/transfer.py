"""Small tensors between the host and the device without needless synchronization.

On a GPU every blocking copy makes the host wait until the device has finished all the work queued before
it: a ``torch.tensor(values, device="cuda")`` from a Python list, an ``.item()``, a ``float(tensor)``. In
the update such copies sit between passes (index tensors, importance weights, metrics), so each one
empties the queue and the device idles while the host builds the next pass. Here:

- :func:`to_device`: a host tensor sent from pinned memory without blocking (the caching host allocator
  keeps the memory until the copy is done); :func:`lists_to_device`: several lists of numbers sent that
  way in one copy;
- :func:`host_floats`: several scalar statistics copied back in one transfer, one wait instead of one a value.

On a CPU both are plain tensor operations.
"""

from __future__ import annotations

import torch
from torch import Tensor


def to_device(t: Tensor, device: str | torch.device) -> Tensor:
    """``t`` on ``device``; from the host to a GPU copied from pinned memory without blocking the host."""
    if torch.device(device).type != "cuda" or t.device.type != "cpu":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def lists_to_device(
    lists: list[list[int]] | list[list[float]], device: str | torch.device, dtype: torch.dtype
) -> list[Tensor]:
    """``lists`` as tensors of ``dtype`` on ``device``, one a list, sent together in one copy
    (:func:`to_device`)."""
    flat = to_device(torch.tensor([v for values in lists for v in values], dtype=dtype), device)
    return list(flat.split([len(values) for values in lists]))


def host_floats(stats: dict[str, Tensor]) -> dict[str, float]:
    """Scalar tensors (on one device; CPU scalars join it) as plain floats, copied to the host together."""
    device = next(iter(stats.values())).device
    values = torch.stack([v.detach().float().reshape(()).to(device) for v in stats.values()])
    return dict(zip(stats, values.tolist(), strict=True))
