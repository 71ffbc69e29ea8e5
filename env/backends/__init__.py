"""Inference backends behind one interface: ``hf``, ``vllm``, ``openai``, ``scripted``."""

from __future__ import annotations

import importlib

from .base import Backend, BackendError, ChatRequest, Completion, SamplingParams, ScoreRequest

_BACKENDS = {
    "hf": ("udpo.env.backends.hf", "HFBackend"),
    "vllm": ("udpo.env.backends.vllm", "VLLMBackend"),
    "openai": ("udpo.env.backends.openai", "OpenAIBackend"),
    "scripted": ("udpo.env.backends.scripted", "ScriptedBackend"),
}

BACKEND_NAMES = tuple(_BACKENDS)


def make_backend(name: str, **kwargs) -> Backend:
    """Build the backend ``name`` (one of BACKEND_NAMES) with its keyword arguments."""
    if name not in _BACKENDS:
        raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(BACKEND_NAMES)}")
    module, cls = _BACKENDS[name]
    return getattr(importlib.import_module(module), cls)(**kwargs)


__all__ = [
    "Backend",
    "BackendError",
    "ChatRequest",
    "Completion",
    "SamplingParams",
    "ScoreRequest",
    "make_backend",
    "BACKEND_NAMES",
]
