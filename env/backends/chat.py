"""Chat rendering shared by the backends that tokenize locally (``hf`` and ``vllm``).

Both render a conversation with the model's own chat template through the Hugging Face tokenizer
and hand the engine token ids, so the prompt ids stored in a trajectory are exactly the ones the
model was conditioned on, whichever engine produced them.
"""

from __future__ import annotations

from collections.abc import Sequence


def chat_prompt_ids(
    tokenizer, messages: list[dict[str, str]], template_kwargs: dict | None = None
) -> list[int]:
    """Token ids of ``messages`` under the tokenizer's chat template, generation prompt appended.
    ``template_kwargs``: extra template variables, e.g. ``{"enable_thinking": False}`` for Qwen3."""
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, **(template_kwargs or {})
    )
    return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)


def prompt_ids_of(
    tokenizer,
    messages_or_prompt_ids: Sequence[dict[str, str]] | Sequence[int],
    template_kwargs: dict | None = None,
) -> list[int]:
    """Token ids of a prompt given either as chat messages or already as token ids."""
    items = list(messages_or_prompt_ids)
    if not items:
        raise ValueError("the prompt is empty: pass chat messages or a non-empty list of token ids")
    if all(isinstance(t, int) for t in items):
        return items
    if all(isinstance(m, dict) for m in items):
        return chat_prompt_ids(tokenizer, items, template_kwargs)
    raise TypeError("pass the prompt as a list of chat messages (dicts) or a list of token ids (ints)")
