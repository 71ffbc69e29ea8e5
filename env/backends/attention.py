"""Grouped-query attention on CPU without copying the KV cache: the ``sdpa_gqa`` attention.

Models with grouped-query attention (SmolLM2: 9 query heads share 3 key/value heads) keep one key and
value per group. transformers' ``sdpa`` attention hands torch's ``scaled_dot_product_attention`` the
grouped heads (``enable_gqa``) only where no attention mask is given (on CUDA a mask would send it to
the slow math kernel); otherwise it first copies every key and value head once per query head of its
group. On CPU, with the padding mask every batched call carries, that copy is the larger part of a
decode step's attention: it rewrites the whole KV cache, every layer, every new token. torch's CPU
kernel takes the grouped heads with a mask at the same result (measured in ``benchmarks/attention.py``),
so ``sdpa_gqa`` calls it that way on CPU and is ``sdpa`` everywhere else.
"""

from __future__ import annotations

import torch

#: the attention implementation's name (transformers' ``config._attn_implementation``)
NAME = "sdpa_gqa"


def grouped_sdpa(
    module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs
):
    """transformers' attention-function signature: ``query`` (batch, heads, q, dim), ``key``/``value``
    (batch, kv heads, k, dim); returns (batch, q, heads, dim) and no attention weights."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    grouped = key.shape[1] != query.shape[1]
    if (
        not grouped
        or attention_mask is None
        or query.device.type != "cpu"
        or kwargs.get("position_bias") is not None
    ):
        return sdpa_attention_forward(
            module,
            query,
            key,
            value,
            attention_mask,
            dropout=dropout,
            scaling=scaling,
            is_causal=is_causal,
            **kwargs,
        )
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, enable_gqa=True
    )
    return out.transpose(1, 2).contiguous(), None


def use_grouped_sdpa(model) -> None:
    """Switch ``model`` from ``sdpa`` to ``sdpa_gqa`` attention (others, such as ``eager``, stay)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface, sdpa_mask

    if NAME not in ALL_MASK_ATTENTION_FUNCTIONS:
        AttentionInterface.register(NAME, grouped_sdpa)
        AttentionMaskInterface.register(NAME, sdpa_mask)
    if getattr(model.config, "_attn_implementation", None) == "sdpa":
        model.set_attn_implementation(NAME)
