"""Build a model folder without the Hub: SmolLM2-135M's architecture (or Llama-3.2-1B's, ``--shape 1b``, or
Llama-2-7B's, ``--shape 7b``) with random weights and a small word-level tokenizer trained here, with a
ChatML chat template. The GPU check uses it on machines that hold no weights and reach no hub; its speed and
memory are those of a 135M (1B, 7B) Llama (only the vocabulary is smaller).

Word-level, so that the random model's debates have a real model's rows: any sequence of its tokens decodes
to words separated by spaces that encode back to the same tokens, so each round's prompt starts with the
earlier round's prompt and completion and the update scores an agent's rounds in one row. A byte-level
BPE's random tokens do not survive decoding and re-encoding: with one, none of 288 rows packed and the
update scored about 2.6x the positions of a real model's debates (docs/lab/measurements.md). Words outside
the vocabulary (most of a task's prompt) read as ``unk``, an ordinary token, so they round-trip too; only
the special tokens, dropped from a completion's text, break a round's prefix.

    python scripts/check_model.py OUT_DIR [--shape 135m|1b|7b] [--layers N] [--vocab 4096]

The 7B shape's weights take about 13 GB on disk in bf16: :func:`build_in_memory` builds any shape on a
device instead, writing only its config and tokenizer to OUT_DIR (what ``benchmarks/iteration.py`` uses).
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
#: the token of every word outside the vocabulary (a word, not a special token: it decodes and re-encodes as
#: itself), and the chat roles, added to the corpus's words
UNK, ROLES = "unk", ["system", "user", "assistant"]
#: the architectures (LlamaConfig fields), with their number of layers; the 1B and 7B shapes are bf16
SHAPES = {
    "135m": dict(hidden_size=576, intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3),
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_attention_heads=32, num_key_value_heads=8),
    "7b": dict(hidden_size=4096, intermediate_size=11008, num_attention_heads=32, num_key_value_heads=32),
}
LAYERS = {"135m": 30, "1b": 16, "7b": 32}
BF16 = {"1b", "7b"}


def corpus(n: int, seed: int = 0) -> list[str]:
    """Arithmetic questions, step-by-step replies and debate phrases: what the check's debates say."""
    rng = random.Random(seed)
    words = [
        "the",
        "answer",
        "is",
        "so",
        "we",
        "add",
        "multiply",
        "check",
        "each",
        "step",
        "other",
        "agents",
        "said",
        "agree",
        "disagree",
        "final",
    ]
    out = []
    for _ in range(n):
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        out.append(f"What is {a} + {b}? {' '.join(rng.choices(words, k=8))} \\boxed{{{a + b}}}.")
    return out


def build_in_memory(
    folder: str | Path,
    layers: int | None = None,
    vocab: int = 4096,
    seed: int = 0,
    shape: str = "135m",
    device: str = "cpu",
):
    """The model of ``shape`` (random weights, bf16 for the 1B and 7B shapes) built on ``device``, and its
    tokenizer; ``folder`` gets the config and the tokenizer alone (no weights), and names the model
    (``name_or_path``), so that what reads the model's name finds its config and tokenizer there."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast

    folder = Path(folder)
    words = Tokenizer(models.WordLevel(unk_token=UNK))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(vocab_size=vocab, special_tokens=SPECIAL)
    # the roles and UNK as often as the corpus's most frequent words: a small vocab keeps them
    words.train_from_iterator(corpus(5000, seed) + [" ".join([*ROLES, UNK])] * 5000, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=words, bos_token="<|im_start|>", eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        num_hidden_layers=layers or LAYERS[shape],
        **SHAPES[shape],
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    dtype = torch.bfloat16 if shape in BF16 else torch.float32
    torch.manual_seed(seed)
    with torch.device(device):  # the weights made where they are used: a 7B never passes through the host
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    config.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    model.config._name_or_path = model.name_or_path = str(folder)
    return model, tokenizer


def build(
    folder: str | Path, layers: int | None = None, vocab: int = 4096, seed: int = 0, shape: str = "135m"
) -> str:
    """The model folder: :func:`build_in_memory` on the CPU, its weights saved beside the config."""
    model, _ = build_in_memory(folder, layers, vocab, seed, shape)
    model.save_pretrained(str(folder))
    return str(folder)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="135m")
    parser.add_argument(
        "--layers", type=int, default=None, help="default: the shape's (30 for 135m, 16 for 1b, 32 for 7b)"
    )
    parser.add_argument("--vocab", type=int, default=4096)
    args = parser.parse_args()
    print(build(args.out, args.layers, args.vocab, shape=args.shape))
