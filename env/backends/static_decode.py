"""The hf backend's decode loop on fixed buffers: one forward per token for every row of a call, each
row through its own adapter (:mod:`.stacked`), the step optionally replayed as a CUDA graph.

On a GPU a decode step of a small model is bound by kernel launches, not by arithmetic: the eager loop
of :mod:`.decoding` launches thousands of kernels per token, reads the finished rows back to the host
every step and changes its batch's shape as rows finish. Here a call's shapes are fixed:

- rows are padded to a bucket (:func:`bucket`: the next ``2^k`` or ``3 * 2^k``), the KV cache to a
  bucket of columns (at least :data:`MIN_COLUMNS`), so a debate's rounds and a run's iterations meet a
  handful of shapes; each shape's buffers (cache, mask, tokens, positions) stay allocated across calls
  (up to ``max_bytes``, the oldest freed first) and are written in place;
- finished rows stay in the batch (their later tokens are dropped) and padding rows run slot 0 (the
  base model) on stale buffer contents, both masked out of the results;
- the host reads the finished mask every :data:`SYNC_EVERY` steps, not every token: sampling
  (temperature, top-p, stop tokens) runs on the device;
- with ``graph``, the step is ``torch.compile(mode="reduce-overhead")``: captured once per shape as a
  CUDA graph and replayed; the adapters' stacked weights and the cache keep their storage, so new
  adapter weights (copied in place at each call) need no new capture. The step calls the model beneath
  the PEFT wrapper (its LoRA layers run the stacked adapters, selected by row index), so it reads no
  ``active_adapter``: the trainer switching adapters between rollouts recompiles nothing.
- the step is compiled once for every bucket (``shapes="dynamic"``; once more for a single row, a size
  dynamo specializes): its rows and KV columns are symbolic sizes, and the cache reports its length from its keys' size (:func:`_sized`), not from the
  integer it was built with, which dynamo would specialize on. A new bucket then records a CUDA graph
  instead of compiling (25-40 s a bucket at the 1B shape on an H200, and a run meets several buckets of
  rows and columns). ``shapes="static"`` compiles each bucket's shape on its own.
  Either way dynamo's recompile limit is raised, for this step alone, to the number of shapes the
  decoder can meet (:func:`shape_count`), and a shape past it decodes uncompiled with a warning
  (:attr:`StaticDecoder.uncompiled`), never silently.

The prompt pass is the eager loop's (:func:`.decoding.prompt_pass`, variable shapes, not captured) with
the stacked adapters; its keys and values are copied into the bucket's cache. Draws are the eager loop's
too: one uniform per row of the call per step, from torch's generator. In fp32 both loops therefore
sample the same tokens for the same seed (their logits differ by rounding only). After the last row
stops, up to ``SYNC_EVERY - 1`` more steps may run and draw, so the generator's state after a call is
not the eager loop's (the hf backend seeds each call when a seed is given).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from .decoding import RowKV, Sampled, _draw, _read_kv, _uniforms, prefix_reuse_supported, prompt_pass, results
from .stacked import StackedAdapters, _static

log = logging.getLogger(__name__)

#: decode steps between two reads of the finished mask on the host
SYNC_EVERY = 8
#: the smallest KV cache bucket (columns)
MIN_COLUMNS = 64
#: what dynamo raises at its recompile limit when told to (``torch._dynamo.exc``; renamed in torch 2.7)
LIMIT_ERRORS = ("FailOnRecompileLimitHit", "FailOnCacheLimitHit")
#: how a compiled step treats the buckets' sizes (:class:`StaticDecoder`'s ``shapes``)
SHAPES = ("dynamic", "static")


def check_shapes(shapes: str) -> None:
    """Raise ValueError unless ``shapes`` is one of :data:`SHAPES`."""
    if shapes not in SHAPES:
        raise ValueError(f"decode shapes must be one of {', '.join(SHAPES)}, got {shapes!r}")


def bucket(n: int, smallest: int = 1) -> int:
    """The smallest ``2^k`` or ``3 * 2^k`` (``k >= 0``) that is at least ``max(n, smallest)``."""
    n, size = max(n, smallest), 1
    while size < n:
        size *= 2
    return size * 3 // 4 if size >= 4 and size * 3 // 4 >= n else size


def bucket_sizes(largest: int, smallest: int = 1) -> list[int]:
    """Every bucket (:func:`bucket`) from ``bucket(1, smallest)`` to ``bucket(largest, smallest)``."""
    sizes = [bucket(1, smallest)]
    while sizes[-1] < bucket(largest, smallest):
        sizes.append(bucket(sizes[-1] + 1, smallest))
    return sizes


def shape_count(max_rows: int, max_columns: int, max_positions: int | None = None) -> int:
    """How many (rows, columns) buckets calls of at most ``max_rows`` rows and ``max_columns`` KV columns
    fall into, where a call of more than one row holds at most ``max_positions`` rows x columns (None: no
    such bound). A bucket counts if the fewest rows and columns that land in it fit."""
    rows, columns = bucket_sizes(max_rows), bucket_sizes(max_columns, MIN_COLUMNS)
    fewest_rows = [1] + [r + 1 for r in rows[:-1]]
    fewest_columns = [1] + [c + 1 for c in columns[:-1]]
    return sum(
        1
        for r in fewest_rows
        for c in fewest_columns
        if r == 1 or max_positions is None or r * c <= max_positions
    )


def context_length(model) -> int:
    """The most positions ``model`` reads (its config's ``max_position_embeddings``; 2^17 if unset)."""
    config = getattr(model.config, "text_config", None) or model.config
    return int(getattr(config, "max_position_embeddings", None) or 2**17)


def _cache_tensors(cache: Any) -> list[torch.Tensor]:
    """Every tensor a static cache's layers hold (keys, values, their lengths)."""
    return [t for layer in cache.layers for t in vars(layer).values() if isinstance(t, torch.Tensor)]


def _sized(cache: Any) -> bool:
    """Make each layer of a transformers ``StaticCache`` report its length (what the attention mask is
    built for) as its keys' size, which a compiled step can hold symbolic, instead of the same number as
    the ``max_cache_len`` integer it was built with, on which dynamo specializes (a compile per length).
    Returns whether every layer is a plain full-attention ``StaticLayer``, the only kind changed."""
    from transformers.cache_utils import StaticLayer

    if not all(type(layer) is StaticLayer for layer in cache.layers):
        return False
    sized = _sized_layer()
    for layer in cache.layers:
        layer.__class__ = sized
    return True


@functools.cache
def _sized_layer() -> type:
    """A ``StaticLayer`` whose mask length is its keys' size (:func:`_sized`); made on first use, so that
    importing this module does not import transformers."""
    from transformers.cache_utils import StaticLayer

    class SizedLayer(StaticLayer):
        def get_mask_sizes(self, *args: Any, **kwargs: Any) -> tuple[Any, int]:
            _, offset = super().get_mask_sizes(*args, **kwargs)
            return self.keys.shape[2], offset

    return SizedLayer


@dataclass
class _Buffers:
    """One shape's fixed inputs: the static cache, its 0/1 mask ``[rows, columns]``, the fed tokens and
    their position ids ``[rows, 1]``."""

    cache: Any  # a transformers StaticCache
    mask: torch.Tensor
    tokens: torch.Tensor
    positions: torch.Tensor
    nbytes: int


def _symbolic(buf: _Buffers) -> None:
    """Mark a bucket's rows and KV columns as sizes a compiled step holds symbolic (one compile serves
    every bucket; ``maybe_``: a size the step must specialize, a single row say, is specialized, not an
    error)."""
    for t in (buf.mask, buf.tokens, buf.positions):
        torch._dynamo.maybe_mark_dynamic(t, 0)
    torch._dynamo.maybe_mark_dynamic(buf.mask, 1)
    for layer in buf.cache.layers:
        for t in (layer.keys, layer.values):
            torch._dynamo.maybe_mark_dynamic(t, 0)
            torch._dynamo.maybe_mark_dynamic(t, 2)


class StaticDecoder:
    """Samples like :func:`.decoding.sample` on fixed, reused buffers (see the module docstring).

    graph: replay the decode step as a CUDA graph (``torch.compile`` in ``reduce-overhead`` mode; CUDA
    only). max_bytes: KV cache kept allocated across calls, all shapes together. max_rows: the most rows
    a call decodes (the stacked adapters' slot index is sized for its bucket once). compile_backend:
    without ``graph``, compile the step with this ``torch.compile`` backend (the tests: "eager" on a CPU,
    where dynamo's guards and recompiles are those of the graph path). max_positions: the most rows x KV
    columns a call of several rows holds (the hf backend's KV cap; None: no bound), which with
    ``max_rows`` and the model's context length bounds the shapes a compiled step compiles for
    (:attr:`shapes`, its recompile limit). A shape past that limit decodes uncompiled (listed in
    :attr:`uncompiled`, with a warning). shapes: "dynamic" (one compile for every bucket: rows and KV
    columns symbolic) or "static" (a compile per bucket); see the module docstring.

    A compiled step never recompiles for a buffer it has seen the shape of: every buffer it reads is
    marked static without an identity guard (:func:`.stacked._static`), so a bucket evicted at
    ``max_bytes`` and allocated again, or adapters stacked afresh, reuse the compiled code (a CUDA graph
    re-records). :meth:`close` resets dynamo, whose caches would otherwise keep this decoder's code.
    """

    def __init__(
        self,
        model,
        graph: bool = False,
        max_bytes: float = 4 * 2**30,
        max_rows: int = 1,
        compile_backend: str | Callable | None = None,
        max_positions: int | None = None,
        shapes: str = "dynamic",
    ):
        if graph and not torch.cuda.is_available():
            raise ValueError("graph decoding needs CUDA")
        check_shapes(shapes)
        self.model = model
        # what the compiled step calls: the model beneath a PEFT wrapper (whose forward reads the active
        # adapter, which dynamo then guards on); its LoRA layers run the stacked adapters by row index
        self.inner = model.get_base_model() if hasattr(model, "get_base_model") else model
        self.max_bytes = max_bytes
        self.max_rows = max_rows
        self.buffers: dict[tuple[int, int], _Buffers] = {}  # (rows, columns) -> buffers, oldest first
        self.stack: StackedAdapters | None = None
        self.step: Callable[[_Buffers], torch.Tensor] = self._forward
        # dynamic=None: the sizes marked dynamic in _buffers are symbolic, the others specialized
        dynamic = None if shapes == "dynamic" else False
        if graph:
            self.step = torch.compile(self._forward, mode="reduce-overhead", dynamic=dynamic)
        elif compile_backend is not None:
            self.step = torch.compile(self._forward, backend=compile_backend, dynamic=dynamic)
        self.graph = graph
        self.compiled = graph or compile_backend is not None
        self.dynamic = self.compiled and shapes == "dynamic"
        #: the bucket shapes calls can meet: the compiled step's recompile limit
        self.shapes = shape_count(max_rows, context_length(model), max_positions)
        #: shapes that met dynamo's recompile limit all the same and decode uncompiled
        self.uncompiled: set[tuple[int, int]] = set()

    def close(self) -> None:
        """Free the buffers and, if the step was compiled, reset dynamo (its caches hold the compiled
        code, its guards and, on a GPU, the captured graphs' memory pool)."""
        self.buffers.clear()
        self.stack = None
        if self.compiled:
            torch._dynamo.reset()

    @staticmethod
    def supported(model) -> bool:
        """Full-attention cache layers only, and adapters :class:`StackedAdapters` can stack."""
        return prefix_reuse_supported(model) and StackedAdapters.supported(model)

    def _forward(self, buf: _Buffers) -> torch.Tensor:
        return self.inner(
            input_ids=buf.tokens,
            attention_mask=buf.mask,
            position_ids=buf.positions,
            past_key_values=buf.cache,
            use_cache=True,
        ).logits[:, -1]

    def _limits(self) -> Any:
        """For a call of a compiled step: dynamo's recompile limits raised to :attr:`shapes` and reaching
        them made an error (:meth:`_step` decodes that shape uncompiled), restored when the call ends.
        The settings by their names before torch 2.7 (``cache_size_limit``...; aliases since); a torch
        without ``fail_on_cache_limit_hit`` runs a shape past the limit uncompiled unannounced."""
        if self.step == self._forward:
            return nullcontext()
        dynamo = torch._dynamo.config
        limits = {
            "cache_size_limit": max(dynamo.cache_size_limit, self.shapes),
            "accumulated_cache_size_limit": max(dynamo.accumulated_cache_size_limit, self.shapes),
        }
        if hasattr(dynamo, "fail_on_cache_limit_hit"):
            limits["fail_on_cache_limit_hit"] = True
        return dynamo.patch(**limits)

    def _step(self, buf: _Buffers) -> torch.Tensor:
        """One decode step: compiled, or uncompiled for a shape past the recompile limit (warned once)."""
        shape = (len(buf.tokens), buf.mask.shape[1])
        if shape in self.uncompiled:
            return self._forward(buf)
        try:
            return self.step(buf)
        except Exception as e:
            if type(e).__name__ not in LIMIT_ERRORS:
                raise
            self.uncompiled.add(shape)
            log.warning(
                "static decoder: dynamo's recompile limit (%d) reached at the bucket of %d rows x %d "
                "columns; that shape decodes uncompiled from now on (%d shape(s) so far). The error: %s",
                torch._dynamo.config.cache_size_limit,
                *shape,
                len(self.uncompiled),
                e,
            )
            return self._forward(buf)

    def _adapters(self) -> StackedAdapters:
        """The stacked adapters, rebuilt if the model's adapters changed, else refreshed in place."""
        if self.stack is None or not self.stack.matches(self.model):
            self.stack = StackedAdapters(self.model, capacity=bucket(self.max_rows))
        else:
            self.stack.refresh()
        return self.stack

    def _buffers(self, rows: int, columns: int, like: Any) -> _Buffers:
        """The buffers of the bucket holding ``rows x columns``, allocated like the cache ``like``."""
        from transformers import StaticCache

        key = (bucket(rows), bucket(columns, MIN_COLUMNS))
        buf = self.buffers.pop(key, None)
        if buf is None:
            layer = like.layers[0].keys
            cache = StaticCache(config=self.model.config, max_cache_len=key[1])
            cache.early_initialization(key[0], layer.shape[1], layer.shape[3], layer.dtype, layer.device)
            size = 2 * len(cache.layers) * cache.layers[0].keys.numel() * layer.element_size()
            ones = torch.ones(key[0], 1, dtype=torch.long, device=layer.device)
            buf = _Buffers(cache, ones.new_ones(key), ones, ones.clone(), size)
            # read in place by a compiled step, unguarded (transformers marks the cache's own tensors
            # with torch's default guard, which differs between versions: marked again here)
            for t in (buf.mask, buf.tokens, buf.positions, *_cache_tensors(cache)):
                _static(t)
            if self.dynamic and _sized(cache):
                _symbolic(buf)
        self.buffers[key] = buf  # the newest last
        while sum(b.nbytes for b in self.buffers.values()) > self.max_bytes and len(self.buffers) > 1:
            self.buffers.pop(next(iter(self.buffers)))
        return buf

    @torch.no_grad()
    def sample(
        self,
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
        """Arguments and results as :func:`.decoding.sample`'s (``model`` is the decoder's)."""
        device = input_ids.device
        stack = self._adapters() if adapters is not None else None
        if stack is not None:
            stack.select(stack.slots(adapters))
        with stack or nullcontext(), self._limits():
            prompt, logits, attention, positions, prompt_end = prompt_pass(
                self.model, input_ids, attention, prefixes, answer_columns=0
            )
            order = torch.arange(len(input_ids), device=device) if expand is None else expand
            rows = len(order)
            buf = self._buffers(rows, prompt_end + max_new_tokens, prompt)
            padded = len(buf.tokens)
            for src, dst in zip(prompt.layers, buf.cache.layers, strict=True):
                dst.keys[:rows, :, :prompt_end].copy_(src.keys[order])
                dst.values[:rows, :, :prompt_end].copy_(src.values[order])
                dst.cumulative_length.fill_(prompt_end)
            del prompt
            buf.mask.fill_(1)
            buf.mask[:rows, :prompt_end].copy_(attention[order])
            buf.positions[:rows].copy_(positions[order])
            logits = logits[order]
            if stack is not None:
                stack.select(stack.slots(adapters)[order], capacity=padded)
            running = torch.ones(rows, dtype=torch.bool, device=device)
            stop_ids = torch.tensor(sorted(stops), device=device)
            tokens = torch.empty(rows, max_new_tokens, dtype=torch.long, device=device)
            logps = torch.empty(rows, max_new_tokens, dtype=torch.float32, device=device)
            lengths = torch.full((rows,), max_new_tokens, dtype=torch.long, device=device)
            produced = torch.zeros((), dtype=torch.long, device=device)  # tokens of running rows
            reported, last = 0, time.monotonic()
            for step in range(max_new_tokens):
                token, logp = _draw(
                    logits[:rows].float(), temperature, top_p, _uniforms(temperature, rows, device)
                )
                tokens[:, step], logps[:, step] = token, logp
                produced += running.sum()
                done = running & torch.isin(token, stop_ids)
                lengths.masked_fill_(done, step + 1)
                running &= ~done
                if step + 1 == max_new_tokens:
                    break
                if (step + 1) % SYNC_EVERY == 0:
                    n_running, n_produced = torch.stack([running.sum(), produced]).tolist()
                    if on_tokens is not None and time.monotonic() - last >= 0.25:
                        on_tokens(n_produced - reported)
                        reported, last = n_produced, time.monotonic()
                    if n_running == 0:
                        break
                buf.tokens[:rows, 0] = token
                buf.positions.add_(1)
                if self.graph:
                    torch.compiler.cudagraph_mark_step_begin()
                logits = self._step(buf)
            kept: dict[int, RowKV] = {}
            if keep_kv:
                every = torch.arange(rows, device=device)
                kept = _read_kv(buf.cache, every, every, buf.mask, lengths, prompt_end)
        if on_tokens is not None and int(produced) > reported:
            on_tokens(int(produced) - reported)
        return results(tokens, logps, lengths, stop_ids, kept)
