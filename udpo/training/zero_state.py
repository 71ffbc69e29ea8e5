"""A DeepSpeed (ZeRO-1/2/3) run's optimizer state in the project's own checkpoint format.

ZeRO partitions the fp32 master weights and AdamW's moments over the processes; DeepSpeed's own
checkpoint pickles each process's slice. Here every slice is gathered instead
(``deepspeed.utils.safe_get_full_optimizer_state`` / ``safe_get_full_fp32_param``) into what torch's
``AdamW.state_dict()`` holds for the same parameters (one group per adapter, ``step``, ``exp_avg``,
``exp_avg_sq`` per parameter), plus the full fp32 master weights, so that
:func:`udpo.training.checkpoint_store.save_state` writes them as JSON and safetensors. :func:`restore`
scatters them back with the ``safe_set_full_*`` twins into whatever partitioning the resuming run has:
another number of processes, another ZeRO stage, or no DeepSpeed at all (which loads the optimizer
state as torch's own).

Gathering and restoring are collectives: every process calls them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

#: AdamW's per-parameter moments, in the order torch's state_dict lists them
MOMENTS = ("exp_avg", "exp_avg_sq")


def gather(updater) -> tuple[dict[str, Any], dict[str, list[torch.Tensor]]]:
    """The engine's optimizer state as torch's ``AdamW.state_dict()`` of the run's groups (parameters
    numbered group after group, as torch numbers them), and adapter -> its full fp32 master weights.

    Before the first optimizer step AdamW has no moments yet: ``state`` is then empty, as torch's is."""
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    zero = updater.engine.optimizer
    inner, flats = zero.optimizer, _flat_partitions(zero)
    _link_fragments(zero)
    state: dict[int, dict[str, torch.Tensor]] = {}
    groups, masters, index = [], {}, 0
    for (adapter, params), group, own in zip(updater.groups.items(), inner.param_groups, flats, strict=True):
        numbers = list(range(index, index + len(params)))
        index += len(params)
        groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": numbers})
        masters[adapter] = [safe_get_full_fp32_param(p).detach().cpu() for p in params]
        step = _step(inner, own)
        if step is None:
            continue
        for number, p in zip(numbers, params, strict=True):
            state[number] = {"step": step.detach().cpu().clone()}
            for key in MOMENTS:
                state[number][key] = safe_get_full_optimizer_state(p, key).detach().cpu()
    return {"state": state, "param_groups": groups}, masters


def restore(
    updater, optimizer_state: dict[str, Any], masters: dict[str, Sequence[torch.Tensor]] | None
) -> None:
    """Scatter a state that :func:`gather` (or torch's ``AdamW.state_dict()``) gave into the engine.

    masters: adapter -> its fp32 master weights; None (a checkpoint written without DeepSpeed) takes them
    from the parameters as the adapters were loaded. Each group's settings (learning rate, betas, ...)
    come back as torch's ``load_state_dict`` brings them back."""
    from deepspeed.utils import safe_set_full_fp32_param, safe_set_full_optimizer_state

    from udpo.training import distributed as dist

    zero = updater.engine.optimizer
    inner, flats = zero.optimizer, _flat_partitions(zero)
    _start_moments(zero, flats)
    saved_groups = optimizer_state["param_groups"]
    for (adapter, params), group, own, saved in zip(
        updater.groups.items(), inner.param_groups, flats, saved_groups, strict=True
    ):
        if masters is None:
            with dist.gathered(params):
                weights = [p.detach().float().clone() for p in params]
        else:
            weights = list(masters[adapter])
        steps = set()
        for number, p, weight in zip(saved["params"], params, weights, strict=True):
            safe_set_full_fp32_param(p, weight.to(p.device, torch.float32))
            entry = optimizer_state["state"].get(number)
            steps.add(None if entry is None else float(entry["step"]))
            for key in MOMENTS:
                value = torch.zeros_like(weight) if entry is None else entry[key]
                safe_set_full_optimizer_state(p, value.to(p.device, torch.float32), key)
        if len(steps) > 1:
            raise ValueError(
                f"the optimizer state of {adapter} has parameters at different steps {sorted(steps, key=str)}"
            )
        (step,) = steps
        for flat in own:
            inner.state[flat]["step"].fill_(step or 0.0)
        group.update({k: v for k, v in saved.items() if k != "params"})


def _flat_partitions(zero) -> list[list[torch.Tensor]]:
    """Per group of the run (one per adapter): this process's flat fp32 partitions, the tensors the
    torch optimizer inside ZeRO steps and keys its state by. ZeRO-3 lists them by sub-group (its groups'
    ``params`` are empty between steps); ZeRO-1/2 keeps one per group in the group."""
    inner = zero.optimizer
    if hasattr(zero, "fp32_partitioned_groups_flat"):  # ZeRO-3
        out: list[list[torch.Tensor]] = [[] for _ in inner.param_groups]
        for sub, flat in enumerate(zero.fp32_partitioned_groups_flat):
            out[zero.sub_group_to_group_id[sub]].append(flat)
        return out
    return [list(group["params"]) for group in inner.param_groups]


def _step(inner: torch.optim.Optimizer, flats: list[torch.Tensor]) -> torch.Tensor | None:
    """A group's AdamW step count (kept with each of its ``flats``), or None before its first step."""
    for flat in flats:
        entry = inner.state.get(flat)
        if entry and "step" in entry:
            return entry["step"]
    return None


def _start_moments(zero, flats: list[list[torch.Tensor]]) -> None:
    """Give every flat partition AdamW's state (zeros) where it has none yet, as AdamW's first step
    would (it keeps a state it finds), and point ZeRO-1/2's per-parameter views at it."""
    inner = zero.optimizer
    for group, own in zip(inner.param_groups, flats, strict=True):
        for flat in own:
            entry = inner.state[flat]
            if "step" not in entry:
                entry["step"] = torch.tensor(0.0)
            for key in (*MOMENTS, *(["max_exp_avg_sq"] if group.get("amsgrad") else [])):
                if key not in entry:
                    entry[key] = torch.zeros_like(flat, memory_format=torch.preserve_format)
    _link_fragments(zero)


def _link_fragments(zero) -> None:
    """Point ZeRO-1/2's per-parameter views (what ``safe_*_full_optimizer_state`` read and write) at
    every group's AdamW state. DeepSpeed links them once, right after the first group's first step, when
    the later groups (here: the other adapters) have no state yet, and never again; ZeRO-3 reads the
    state by partition each time."""
    if hasattr(zero, "_lazy_init_hp_params_optimizer_state"):  # ZeRO-1/2
        zero._hp_optimizer_states_linked = False
        zero._lazy_init_hp_params_optimizer_state()
