"""Inference backends behind one interface: ``hf``, ``vllm``, ``openai``, ``scripted``."""

from __future__ import annotations

import importlib

from .base import Backend, BackendError, Capabilities, ChatRequest, Completion, SamplingParams, ScoreRequest

#: name -> (module, class, what the engine can do): the capabilities are read here, without importing the
#: engine (torch, vLLM), and each class declares the same object as its own
_BACKENDS = {
    "hf": ("udpo.env.backends.hf", "HFBackend", Capabilities(serves_live_model=True, returns_logits=True)),
    "vllm": ("udpo.env.backends.vllm", "VLLMBackend", Capabilities(fixed_context=True)),
    "openai": (
        "udpo.env.backends.openai",
        "OpenAIBackend",
        Capabilities(remote=True, serves_several_models=True),
    ),
    "scripted": ("udpo.env.backends.scripted", "ScriptedBackend", Capabilities()),
}

BACKEND_NAMES = tuple(_BACKENDS)


def _entry(name: str) -> tuple[str, str, Capabilities]:
    if name not in _BACKENDS:
        raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(BACKEND_NAMES)}")
    return _BACKENDS[name]


def backend_capabilities(name: str) -> Capabilities:
    """What the backend ``name`` (one of BACKEND_NAMES) can do, for code that has only its name."""
    return _entry(name)[2]


def make_backend(name: str, **kwargs) -> Backend:
    """Build the backend ``name`` (one of BACKEND_NAMES) with its keyword arguments."""
    module, cls, _ = _entry(name)
    return getattr(importlib.import_module(module), cls)(**kwargs)


#: the settings the ``udpo`` commands (flags) and training (config fields of the same names) give a backend,
#: and the backends that take each one
SHARED_SETTINGS: dict[str, tuple[str, ...]] = {
    "model": ("hf", "vllm", "openai"),
    "dtype": ("hf", "vllm"),
    "device": ("hf",),
    "seed": ("vllm",),
    "base_url": ("openai",),
    "api_key": ("openai",),
    "chat_template_kwargs": ("hf", "vllm", "openai"),
}


def backend_from_settings(
    name: str,
    *,
    model: str | None = None,
    dtype: str | None = None,
    device: str | None = None,
    seed: int | None = None,
    base_url: str | None = None,
    api_key: str | None = None,
    chat_template_kwargs: dict | None = None,
    **options,
) -> Backend:
    """Build the backend ``name`` from the shared settings (:data:`SHARED_SETTINGS`): each goes to the
    backends that take it, and one left None (or not taken by ``name``) leaves that backend's default.
    ``options`` go to the backend as they are (a vLLM engine's sizes, ...). The one builder behind the
    commands' ``--backend`` (``udpo.cli.common.backend_from_args``), training's vllm and openai rollout
    engines (training's hf rollouts wrap the live PEFT model instead) and an attack's attacker model."""
    settings = {
        "model": model,
        "dtype": dtype,
        "device": device,
        "seed": seed,
        "base_url": base_url,
        "api_key": api_key,
        "chat_template_kwargs": chat_template_kwargs,
    }
    taken = {k: v for k, v in settings.items() if v is not None and name in SHARED_SETTINGS[k]}
    return make_backend(name, **taken, **options)


__all__ = [
    "Backend",
    "BackendError",
    "Capabilities",
    "ChatRequest",
    "Completion",
    "SamplingParams",
    "ScoreRequest",
    "backend_capabilities",
    "make_backend",
    "backend_from_settings",
    "BACKEND_NAMES",
    "SHARED_SETTINGS",
]
