"""Errors that stop training, with what to change."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from udpo.config import TrainConfig


class TrainingError(RuntimeError):
    """Training cannot go on (non-finite loss, out of memory, a run directory in the way)."""


@contextmanager
def explain_oom(config: TrainConfig) -> Iterator[None]:
    """Re-raise a CUDA out-of-memory error with the settings that lower memory use."""
    try:
        yield
    except torch.cuda.OutOfMemoryError as e:
        raise TrainingError(
            f"out of GPU memory ({str(e).splitlines()[0] if str(e) else 'no details'}). To fit: lower "
            f"questions_per_iteration (now {config.questions_per_iteration}) or max_tokens (now "
            f"{config.max_tokens}); raise gradient_accumulation_steps (now {_now(config.gradient_accumulation_steps)}) "
            f"or lower logprob_token_budget (now {_now(config.logprob_token_budget)}); set gradient_checkpointing: true "
            f"(now {_now(config.gradient_checkpointing)}); with backend: vllm set a lower "
            f"vllm_gpu_memory_utilization (now {config.vllm_gpu_memory_utilization or 'unset: 0.9'})"
        ) from e


def non_finite_error(iteration: int, what: str, info: Mapping[str, Any], saved: Path) -> TrainingError:
    """The error that stops a run at a non-finite value: what was non-finite at ``iteration`` (``info``:
    the values beside it), and checkpoint ``saved`` of the state before it, to continue from."""
    details = ", ".join(f"{k}={float(v):.4g}" for k, v in info.items())
    return TrainingError(
        f"non-finite value at iteration {iteration}: {what}{f' ({details})' if details else ''}. "
        f"The state before this iteration is in {saved}. Lower learning_rate, check the rewards, or raise "
        f"max_grad_norm clipping; continue with --resume {saved}"
    )


def _now(value: object) -> str:
    """A setting's value as a recipe writes it; ``auto`` for one not yet sized (null)."""
    return "auto" if value is None else str(value).lower()
