"""accelerate's process-wide state, shared by the trainers of one process and cleared after the last.

accelerate keeps what an ``Accelerator`` is created with (the device, the process group, the mixed
precision, gradient accumulation) in class-level state that every later ``Accelerator`` of the process
joins; a later one that asks for another mixed precision is refused ("AcceleratorState has already been
initialized and cannot be changed"). So that any number of trainers (``Trainer``, ``udpo.UDPOTrainer``,
``udpo compare``'s in-process runs), each with its own precision, can follow one another in one process:

- a trainer's precision is its own: it autocasts itself (:meth:`udpo.training.update.Updater.autocast`)
  and leaves accelerate's setting as it finds it (:func:`precision_settings`); only a DeepSpeed launch,
  whose engine takes its precision from accelerate (one run per launched process), sets it;
- the trainers of the process hold the state (:func:`hold`, :func:`release`): when the last one is closed,
  the state they created is cleared, so a later ``Accelerator`` (the user's own, TRL's) starts afresh.
  accelerate's ``PartialState`` (the device and the process group, the same for every run of the process)
  stays.
"""

from __future__ import annotations

from typing import Any

#: the objects (trainers) holding accelerate's state now
_holders: set[int] = set()
#: whether the state the holders share was created by the first of them (not by an earlier Accelerator)
_created = False


def precision_settings(bf16: bool, deepspeed: bool) -> dict[str, Any]:
    """The ``Accelerator`` arguments for a trainer's precision: under DeepSpeed its ``mixed_precision``
    (the engine reads it), elsewhere none (the trainer autocasts itself, see the module docstring)."""
    return {"mixed_precision": "bf16" if bf16 else "no"} if deepspeed else {}


def hold(owner: object) -> None:
    """``owner`` is about to create an ``Accelerator``: count it among the state's holders."""
    global _created
    from accelerate.state import AcceleratorState

    if not _holders:
        _created = not AcceleratorState._shared_state
    _holders.add(id(owner))


def release(owner: object) -> None:
    """``owner`` is done with its ``Accelerator``; after the last holder, clear the state the holders created.
    Releasing twice, or an owner that never held, is fine."""
    from accelerate.state import AcceleratorState, GradientState

    if id(owner) not in _holders:
        return
    _holders.discard(id(owner))
    if not _holders and _created:
        AcceleratorState._reset_state()
        GradientState._reset_state()
