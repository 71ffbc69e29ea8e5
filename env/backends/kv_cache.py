"""The eager sampling loop's KV cache: one static buffer, in fp32 where 16-bit attention is slow.

torch's CPU attention kernel (``scaled_dot_product_attention``, its flash kernel) packs 16-bit blocks for
AMX tiles; on a CPU without them it takes a decode step's one query per row over a bf16 cache 4-8x
slower than over an fp32 cache of the same keys (SmolLM2's shape, 24 rows over 300 positions, on Zen 5:
3.9 ms against 0.5 ms a layer, ``benchmarks/attention.py --dtype bf16``), which made a bf16 debate
slower than an fp32 one there although its matmuls are 3x faster. So a model computing in bf16 or fp16
on such a CPU keeps its sampler's keys and values in fp32 (:func:`kv_dtype`): the new keys and values are
cast on their way into the buffer (exactly: fp32 holds every 16-bit value), the query is cast to fp32
for the attention and its output back (:func:`.attention.grouped_sdpa`). The attention then runs in fp32
on the same numbers, which changes the 16-bit kernel's rounding only. The cache takes twice the memory
(``kv_bytes_per_token`` in :mod:`.hf` counts it).

Only the eager loop (:func:`.decoding.sample`, the CPU default) and the dtype probe that chooses for it
use the wide cache; the stacked and graph decoders keep the model's dtype.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from .attention import NAME as GROUPED_SDPA
from .machine import cpu_matrix_units

#: the dtypes whose CPU attention is slow without AMX tiles
_HALF = (torch.bfloat16, torch.float16)


def kv_dtype(model: Any, device: torch.device | str) -> torch.dtype | None:
    """fp32 where ``model`` computes in bf16 or fp16 on a CPU without AMX tiles and attends with
    ``sdpa_gqa`` (the attention that takes a wider cache than its query); None (the model's dtype)
    elsewhere."""
    config = getattr(model, "config", None)
    return (
        torch.float32
        if torch.device(device).type == "cpu"
        and getattr(model, "dtype", None) in _HALF
        and getattr(config, "_attn_implementation", None) == GROUPED_SDPA
        and "amx_bf16" not in cpu_matrix_units()
        else None
    )


def static_cache(config: Any, max_cache_len: int, dtype: torch.dtype | None = None) -> Any:
    """A transformers ``StaticCache`` of ``max_cache_len`` positions for ``config``'s model; with
    ``dtype``, its plain full-attention layers hold their keys and values in ``dtype`` (other layer kinds,
    sliding windows say, keep the model's)."""
    from transformers import StaticCache
    from transformers.cache_utils import StaticLayer

    cache = StaticCache(config=config, max_cache_len=max_cache_len)
    if dtype is not None:
        wide = _wide_layer(dtype)
        for layer in cache.layers:
            if type(layer) is StaticLayer:
                layer.__class__ = wide
    return cache


@functools.cache
def _wide_layer(dtype: torch.dtype) -> type:
    """A ``StaticLayer`` that casts what it stores to ``dtype`` (made on first use, so that importing
    this module does not import transformers)."""
    from transformers.cache_utils import StaticLayer

    class WideLayer(StaticLayer):
        def update(
            self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
        ) -> tuple[torch.Tensor, torch.Tensor]:
            return super().update(key_states.to(dtype), value_states.to(dtype), *args, **kwargs)

    return WideLayer
