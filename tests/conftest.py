"""Shared fixtures: the real model is resolved (and converted) once per test session; the suite's tiers
and time budget are checked by the plugin in ``suite_guards.py``."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

#: the suite's tiers and per-file time budget (tests/suite_guards.py)
pytest_plugins = ["suite_guards"]

THREADS = None  # torch's intra-op threads for this session, chosen in pytest_configure


def pytest_configure(config: pytest.Config) -> None:
    """Threads for the session's own process, as the ``udpo`` entry points choose them."""
    global THREADS
    from udpo.threads import ENV, available_cores, configure_threads

    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))  # pytest -n: the cores are shared
    if workers > 1:
        os.environ.setdefault(ENV, str(max(1, available_cores() // workers)))  # subprocesses inherit it
    THREADS = configure_threads()


def header_lines() -> list[str]:
    """The run's numeric path (the CPU, its matrix units, what ``dtype: auto`` picks; ``UDPO_DTYPE`` forces
    it, docs/testing.md) and torch's threads."""
    from udpo.env.backends.machine import describe_numeric_path

    return [describe_numeric_path(), f"torch threads: {THREADS.threads} ({THREADS.reason})"]


def pytest_report_header(config: pytest.Config) -> list[str]:
    return header_lines()


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    """Under ``-q`` pytest prints no header: the same lines are then the run's first."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and not reporter.showheader and not hasattr(session.config, "workerinput"):
        for line in header_lines():
            reporter.write_line(line)


@pytest.fixture(autouse=True)
def numeric_settings_left_alone():
    """A test leaves torch's process-wide numeric settings as it found them (autocast off, fp32 default
    dtype): a leak would turn later tests' fp32 comparisons into bf16 ones, on some runs' order only. A
    leaked setting is put back and fails the test that left it."""
    import torch

    yield
    leaked = []
    if torch.is_autocast_enabled("cpu"):
        leaked.append(f"CPU autocast to {torch.get_autocast_dtype('cpu')} on")
        torch.set_autocast_enabled("cpu", False)
    if torch.get_default_dtype() != torch.float32:
        leaked.append(f"default dtype {torch.get_default_dtype()}")
        torch.set_default_dtype(torch.float32)
    assert not leaked, f"the test left {', '.join(leaked)}"


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
def tokenizer_path(weightless_cache) -> str:
    """The default model's folder without its weights: config and tokenizer (what a tiny model needs)."""
    from udpo.env.models import DEFAULT_MODEL

    return str(weightless_cache / "models" / DEFAULT_MODEL)


@pytest.fixture(scope="session")
def tiny_model(tokenizer_path, tmp_path_factory) -> str:
    """A tiny random Llama (2 layers, hidden 32) with the real tokenizer, as a model folder: the trainer,
    rollout and checkpoint machinery of the real model at a fraction of its cost. Its weights (std 0.3)
    make greedy decoding say different things to different prompts; it never answers right."""
    from tiny_models import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("tiny_model"), tokenizer_path, initializer_range=0.3)


@pytest.fixture(scope="session")
def hf_backend(model_path):
    """One HF backend on the real model for the whole session, in fp32: the exactness tests (padding,
    batching, log-probs against a forward pass) compare to 1e-4, below bf16's resolution."""
    from udpo.env.backends.hf import HFBackend

    backend = HFBackend(model=model_path, dtype="fp32")
    yield backend
    backend.close()


def save_random_adapters(model: str, folder_for) -> dict[str, str]:
    """Two LoRA adapters (r=8, attention projections) on ``model`` with random non-zero B, drawn with
    different seeds, saved as PEFT folders (``folder_for(name)`` gives each one's): {"a": path, "b": path}."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    config = LoraConfig(
        r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], init_lora_weights=False
    )
    base = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    paths = {}
    for name, seed in (("a", 1), ("b", 2)):
        torch.manual_seed(seed)
        peft_model = get_peft_model(base, config)
        paths[name] = str(folder_for(name))
        peft_model.save_pretrained(paths[name])
        base = peft_model.unload()  # the plain base model again, for the next adapter
    return paths


@pytest.fixture(scope="session")
def lora_adapters(model_path, tmp_path_factory) -> dict[str, str]:
    """Two random LoRA adapters on the real model (:func:`save_random_adapters`)."""
    return save_random_adapters(model_path, lambda name: tmp_path_factory.mktemp(f"lora_{name}"))


@pytest.fixture(scope="session")
def tiny_lora_adapters(tiny_model, tmp_path_factory) -> dict[str, str]:
    """Two random LoRA adapters on the tiny model (:func:`save_random_adapters`)."""
    return save_random_adapters(tiny_model, lambda name: tmp_path_factory.mktemp(f"tiny_lora_{name}"))


@pytest.fixture(scope="module")
def vllm_backend(model_path):
    """One offline vLLM engine (LoRA enabled, 4 adapters per batch) for one test file: it starts once and
    stops when the file is done (an idle vLLM CPU worker keeps polling and slows what runs after it)."""
    pytest.importorskip("vllm")
    from vllm_helpers import VLLM_TEST_OPTIONS, engine_dtype

    from udpo.env.backends.vllm import VLLMBackend

    backend = VLLMBackend(model=model_path, dtype=engine_dtype(), **VLLM_TEST_OPTIONS)
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def hf_with_adapters(model_path, lora_adapters):
    """An fp32 HF backend on the real model with adapters a and b, for one test file (its own model: the
    shared hf_backend stays plain); the vLLM tests compare against it."""
    from udpo.env.backends.hf import HFBackend

    backend = HFBackend(model=model_path, dtype="fp32")
    for name, path in lora_adapters.items():
        backend.load_adapter(name, path)
    yield backend
    backend.close()
