"""A tiny random Llama (2 layers, hidden 32) with the real SmolLM2 tokenizer, saved as a model folder.

Fast stand-in for the real model in policy, export and trainer tests that check mechanics (shapes,
gradients, files); tests that check numbers against the real model use the ``model_path`` fixture.
"""

from __future__ import annotations

from pathlib import Path


def build_tiny_llama(
    folder: str | Path, tokenizer_from: str, seed: int = 0, initializer_range: float = 0.02
) -> str:
    """initializer_range: the weights' std; at 0.3 greedy decoding says different things to different prompts."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_from)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        initializer_range=initializer_range,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    return str(folder)


def perturb_adapters(policy, std: float = 0.05, seed: int = 0) -> None:
    """Give every adapter random non-zero weights (LoRA starts as the identity: B = 0)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in policy.trainable_parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * std)
