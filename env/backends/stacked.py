"""Each row of a batch through its own LoRA adapter, from adapters stacked in fixed buffers: the one
per-row LoRA of both decode loops (:mod:`.decoding`'s eager loop and :mod:`.static_decode`'s fixed-shape,
optionally compiled, step).

A LoRA layer computes ``y = W x + s_k B_k A_k x`` for adapter ``k`` (``s_k = alpha / r``). Here every
adapter stacked (by default every one loaded in the model) gets a slot; slot 0 is all zeros (the base
model). Per layer the slots'
matrices are stacked, ranks padded with zeros to the largest ``r``:

    A: [S, r, in]        Bt: [S, r, out]   (Bt[k] = s_k B_k^T)

and a row whose slot index is ``i`` computes

    y = W x + ((x A_flat^T) * m_i) Bt_flat,   A_flat = A.view(S r, in), Bt_flat = Bt.view(S r, out),
    m_i[j] = 1 if j // r == i else 0

two dense matmuls over all stacked ranks whatever the rows' mix of slots, so a batch has one shape for
any mix (what a captured CUDA graph needs). The slot of each row is an index tensor written in place
(:meth:`StackedAdapters.select`, or :meth:`StackedAdapters.keep` when rows leave an eager batch), and so
are the masks: ``select`` computes ``m`` once for every row, one buffer per layout of stacked ranks
(layers of the same padded rank share it) in the adapters' dtype, so a step's LoRA layers only read it
(no comparison, no cast per layer; a compiled step, or a CUDA graph, reads the buffers in place like the
index). Per layer a decode step then dispatches the base matmul, the two LoRA matmuls, the mask's
product and the sum, and the views around them (8 operators where computing the mask in every layer took
19; a slice more once rows have left an eager batch; casts only where the adapters' dtype is not the
input's). A per-row gather of A
and B followed by ``bmm`` would read ``rows x r x (in + out)`` numbers per layer; the dense product reads
each adapter once, and its extra columns (``S r``, tens) are few next to the layer's width. The
matmuls run in the adapters' dtype, as PEFT's do (fp32 under a bf16 base: at these shapes fp32 is also
the faster one on CPU).

The buffers keep their storage for the life of the object: :meth:`StackedAdapters.refresh` copies the
adapters' current weights into them in place (after a training step the live PeftModel's weights have
changed), so a captured graph replays with the new weights. The slot index is allocated at the largest
padded batch (``capacity``) once, so its shape never changes under a compiled step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch


def _lora_layers(model) -> list:
    """The LoRA linear layers of a PeftModel (none for a plain model)."""
    from peft.tuners.lora import LoraLayer

    return [m for m in model.modules() if isinstance(m, LoraLayer)]


@dataclass
class _Stack:
    """One LoRA layer's stacked slots and where each adapter's weights come from. ``at`` and ``bt_flat``
    are views of ``a`` and ``bt`` (made once: a step reads them without a view operator of its own), and
    ``mask`` the rows' mask of this layer's layout (:attr:`StackedAdapters.masks`)."""

    a: torch.Tensor  # [S, r, in]
    bt: torch.Tensor  # [S, r, out], scaled
    columns: torch.Tensor  # [S r]: the slot of each stacked rank
    sources: list[tuple[int, torch.Tensor, torch.Tensor, float]]  # (slot, A [r_k, in], B [out, r_k], s_k)
    at: torch.Tensor  # [in, S r]: A_flat^T
    bt_flat: torch.Tensor  # [S r, out]
    layout: tuple[int, torch.dtype, torch.device]  # (S r, dtype, device): the layers sharing a mask
    mask: torch.Tensor | None = None  # [capacity, S r] in the adapters' dtype, written by ``select``


class StackedAdapters:
    """Context manager: the model's LoRA layers run every row through the adapter of its slot.

    Slots: 0 is the base model, ``k + 1`` the ``k``-th of :attr:`names`: the adapters of ``names`` (None
    entries stand for the base model), by default every adapter the model holds; sorted. Inside the
    context every LoRA layer runs only these slots (a layer holding none of them runs its base layer).
    :meth:`supported` says whether the model's LoRA layers are all of the kind this handles (plain LoRA
    on linear layers).
    """

    def __init__(self, model, capacity: int = 1, names: Sequence[str | None] | None = None):
        self.model = model
        self.layers = _lora_layers(model)
        held = {n for layer in self.layers for n in layer.lora_A}
        self.names = sorted(held if names is None else {n for n in names if n is not None})
        self.signature = _signature(self.layers)
        # sized at the largest padded batch from the start: a compiled step guards on its size
        self.index = _static(torch.zeros(capacity, dtype=torch.long, device=_device(model)))
        self.stacks: dict[int, _Stack] = {}
        slots = {name: k + 1 for k, name in enumerate(self.names)}
        for layer in self.layers:
            own = sorted(set(layer.lora_A) & set(self.names))
            if not own:
                continue
            first = layer.lora_A[own[0]].weight
            rank = max(layer.lora_A[n].weight.shape[0] for n in own)
            n_slots, width_in = len(self.names) + 1, first.shape[1]
            width_out = layer.lora_B[own[0]].weight.shape[0]
            a = _static(first.new_zeros(n_slots, rank, width_in))
            bt = _static(first.new_zeros(n_slots, rank, width_out))
            self.stacks[id(layer)] = _Stack(
                a=a,
                bt=bt,
                columns=_static(torch.arange(n_slots, device=first.device).repeat_interleave(rank)),
                sources=[
                    (slots[n], layer.lora_A[n].weight, layer.lora_B[n].weight, float(layer.scaling[n]))
                    for n in own
                ],
                at=_static(a.view(n_slots * rank, width_in).t()),
                bt_flat=_static(bt.view(n_slots * rank, width_out)),
                layout=(n_slots * rank, first.dtype, first.device),
            )
        #: the rows' masks ``m``: a ``[capacity, S r]`` buffer per layout of stacked ranks (module doc)
        self.masks: dict[tuple, torch.Tensor] = {}
        self._allocate_masks()
        self.refresh()

    @staticmethod
    def supported(model, names: Sequence[str | None] | None = None) -> bool:
        """Whether every LoRA layer is a plain LoRA linear layer holding each of ``names`` (default: every
        adapter the model holds), none of them DoRA (embedding, convolution and other variants are not)."""
        from peft.tuners.lora import Linear

        layers = _lora_layers(model)
        wanted = {n for layer in layers for n in layer.lora_A} if names is None else set(names) - {None}
        return all(
            type(layer) is Linear
            and all(n in layer.lora_A and not layer.use_dora.get(n, False) for n in wanted)
            for layer in layers
        )

    def matches(self, model) -> bool:
        """Whether ``model`` still has the layers, adapters and shapes these buffers were built for."""
        return model is self.model and _signature(_lora_layers(model)) == self.signature

    def slot(self, name: str | None) -> int:
        return 0 if name is None else self.names.index(name) + 1

    @torch.no_grad()
    def refresh(self) -> None:
        """Copy every adapter's current A and ``s B^T`` into its slot, in place."""
        dst_a, src_a, dst_b, src_b, scales = [], [], [], [], []
        for stack in self.stacks.values():
            for slot, a, b, scale in stack.sources:
                dst_a.append(stack.a[slot, : a.shape[0]])
                src_a.append(a.detach())
                dst_b.append(stack.bt[slot, : a.shape[0]])
                src_b.append(b.detach().T)
                scales.append(scale)
        if dst_a:
            torch._foreach_copy_(dst_a, src_a)
            torch._foreach_copy_(dst_b, src_b)
            torch._foreach_mul_(dst_b, scales)

    def select(self, slots: torch.Tensor, capacity: int | None = None) -> None:
        """Row ``j`` of the next batches runs through slot ``slots[j]``; rows past ``len(slots)`` (up to
        ``capacity``, the padded batch) through slot 0. The index keeps its storage unless it must grow
        past the capacity it was built with (a compiled step then compiles again: the size changed)."""
        capacity = max(capacity or len(slots), len(slots))
        if capacity > len(self.index):
            self.index = _static(self.index.new_zeros(capacity))
            self._allocate_masks()
        self.index[len(slots) :].zero_()
        self.index[: len(slots)].copy_(slots)
        self._write_masks()

    def _allocate_masks(self) -> None:
        """One mask buffer per layout, as many rows as the index, handed to its layers (allocated again
        only when the index grows), written from the index."""
        self._columns = {stack.layout: stack.columns for stack in self.stacks.values()}
        self.masks = {
            (width, dtype, device): _static(torch.zeros(len(self.index), width, dtype=dtype, device=device))
            for width, dtype, device in self._columns
        }
        for stack in self.stacks.values():
            stack.mask = self.masks[stack.layout]
        self._write_masks()

    def _write_masks(self) -> None:
        """Every layout's mask from the index, in place: ``m[j, c] = 1`` where stacked column ``c`` is a
        rank of row ``j``'s slot, else 0 (in the mask's dtype)."""
        for layout, mask in self.masks.items():
            torch.eq(self._columns[layout], self.index[:, None], out=mask)

    def keep(self, rows: torch.Tensor) -> None:
        """Only ``rows`` (indices into the current batch) go on, in that order."""
        self.select(self.index[rows])

    def slots(self, names: Sequence[str | None]) -> torch.Tensor:
        """The slot index of each name (None: 0)."""
        return torch.tensor([self.slot(n) for n in names], dtype=torch.long, device=self.index.device)

    def __enter__(self) -> StackedAdapters:
        for layer in self.layers:
            layer.forward = self._forward(layer.base_layer, self.stacks.get(id(layer)))
        return self

    def __exit__(self, *exc) -> None:
        for layer in self.layers:
            del layer.forward  # back to the class's forward

    def _forward(self, base, stack: _Stack | None) -> Callable:
        # a function, not a module: a module assigned to ``layer.forward`` would become a submodule (and the
        # class's forward would still run)
        if stack is None:  # a layer holding none of the stacked adapters

            def base_only(x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
                return base(x, *args, **kwargs)

            return base_only
        # a plain linear base layer without hooks: its matmul is run here on the flattened rows, the one
        # ``torch.nn.functional.linear`` runs on 3-d input (the same kernel, the same numbers)
        plain = type(base) is torch.nn.Linear and not (base._forward_hooks or base._forward_pre_hooks)

        def forward(x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
            rows = x.shape[0]
            flat = x.reshape(-1, x.shape[-1])  # [rows x positions, in]
            if plain and not args and not kwargs:
                result = torch.nn.functional.linear(flat, base.weight, base.bias)
            else:
                result = base(x, *args, **kwargs).reshape(flat.shape[0], -1)
            mask = stack.mask
            if torch.compiler.is_compiling() or rows != len(mask):  # compiled: rows symbolic, never compared
                mask = mask[:rows]
            hidden = (flat if flat.dtype == stack.at.dtype else flat.to(stack.at.dtype)) @ stack.at
            if hidden.shape[0] == rows:  # one position per row: a decode step
                hidden = hidden * mask
            else:
                hidden = (hidden.view(rows, -1, hidden.shape[-1]) * mask[:, None]).view(hidden.shape)
            out = result + hidden @ stack.bt_flat
            if out.dtype != result.dtype:  # adapters in another dtype than the base layer's
                out = out.to(result.dtype)
            return out.view(*x.shape[:-1], out.shape[-1])

        return forward


def _signature(layers: list) -> tuple:
    """What the buffers are built from: each layer's adapters, their weight tensors (a reloaded adapter
    has new ones; the buffers hold the old ones, so their ids stay unique) and scales."""
    return tuple(
        (
            id(layer),
            tuple(
                (n, id(layer.lora_A[n].weight), id(layer.lora_B[n].weight), float(layer.scaling[n]))
                for n in sorted(layer.lora_A)
            ),
        )
        for layer in layers
    )


def _static(t: torch.Tensor) -> torch.Tensor:
    """``t``, marked as keeping its storage: a compiled step then reads it in place (no copy per replay).
    Unguarded: a compiled step does not guard on its identity, so another tensor of the same shape in its
    place (a rebuilt stack, a reallocated buffer) is re-recorded by the CUDA graph, not recompiled, and
    the compiled code holds no reference that would keep a freed buffer alive."""
    torch._dynamo.mark_static_address(t, guard=False)
    return t


def _device(model) -> torch.device:
    return next(model.parameters()).device
