"""What this machine runs: the dtype ``dtype: auto`` resolves to (per CPU kind and on GPU, or what
``UDPO_DTYPE`` forces), the probe of the CPU's matrix units behind it, and the ``hf`` backend's decode
path with the KV buffers it keeps between calls.

The training core, the study and the benchmarks read these here, without importing the backend
(:class:`.hf.HFBackend` applies them).
"""

from __future__ import annotations

import contextlib
import os
import platform

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


def pick_dtype(name: str, device: str) -> torch.dtype:
    """ "auto" is what ``UDPO_DTYPE`` forces (:func:`forced_dtype`), else bf16 on GPU and on CPUs with bf16
    matrix units (:func:`cpu_has_bf16`), else fp32."""
    if name == "auto":
        forced = forced_dtype()
        if forced is not None:
            return DTYPES[forced]
        return torch.bfloat16 if device.startswith("cuda") or cpu_has_bf16() else torch.float32
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; use auto, bf16, fp16 or fp32") from None


def cpu_model() -> str:
    """This CPU's model name (``/proc/cpuinfo``), else what :mod:`platform` knows."""
    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as info:
        model = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), model)
    return model


def describe_numeric_path() -> str:
    """One line: this CPU's model, its matrix units and what ``dtype: auto`` picks on it (and whether
    ``UDPO_DTYPE`` forced that), e.g. ``cpu: Intel(R) Xeon(R) ... (amx_bf16, avx512_bf16); dtype auto = bf16``."""
    model = cpu_model()
    picked = {torch.bfloat16: "bf16", torch.float32: "fp32"}[pick_dtype("auto", "cpu")]
    forced = forced_dtype()
    why = f" (forced by {DTYPE_ENV}={forced})" if forced is not None else ""
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
