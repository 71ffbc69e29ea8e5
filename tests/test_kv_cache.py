"""The eager sampler's KV cache (udpo/env/backends/kv_cache.py): fp32 for a 16-bit model on a CPU without
AMX tiles, and then exactly what fp32 attention over the 16-bit keys and values computes."""

from __future__ import annotations

import pytest
import torch

from udpo.env.backends import decoding, hf, kv_cache
from udpo.env.backends.attention import NAME, grouped_sdpa, use_grouped_sdpa

UNITS = {"zen": ["avx512_bf16"], "intel": ["amx_bf16", "avx512_bf16"], "avx2": ["avx2"]}


@pytest.fixture
def bf16_model(tiny_model):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.bfloat16).eval()
    use_grouped_sdpa(model)
    return model


@pytest.mark.parametrize("cpu", list(UNITS))
def test_only_a_16_bit_model_with_grouped_attention_on_a_cpu_without_amx_gets_an_fp32_cache(
    bf16_model, monkeypatch, cpu
):
    monkeypatch.setattr(kv_cache, "cpu_matrix_units", lambda: UNITS[cpu])
    wide = None if cpu == "intel" else torch.float32
    assert kv_cache.kv_dtype(bf16_model, "cpu") is wide
    assert kv_cache.kv_dtype(bf16_model, "cuda:0") is None
    # the KV a position takes, as the backend plans its calls: twice the 16-bit cache's where widened
    per_token = 2 * bf16_model.config.num_hidden_layers * bf16_model.config.num_key_value_heads
    per_token *= bf16_model.config.hidden_size // bf16_model.config.num_attention_heads
    assert hf.kv_bytes_per_token(bf16_model) == per_token * (4 if wide else 2)
    bf16_model.set_attn_implementation("sdpa")  # transformers' attention takes no wider cache
    assert kv_cache.kv_dtype(bf16_model, "cpu") is None
    assert kv_cache.kv_dtype(bf16_model.float(), "cpu") is None


def test_a_wide_cache_stores_fp32_and_leaves_the_model_dtype_otherwise(bf16_model):
    keys = torch.randn(2, bf16_model.config.num_key_value_heads, 3, 16).bfloat16()
    for dtype, stored in ((torch.float32, torch.float32), (None, torch.bfloat16)):
        cache = kv_cache.static_cache(bf16_model.config, 5, dtype)
        k, v = cache.update(keys, -keys, 0)
        assert k.dtype == v.dtype == stored and k.shape[2] == 5
        assert torch.equal(k[:, :, :3], keys.to(stored)) and torch.equal(v[:, :, :3], -keys.to(stored))


def _upcast_sdpa(module, query, key, value, *args, **kwargs):
    """The reference: fp32 attention over the 16-bit cache's keys and values, output back in 16 bits."""
    out, weights = grouped_sdpa(module, query.float(), key.float(), value.float(), *args, **kwargs)
    return out.to(query.dtype), weights


def test_sampling_over_the_wide_cache_is_fp32_attention_over_the_16_bit_keys_bit_for_bit(
    bf16_model, monkeypatch
):
    """Left-padded rows, a prompt pass and 12 drawn tokens at temperature 1: the fp32 cache samples the
    tokens and log-probs of a bf16 cache whose attention casts its inputs to fp32 (the same numbers, the
    same fp32 kernel); both differ from bf16 attention, by its rounding."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    torch.manual_seed(0)
    ids = torch.randint(0, bf16_model.config.vocab_size, (4, 9))
    mask = torch.ones(4, 9, dtype=torch.long)
    mask[1::2, :4] = 0

    def draw(cache_dtype):
        monkeypatch.setattr(decoding, "kv_dtype", lambda model, device: cache_dtype)
        torch.manual_seed(1)
        rows = decoding.sample(
            bf16_model, ids, mask, max_new_tokens=12, temperature=1.0, top_p=1.0, stops=set()
        )
        return [r.tokens for r in rows], [r.logprobs for r in rows]

    wide = draw(torch.float32)
    AttentionInterface.register("sdpa_upcast", _upcast_sdpa)
    AttentionMaskInterface.register("sdpa_upcast", sdpa_mask)
    bf16_model.set_attn_implementation("sdpa_upcast")
    reference = draw(None)
    bf16_model.set_attn_implementation(NAME)
    half = draw(None)
    assert wide == reference
    assert len({len(t) for t in wide[0]}) == 1 and len(wide[0][0]) == 12
    assert wide[1] != half[1]  # bf16 attention rounds otherwise: the comparison above can fail
