"""What this machine runs: the dtype ``dtype: auto`` resolves to (per CPU kind, on GPU and for the work,
or what ``UDPO_DTYPE`` forces), the probe of the CPU's matrix units behind it, and the ``hf`` backend's
decode path with the KV buffers it keeps between calls.

``dtype: auto``, by the work (:data:`WORKS`): training (the trainer's policy, whose hf rollouts run on its
own weights) is bf16 on a GPU and on CPUs with bf16 matrix units, fp32 elsewhere. Generation alone
(``udpo debate``, ``eval``, ``detect``, ``uncertainty``, :class:`udpo.Team`) is the same on a GPU and
on CPUs without bf16 units (fp32, no probe: bf16 is emulated there); on a CPU with bf16 units it is the
faster of bf16 and fp32 for one decode step of the model's shape, measured once and cached
(:mod:`.dtype_probe`). ``UDPO_DTYPE`` and an explicit dtype override all of it.

The training core, the study and the benchmarks read these here, without importing the backend
(:class:`.hf.HFBackend` applies them).
"""

from __future__ import annotations

import contextlib
import os
import platform
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

#: dtype names accepted everywhere a dtype is set (besides "auto")
DTYPES = {
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
    "fp32": torch.float32,
    "float32": torch.float32,
}

#: decode paths of the hf backend (see :func:`pick_decode`)
DECODE_MODES = ("auto", "eager", "stacked", "graph")

#: KV cache one sampling loop may fill, GiB (:class:`.hf.HFBackend`'s ``kv_cache_gib`` default)
KV_CACHE_GIB = 2.0
#: the stacked decode paths keep up to this many calls' KV cache (``kv_cache_gib`` each) across calls
KEPT_KV_CALLS = 2

#: environment variable that forces what ``dtype: auto`` resolves to for a whole run (see :func:`forced_dtype`)
DTYPE_ENV = "UDPO_DTYPE"
#: the values it takes
FORCED_DTYPES = ("fp32", "bf16")

#: the work a dtype is chosen for (:func:`choose_dtype`): training, or generation alone
WORKS = ("train", "generate")
#: how the header line names each work
_WORK_WORDS = {"train": "training", "generate": "generation"}

#: torch's probes of the CPU's bf16 matrix units, by the name the test header prints
_BF16_UNITS = {"amx_bf16": "_is_amx_tile_supported", "avx512_bf16": "_is_avx512_bf16_supported"}


def cpu_matrix_units() -> list[str]:
    """The CPU's bf16 matrix units (``amx_bf16``, ``avx512_bf16``) or, where it has none, the vector units
    torch's fp32 kernels use (``avx512``, ``avx2``, ``default``; bf16 is emulated there)."""
    units = [name for name, probe in _BF16_UNITS.items() if getattr(torch.cpu, probe, lambda: False)()]
    return units or [torch.backends.cpu.get_cpu_capability().lower()]


def cpu_has_bf16() -> bool:
    """Whether this CPU multiplies bf16 matrices in hardware (AMX tiles or AVX512-BF16): there bf16 runs
    several times faster than fp32; elsewhere torch emulates it, slower than fp32."""
    return any(unit in _BF16_UNITS for unit in cpu_matrix_units())


def forced_dtype() -> str | None:
    """What ``UDPO_DTYPE`` forces ``dtype: auto`` to (``fp32`` or ``bf16``), or None when it is unset: one
    switch that runs a whole run (or the test suite) on the numeric path another machine would take."""
    value = os.environ.get(DTYPE_ENV, "").strip().lower()
    if not value:
        return None
    if value not in FORCED_DTYPES:
        raise ValueError(f"{DTYPE_ENV}={value!r}: use {' or '.join(FORCED_DTYPES)} (or leave it unset)")
    return value


@dataclass(frozen=True)
class DtypeChoice:
    """A dtype chosen for some work, and why: what the run's header line says (:meth:`describe`)."""

    dtype: torch.dtype
    asked: str  # "auto" or the dtype name given
    work: str  # one of WORKS
    why: str

    @property
    def name(self) -> str:
        return dtype_name(self.dtype)

    def describe(self) -> str:
        """e.g. ``dtype auto = fp32 for generation (probe: bf16 1.31x slower on this CPU; cached in ...)``."""
        if self.asked != "auto":
            return f"dtype {self.name} ({self.why})"
        return f"dtype auto = {self.name} for {_WORK_WORDS[self.work]} ({self.why})"


def dtype_name(dtype: torch.dtype) -> str:
    """The short name of a dtype of :data:`DTYPES` (``bf16``, ``fp16``, ``fp32``)."""
    return {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}[dtype]


def choose_dtype(
    name: str,
    device: str,
    work: str = "train",
    config: Any = None,
    *,
    measure: Callable[[Any], dict[str, float]] | None = None,
) -> DtypeChoice:
    """The dtype for ``work`` (one of :data:`WORKS`) on ``device``, and why. A dtype named is that dtype;
    "auto" is what ``UDPO_DTYPE`` forces (:func:`forced_dtype`), else bf16 on GPU; fp32 on CPUs without
    bf16 matrix units (:func:`cpu_has_bf16`); on CPUs with them bf16 for training and, for generation,
    the faster of bf16 and fp32 in a decode step of ``config``'s model (:func:`.dtype_probe.probed_dtype`,
    cached; ``measure`` replaces its timing, for tests). Without a ``config`` generation takes training's
    rule."""
    if work not in WORKS:
        raise ValueError(f"unknown work {work!r}; use {' or '.join(WORKS)}")
    if name != "auto":
        if name not in DTYPES:
            raise ValueError(f"unknown dtype {name!r}; use auto, bf16, fp16 or fp32")
        return DtypeChoice(DTYPES[name], name, work, "asked for")
    forced = forced_dtype()
    if forced is not None:
        return DtypeChoice(DTYPES[forced], name, work, f"forced by {DTYPE_ENV}={forced}")
    if device.startswith("cuda"):
        return DtypeChoice(torch.bfloat16, name, work, "GPU")
    units = ", ".join(cpu_matrix_units())
    if not cpu_has_bf16():
        return DtypeChoice(torch.float32, name, work, f"no bf16 matrix units ({units}): bf16 is emulated")
    if work == "train" or config is None:
        return DtypeChoice(torch.bfloat16, name, work, f"bf16 matrix units: {units}")
    from .dtype_probe import probed_dtype

    dtype, why = probed_dtype(config, cpu_model(), measure)
    return DtypeChoice(dtype, name, work, why)


def pick_dtype(name: str, device: str, work: str = "train", config: Any = None) -> torch.dtype:
    """The dtype :func:`choose_dtype` picks: for training, "auto" is what ``UDPO_DTYPE`` forces, else bf16
    on GPU and on CPUs with bf16 matrix units, else fp32."""
    return choose_dtype(name, device, work, config).dtype


def cpu_model() -> str:
    """This CPU's model name (``/proc/cpuinfo``), else what :mod:`platform` knows."""
    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as info:
        model = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), model)
    return model


def describe_numeric_path() -> str:
    """One line: this CPU's model, its matrix units and what ``dtype: auto`` picks on it for training (and
    whether ``UDPO_DTYPE`` forced that), e.g. ``cpu: Intel(R) Xeon(R) ... (amx_bf16, avx512_bf16); dtype
    auto = bf16 (generation: probed per model)``; the probe is not run here."""
    model = cpu_model()
    picked = dtype_name(pick_dtype("auto", "cpu"))
    forced = forced_dtype()
    if forced is not None:
        why = f" (forced by {DTYPE_ENV}={forced})"
    else:
        why = " (generation: probed per model)" if cpu_has_bf16() else ""
    return f"cpu: {model} ({', '.join(cpu_matrix_units())}); dtype auto = {picked}{why}"


def pick_decode(name: str, device: str) -> str:
    """The decode path: "eager" (:func:`.decoding.sample`, rows leave the batch as they finish),
    "stacked" (:class:`.static_decode.StaticDecoder`: fixed buffers, adapters stacked, no host read per
    token) or "graph" (stacked, the step replayed as a CUDA graph). "auto": graph on CUDA, eager
    elsewhere (on CPU the eager loop is the faster: it drops finished rows and launches cost little)."""
    if name not in DECODE_MODES:
        raise ValueError(f"unknown decode {name!r}; use {', '.join(DECODE_MODES)}")
    cuda = device.startswith("cuda")
    if name == "auto":
        return "graph" if cuda else "eager"
    if name == "graph" and not cuda:
        raise ValueError(f"decode: graph needs a CUDA device, got {device!r}")
    return name


def kept_kv_bytes(decode: str, device: str, kv_cache_gib: float = KV_CACHE_GIB) -> int:
    """Bytes of KV buffers an :class:`.hf.HFBackend` with ``decode`` on ``device`` keeps between its calls
    (through a training update too): ``KEPT_KV_CALLS x kv_cache_gib`` on the stacked paths (:func:`pick_decode`),
    none on the eager loop."""
    return 0 if pick_decode(decode, device) == "eager" else int(KEPT_KV_CALLS * kv_cache_gib * 2**30)
