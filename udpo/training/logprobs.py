"""Per-token log-probs of stored completions, packed into few forward passes.

An agent's consecutive rounds share one row when the earlier round's prompt + completion is a prefix of the
later prompt; rows are grouped into passes within a token budget and a padding bound (:func:`plan_passes`),
and :func:`forward_logprobs` returns each completion's log-probs of logits / temperature.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from udpo.algorithms.transfer import lists_to_device

TOKEN_BUDGET = 4096  # default positions (rows x longest row) of one log-prob forward pass
MAX_PADDING = 0.1  # a row joins a log-prob forward pass only if the pass stays at most this much padding


@dataclass
class ForwardStats:
    """Log-prob forward passes so far: passes, positions computed (rows x longest row) and real tokens,
    rows and the completions scored in them (as many rows as completions: no round shared a row);
    empty_passes: the one-token passes run to match a busier process (``symmetric_passes``)."""

    passes: int = 0
    positions: int = 0
    tokens: int = 0
    rows: int = 0
    completions: int = 0
    empty_passes: int = 0

    def add(self, positions: int, tokens: int, rows: int, completions: int) -> None:
        self.passes += 1
        self.positions += positions
        self.tokens += tokens
        self.rows += rows
        self.completions += completions

    def reset(self) -> None:
        self.passes = self.positions = self.tokens = self.rows = self.completions = self.empty_passes = 0

    @property
    def padding(self) -> float:
        """Share of the computed positions that were padding."""
        return 1 - self.tokens / self.positions if self.positions else 0.0


@dataclass
class PackedSequence:
    """Token ids of one forward-pass row and the completions scored in it.

    spans: (input index, position of the completion's first token in ``ids``, completion length)."""

    ids: list[int]
    spans: list[tuple[int, int, int]]


def plan_passes(
    prompt_ids: Sequence[Sequence[int]],
    completion_ids: Sequence[Sequence[int]],
    batch_size: int,
    token_budget: int,
) -> tuple[list[PackedSequence], list[list[int]]]:
    """Lay (prompt, completion) pairs out as forward-pass rows, and the rows out as passes.

    Shared prefixes: when input k's prompt + completion is a token-exact prefix of input k+1's prompt (an
    agent's round t and round t+1 in a debate: its chat history only grows), both are scored in one row,
    the longer sequence; a causal model gives every position the same log-probs either way. Where the chat
    template re-tokenizes the history differently, the prefix test fails and the inputs get rows of their own.
    Padding: rows are sorted by length and cut into passes of at most ``batch_size`` rows,
    ``token_budget`` positions (rows x longest row; a longer row runs alone) and ``MAX_PADDING`` padding.
    Returns the rows and the passes (lists of row indices, each sorted by length).
    """
    sequences: list[PackedSequence] = []
    for k, (prompt, completion) in enumerate(zip(prompt_ids, completion_ids, strict=True)):
        if not completion:
            continue
        if not prompt:
            raise ValueError(f"sequence {k} has an empty prompt: its first completion token cannot be scored")
        prompt, completion = list(prompt), list(completion)
        last = sequences[-1] if sequences else None
        if last is not None and len(prompt) >= len(last.ids) and prompt[: len(last.ids)] == last.ids:
            last.ids = prompt + completion
            last.spans.append((k, len(prompt), len(completion)))
        else:
            sequences.append(PackedSequence(prompt + completion, [(k, len(prompt), len(completion))]))
    passes: list[list[int]] = []
    real = 0  # real tokens in the current pass
    for j in sorted(range(len(sequences)), key=lambda j: len(sequences[j].ids)):
        rows, width = passes[-1] if passes else [], len(sequences[j].ids)  # the new row is the widest
        positions = (len(rows) + 1) * width
        if (
            not rows
            or len(rows) >= batch_size
            or positions > token_budget
            or real + width < (1 - MAX_PADDING) * positions
        ):
            passes.append(rows := [])
            real = 0
        rows.append(j)
        real += width
    return sequences, passes


def forward_logprobs(
    model, rows: list[PackedSequence], pad: int, device: str, temperature: float = 1.0
) -> list[Tensor]:
    """log_softmax(logits / temperature) of every span's completion tokens, spans in row order.

    Rows are right-padded (pads come after every real token, so the causal mask alone keeps them out
    of the real positions, and position ids are plain 0..L-1 as in generation). Only the positions whose
    logits predict a completion token reach the output layer (``logits_to_keep`` as indices), which bounds
    the rows x positions x vocabulary logits tensor by the completions, not the long multi-round prompts.
    """
    width = max(len(r.ids) for r in rows)
    # the logit at position q predicts the token at q + 1
    wanted = [[q for _, start, n in r.spans for q in range(start - 1, start + n - 1)] for r in rows]
    keep = sorted({q for w in wanted for q in w})
    column = {q: c for c, q in enumerate(keep)}
    # built on the host, sent in one copy that does not block it: a pass never waits for those queued
    ids, keep_at, row_index, col_index, targets = lists_to_device(
        [
            [tok for r in rows for tok in r.ids + [pad] * (width - len(r.ids))],
            keep,
            [b for b, w in enumerate(wanted) for _ in w],
            [column[q] for w in wanted for q in w],
            [r.ids[q + 1] for r, w in zip(rows, wanted, strict=True) for q in w],
        ],
        device,
        torch.long,
    )
    logits = model(input_ids=ids.view(len(rows), width), logits_to_keep=keep_at, use_cache=False).logits
    picked = logits[row_index, col_index].float()
    if temperature != 1.0:
        picked = picked / temperature
    logp = picked.gather(-1, targets[:, None]).squeeze(-1) - torch.logsumexp(picked, dim=-1)
    return list(logp.split([n for r in rows for _, _, n in r.spans]))
