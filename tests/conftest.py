"""Shared fixtures: the real model is resolved (and converted) once per test session."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

SHARED_DATA = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data"))


@pytest.fixture(scope="session")
def shared_data() -> str:
    """The ../shared/data folder beside the checkout (as in CI)."""
    if not os.path.isdir(SHARED_DATA):
        pytest.skip(f"{SHARED_DATA} not present")
    return SHARED_DATA


@pytest.fixture(scope="session")
def model_path() -> str:
    """SmolLM2-135M-Instruct as a safetensors folder (converted from the packaged GGUF once)."""
    from udpo.env.models import resolve_model

    return resolve_model("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def hf_backend(model_path):
    """One HF backend on the real model for the whole session."""
    from udpo.env.backends.hf import HFBackend

    backend = HFBackend(model=model_path)
    yield backend
    backend.close()
