"""A tiny random Llama (2 layers, hidden 32) with the real SmolLM2 tokenizer, saved as a model folder.

Fast stand-in for the real model in policy, export and trainer tests that check mechanics (shapes,
gradients, files); tests that check numbers against the real model use the ``model_path`` fixture.

A random model writes random tokens: on a numeric task no answer parses, and under the silence rule an
all-silent team earns the same reward in every debate, so nothing is learned. ``favour`` biases its
output towards chosen tokens and ``stop_after_favoured`` ends its turn after one: with :data:`DIGITS`
and :data:`DIGITS_STOP` it answers one digit, mostly (measured on 30 one-digit additions, N=2, T=1: 11
teams agreed on their final answer, 2 votes were right, 10 of 120 answers did not parse). With
``favour={"<|im_end|>": 6}`` its replies end at random, about 30 of 48 tokens on average
(tests/test_learning.py teaches it to be brief).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

#: what a tiny model that answers numbers favours (token text -> logit bias) ...
DIGITS: dict[str, float] = {str(d): 9.0 for d in range(10)}
#: ... and how much more likely it ends its turn right after one: most replies are one digit, so agents
#: agree now and then and the vote is sometimes right (one-digit additions)
DIGITS_STOP = 15.0


def build_tiny_llama(
    folder: str | Path,
    tokenizer_from: str,
    seed: int = 0,
    initializer_range: float = 0.02,
    favour: Mapping[str, float] | None = None,
    stop_after_favoured: float = 0.0,
) -> str:
    """initializer_range: the weights' std; at 0.3 greedy decoding says different things to different prompts.

    favour: token text (each one token, special tokens included) -> roughly what it adds to that token's
    logit; stop_after_favoured: roughly what it adds to the end-of-turn token's logit right after a
    favoured token (see :func:`add_token_bias`). With either, the output layer is untied from the
    embedding."""
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
        tie_word_embeddings=not (favour or stop_after_favoured),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        initializer_range=initializer_range,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if favour or stop_after_favoured:
        add_token_bias(model, tokenizer, favour or {}, stop_after_favoured)
    model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    return str(folder)


def add_token_bias(model, tokenizer, favour: Mapping[str, float], stop_after_favoured: float = 0.0) -> None:
    """Add about ``favour[text]`` to the logit of each named token at every position, and about
    ``stop_after_favoured`` to the end-of-turn token's logit at the positions of favoured tokens (Llama has
    no output bias, so one is built in). Two hidden channels carry it: in channel 0 every embedding holds
    1, in channel 1 the favoured tokens' embeddings hold 1 and the others 0; no layer writes to either
    (LoRA on ``o_proj`` may learn to), so after the final norm they read "always" and "this token is
    favoured". Only the favoured tokens' output rows read channel 0 and only the end of turn's reads
    channel 1, scaled so that the mean bias over a few random prompts is the one asked for."""
    import torch

    ids = {}
    for text, bias in favour.items():
        encoded = tokenizer.encode(text, add_special_tokens=False)
        if len(encoded) != 1:
            raise ValueError(f"favour: {text!r} is {len(encoded)} tokens, not one")
        ids[encoded[0]] = bias
    inner = model.model
    with torch.no_grad():
        embed = inner.embed_tokens.weight
        embed[:, :2] = 0.0
        embed[:, 0] = 1.0
        embed[list(ids), 1] = 1.0
        for layer in inner.layers:
            layer.self_attn.o_proj.weight[:2, :] = 0.0
            layer.mlp.down_proj.weight[:2, :] = 0.0
        head = model.lm_head.weight
        head[:, :2] = 0.0
        generator = torch.Generator().manual_seed(0)
        prompts = torch.randint(0, head.shape[0], (4, 32), generator=generator)
        if ids:
            picks = torch.tensor(list(ids))[torch.randint(0, len(ids), (4, 32), generator=generator)]
            prompts = torch.where(torch.rand(4, 32, generator=generator) < 0.5, prompts, picks)
        final = model(input_ids=prompts, output_hidden_states=True).hidden_states[-1]  # after the norm
        for token, bias in ids.items():
            head[token, 0] = bias / final[..., 0].mean().item()
        if stop_after_favoured and ids:
            marked = final[..., 1][torch.isin(prompts, torch.tensor(list(ids)))]
            head[tokenizer.eos_token_id, 1] = stop_after_favoured / marked.mean().item()


def tiny_team_with_distinct_adapters(folder: Path, tokenizer_path: str, dtype: str = "fp32"):
    """A 3-agent ``MultiAgentPolicy`` in ``dtype`` on a tiny Llama (weights std 0.3) whose rank-4 adapters
    (fp32, as PEFT keeps them) are random and non-zero (std 0.3), so every agent's rows give other logits
    than the base model's."""
    from udpo.training.policy import LoraSettings, MultiAgentPolicy

    tiny = build_tiny_llama(folder, tokenizer_path, initializer_range=0.3)
    policy = MultiAgentPolicy(tiny, n_agents=3, lora=LoraSettings(r=4, alpha=8), dtype=dtype)
    perturb_adapters(policy, std=0.3)
    return policy


def perturb_adapters(policy, std: float = 0.05, seed: int = 0) -> None:
    """Give every adapter random non-zero weights (LoRA starts as the identity: B = 0)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in policy.trainable_parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * std)
