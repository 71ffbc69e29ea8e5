"""The hf backend's sampling loop: a batch of left-padded prompts, one forward per new token.

Why not ``generate``: at the batch sizes of a debate (a dozen to a few hundred rows, tens of tokens) the
per-step work around the model (logits processors, stopping criteria, keeping every step's logits for the
log-probs) and PEFT's per-row adapter dispatch (an index, a cast and two matmuls per adapter and layer)
cost more than the model's own forward. This loop keeps one step to: the forward over the KV cache, one
fp32 log-softmax of the last logits, the draw, and a check for finished rows. The KV cache is one
buffer of prompt + ``max_new_tokens`` positions written in place (transformers' growing cache
concatenates, copying the whole cache at every step: at a few hundred rows that copy costs more than
the step). Rows that finished leave the batch (their cache rows are dropped) once a quarter of the
batch is done, so a long answer does not make every finished row pay for its steps.

Prompt work is not repeated. Rows with the same prompt and adapter (a team's agents opening on the same
question, several samples of one prompt) share one prompt pass: their cache rows are copied before the
first draw. A row may also start from keys and values computed earlier (``prefixes``: a debate's
round-1 prompt repeats the agent's round-0 prompt and answer); its first tokens are then written into
the buffer as they are and only the rest of its prompt runs. The buffer's columns are: reused prefixes,
right-aligned to column ``P``; the rest of each prompt, right-aligned to ``P + S``; the answer. Every
row's last prompt token thus sits in the same column, padding is masked, and position ids count each
row's real tokens, so the model computes what it would have computed on the whole prompt.

Sampling matches ``generate``'s: temperature scaling, then nucleus (top-p) truncation, then one draw
from torch's generator (seed it with ``torch.manual_seed`` for reproducible draws). Each step draws one
uniform for every row of the call, finished rows included, so that a loop that keeps finished rows in
a fixed-size batch (:mod:`.static_decode`) reads the same numbers and samples the same tokens. The log-prob of each
drawn token is ``log_softmax(logits / temperature)`` over the whole vocabulary (temperature 1 for greedy
rows), the quantity the trainer's importance ratio compares against.

Row adapters: each row runs through its own LoRA adapter by :class:`.stacked.StackedAdapters`, the per-row
LoRA the stacked loop uses too (the call's adapters stacked, two matmuls per layer whatever their number,
a row's slot index kept in step with the rows that stay in the batch).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from .stacked import StackedAdapters

#: finished rows leave the batch once they are at least this share of it
COMPACT_SHARE = 0.25


@dataclass
class Sampled:
    """One row's result: token ids (the stop token included), their log-probs, "stop" or "length".

    kv: with ``keep_kv``, the keys and values of the tokens the row read (its prompt, and its answer but the
    last token); else None.
    """

    tokens: list[int]
    logprobs: list[float]
    finish_reason: str
    kv: RowKV | None = None


@dataclass
class RowKV:
    """Keys and values of the tokens one row read, in the buffer columns they had: ``kv`` is
    ``[layers, 2 (keys, values), kv heads, columns, head dim]``, ``real`` is False on the padding columns
    between a reused prefix and the rest of its prompt. Each key already carries its position (rotary
    embedding), so a later call may place the columns anywhere, padding and all."""

    kv: torch.Tensor
    real: torch.Tensor

    @property
    def columns(self) -> int:
        return self.kv.shape[3]

    @property
    def nbytes(self) -> int:
        return self.kv.numel() * self.kv.element_size()

    def head(self, n_tokens: int) -> RowKV:
        """The columns up to and including the ``n_tokens``-th real one (``n_tokens`` >= 1)."""
        end = int(torch.searchsorted(self.real.cumsum(0), n_tokens)) + 1
        return RowKV(self.kv[..., :end, :], self.real[:end])


def prefix_reuse_supported(model) -> bool:
    """Whether keys and values can be written into ``model``'s static cache ahead of a prompt pass: every
    layer a plain full-attention layer (sliding windows and other layer kinds keep their own layouts)."""
    from transformers import StaticCache
    from transformers.cache_utils import StaticLayer

    cache = StaticCache(config=model.config, max_cache_len=1)
    return all(type(layer) is StaticLayer for layer in cache.layers)


@torch.no_grad()
def sample(
    model,
    input_ids: torch.Tensor,
    attention: torch.Tensor,
    *,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    stops: set[int],
    adapters: Sequence[str | None] | None = None,
    on_tokens: Callable[[int], None] | None = None,
    prefixes: Sequence[RowKV | None] | None = None,
    expand: torch.Tensor | None = None,
    keep_kv: bool = False,
) -> list[Sampled]:
    """Sample up to ``max_new_tokens`` after each left-padded prompt row (``attention`` 1 on real tokens).

    adapters: per prompt row, the LoRA adapter to run it through (None: the base model); None: the model
    as it is. prefixes: per prompt row, the keys and values (a :class:`RowKV`, as in :attr:`Sampled.kv`) of tokens that
    come before its ``input_ids`` (None: the row starts at its first token); only for models where
    :func:`prefix_reuse_supported`. expand: per output row, the prompt row it answers (default: one
    output row per prompt row). keep_kv: fill :attr:`Sampled.kv`. on_tokens: called with the number of
    tokens sampled since its last call (rows still running), at most every 0.25 s and once at the end.
    """
    device = input_ids.device
    kwargs, row_adapters = _adapter_setup(model, adapters)
    with row_adapters or nullcontext():
        cache, logits, attention, positions, prompt_end = prompt_pass(
            model, input_ids, attention, prefixes, answer_columns=max_new_tokens, **kwargs
        )
        if expand is not None:  # rows that share a prompt get copies of its cache rows
            cache.reorder_cache(expand)
            logits, attention, positions = logits[expand], attention[expand], positions[expand]
            kwargs = _keep_adapter_kwargs(kwargs, expand)
            if row_adapters is not None:
                row_adapters.keep(expand)
        rows = logits.shape[0]
        live = torch.arange(rows, device=device)  # original row of each batch row
        running = torch.ones(rows, dtype=torch.bool, device=device)  # batch rows not yet stopped
        stop_ids = torch.tensor(sorted(stops), device=device)
        tokens = torch.empty(rows, max_new_tokens, dtype=torch.long, device=device)
        logps = torch.empty(rows, max_new_tokens, dtype=torch.float32, device=device)
        lengths = torch.full((rows,), max_new_tokens, dtype=torch.long, device=device)
        kept: dict[int, RowKV] = {}  # original row -> its keys and values (keep_kv)
        pending, last = 0, time.monotonic()
        for step in range(max_new_tokens):
            token, logp = _draw(
                logits.float(), temperature, top_p, _uniforms(temperature, rows, device, live)
            )
            tokens[live, step], logps[live, step] = token, logp
            done = running & torch.isin(token, stop_ids)
            lengths[live[done]] = step + 1
            pending += int(running.sum())
            running &= ~done
            if on_tokens is not None and time.monotonic() - last >= 0.25:
                on_tokens(pending)
                pending, last = 0, time.monotonic()
            n_running = int(running.sum())
            if n_running == 0 or step + 1 == max_new_tokens:
                break
            if len(live) - n_running >= COMPACT_SHARE * len(live):  # finished rows leave the batch
                if keep_kv:
                    kept |= _read_kv(
                        cache, (~running).nonzero().squeeze(-1), live, attention, lengths, prompt_end
                    )
                keep = running.nonzero().squeeze(-1)
                cache.reorder_cache(keep)
                live, token, attention, positions = live[keep], token[keep], attention[keep], positions[keep]
                running = running[keep]
                kwargs = _keep_adapter_kwargs(kwargs, keep)
                if row_adapters is not None:
                    row_adapters.keep(keep)
            positions = positions[:, -1:] + 1
            logits = model(
                input_ids=token[:, None],
                attention_mask=attention,
                position_ids=positions,
                past_key_values=cache,
                use_cache=True,
                **kwargs,
            ).logits[:, -1]
        if keep_kv:
            kept |= _read_kv(
                cache, torch.arange(len(live), device=device), live, attention, lengths, prompt_end
            )
    if on_tokens is not None and pending:
        on_tokens(pending)
    return results(tokens, logps, lengths, stop_ids, kept)


def results(
    tokens: torch.Tensor,
    logps: torch.Tensor,
    lengths: torch.Tensor,
    stop_ids: torch.Tensor,
    kept: dict[int, RowKV],
) -> list[Sampled]:
    """Each row's first ``lengths`` tokens and log-probs, "stop" if it ended on a stop token."""
    rows, max_new_tokens = tokens.shape
    stopped = lengths < max_new_tokens
    stopped |= torch.isin(tokens[torch.arange(rows), (lengths - 1).clamp(min=0)], stop_ids)
    token_lists, logp_lists = tokens.tolist(), logps.tolist()
    return [
        Sampled(token_lists[r][:n], logp_lists[r][:n], "stop" if s else "length", kept.get(r))
        for r, (n, s) in enumerate(zip(lengths.tolist(), stopped.tolist(), strict=True))
    ]


def prompt_pass(
    model,
    input_ids: torch.Tensor,
    attention: torch.Tensor,
    prefixes: Sequence[RowKV | None] | None,
    answer_columns: int,
    **kwargs,
) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Run the prompts (after their reused ``prefixes``) into a fresh static cache of ``P + S +
    answer_columns`` columns (reused prefixes, prompts, answers).

    Returns the cache, the last prompt position's logits per row, the mask over the whole buffer (answer
    columns 1: causality hides those not written yet), each row's last position id and ``P + S``.
    ``kwargs`` go to the model (e.g. PEFT's ``adapter_names``).
    """
    from transformers import StaticCache

    (n_prompts, width), device = input_ids.shape, input_ids.device
    prefixes = list(prefixes) if prefixes else [None] * n_prompts
    reused = torch.tensor([0 if p is None else int(p.real.sum()) for p in prefixes], device=device)
    before = max((p.columns for p in prefixes if p is not None), default=0)  # reused columns, right-aligned
    prompt_end = before + width
    # one KV buffer for prefix + prompt + answer, written in place (a growing cache copies itself every step)
    cache = StaticCache(config=model.config, max_cache_len=prompt_end + answer_columns)
    seen = attention.new_zeros(n_prompts, before)  # the reused columns' mask
    if before:
        _write_prefixes(cache, prefixes, before)
        for row, p in enumerate(prefixes):
            if p is not None:
                seen[row, before - p.columns :] = p.real
    positions = (attention.cumsum(-1) - 1).clamp(min=0) + reused[:, None]
    attention = torch.cat([seen, attention, attention.new_ones(n_prompts, answer_columns)], dim=1)
    logits = model(
        input_ids=input_ids,
        attention_mask=attention,
        position_ids=positions,
        past_key_values=cache,
        use_cache=True,
        # the last position as an index, not the int 1: torch multiplies a strided slice by expanding
        # the output layer's weight per row (seconds on CPU)
        logits_to_keep=torch.tensor([width - 1], device=device),
        **kwargs,
    ).logits[:, -1]
    return cache, logits, attention, positions[:, -1:], prompt_end


def _write_prefixes(cache, prefixes: Sequence[RowKV | None], before: int) -> None:
    """Fill the first ``before`` columns of an empty static cache: each row's prefix right-aligned."""
    first = next(p for p in prefixes if p is not None).kv
    layers, _, heads, _, dim = first.shape
    block = first.new_zeros(layers, 2, len(prefixes), heads, before, dim)
    for row, p in enumerate(prefixes):
        if p is not None:
            block[:, :, row, :, before - p.columns :] = p.kv
    for layer in range(layers):
        cache.update(block[layer, 0], block[layer, 1], layer)


def _read_kv(
    cache,
    batch_rows: torch.Tensor,
    live: torch.Tensor,
    attention: torch.Tensor,
    lengths: torch.Tensor,
    prompt_end: int,
) -> dict[int, RowKV]:
    """Original row -> what its batch row read: the columns from its first real one to its last answer
    token fed back (all but the last drawn), as views of one copy of those rows."""
    first = attention[batch_rows, :prompt_end].int().argmax(-1).tolist()
    ends = (prompt_end + lengths[live[batch_rows]] - 1).tolist()
    lo, hi = min(first), max(ends)
    keys = cache.layers[0].keys
    copy = keys.new_empty(len(cache.layers), 2, len(batch_rows), keys.shape[1], hi - lo, keys.shape[3])
    for k, layer in enumerate(cache.layers):
        torch.index_select(layer.keys[:, :, lo:hi], 0, batch_rows, out=copy[k, 0])
        torch.index_select(layer.values[:, :, lo:hi], 0, batch_rows, out=copy[k, 1])
    return {
        int(live[b]): RowKV(copy[:, :, j, :, f - lo : e - lo], attention[b, f:e].bool())
        for j, (b, f, e) in enumerate(zip(batch_rows.tolist(), first, ends, strict=True))
    }


def _uniforms(temperature: float, rows: int, device, live: torch.Tensor | None = None) -> torch.Tensor | None:
    """This step's uniforms: one per row of the call, finished rows included (None when greedy), so that
    every decode path draws the same numbers from torch's generator whatever rows have left the batch;
    ``live`` picks the rows still in it."""
    if temperature <= 0:
        return None
    u = torch.rand(rows, 1, device=device)
    return u if live is None else u[live]


def _draw(
    logits: torch.Tensor, temperature: float, top_p: float, uniforms: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(drawn token, its log-prob under log_softmax(logits / temperature)) per row; greedy at 0.

    uniforms: one U(0, 1) per row (``rows x 1``); drawn here when None."""
    if temperature <= 0:
        logp = torch.log_softmax(logits, dim=-1)
        token = logits.argmax(-1)
        return token, logp.gather(-1, token[:, None]).squeeze(-1)
    logp = torch.log_softmax(logits / temperature, dim=-1)
    weights = logp
    if top_p < 1:
        # nucleus: drop the tokens whose higher-ranked mass already reaches top_p (the top one stays)
        sorted_logp, order = logp.sort(dim=-1, descending=True)
        above = sorted_logp.exp().cumsum(-1) - sorted_logp.exp() >= top_p
        weights = logp.scatter(-1, order, sorted_logp.masked_fill(above, float("-inf")))
    # inverse-CDF draw: one uniform per row (torch.multinomial draws one exponential per vocabulary entry)
    cdf = weights.exp().cumsum(-1)
    if uniforms is None:
        uniforms = torch.rand(cdf.shape[0], 1, device=cdf.device)
    token = torch.searchsorted(cdf, uniforms * cdf[:, -1:]).squeeze(-1).clamp(max=cdf.shape[-1] - 1)
    return token, logp.gather(-1, token[:, None]).squeeze(-1)


def _adapter_setup(model, adapters: Sequence[str | None] | None) -> tuple[dict, StackedAdapters | None]:
    """Forward kwargs and the row-adapter context for a batch: the call's adapters stacked where they
    can be, PEFT's per-row ``adapter_names`` otherwise, nothing for a plain model."""
    if adapters is None:
        return {}, None
    if StackedAdapters.supported(model, adapters):
        stack = StackedAdapters(model, capacity=len(adapters), names=adapters)
        stack.select(stack.slots(adapters))
        return {}, stack
    return {"adapter_names": [n if n is not None else "__base__" for n in adapters]}, None


def _keep_adapter_kwargs(kwargs: dict, keep: torch.Tensor) -> dict:
    if "adapter_names" not in kwargs:
        return kwargs
    names = kwargs["adapter_names"]
    return {**kwargs, "adapter_names": [names[k] for k in keep.tolist()]}
