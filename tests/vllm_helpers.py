"""What the tests of real vLLM engines share (tests/test_vllm_backend.py and tests/test_vllm_sync.py: the
offline engine, the ``vllm_backend`` fixture of tests/conftest.py; tests/test_vllm_server.py: the
OpenAI-compatible server): the prompts, the engines' settings, a distance."""

from __future__ import annotations

import numpy as np

QUESTION = [{"role": "user", "content": "What is 7 + 5? Put the final answer in \\boxed{}."}]
POEM = [{"role": "user", "content": "Write two lines about the sea."}]


def mean_abs_diff(x: list[float], y: list[float]) -> float:
    assert len(x) == len(y) > 0
    return float(np.mean(np.abs(np.asarray(x) - np.asarray(y))))


# vLLM engines on CPU reserve their KV cache up front: 1 GiB each keeps the offline engine and the server
# small. Each engine serves the tests of one file (module-scoped fixtures), so it starts once and stops when
# its file is done: an idle vLLM CPU worker keeps polling, and would slow every later test on its core.
VLLM_TEST_OPTIONS = {"max_loras": 4, "max_lora_rank": 16, "kv_cache_gib": 1.0, "max_model_len": 2048}


def engine_dtype() -> str:
    """The precision the trainer picks on this CPU (``dtype: auto``): bf16 where the cores have bf16 units,
    else fp32 (vLLM's own "auto" takes the checkpoint's bf16, emulated and about 4x slower there)."""
    import torch

    from udpo.env.backends.machine import pick_dtype

    return "bfloat16" if pick_dtype("auto", "cpu") == torch.bfloat16 else "float32"


def logprob_gap_bound() -> float:
    """How far (mean nats per token, at temperature 1) the engine's log-probs of sampled tokens may lie from
    the fp32 hf backend's scores of the same tokens under the same adapter, for the engine's dtype
    (:func:`engine_dtype`): rounding alone, far below the gap to another adapter (0.3 to 1.5). 0.05 for an
    fp32 engine; 0.1 for a bf16 one (measured up to 0.06 on 16 tokens of a poem, issue 48)."""
    return 0.1 if engine_dtype() == "bfloat16" else 0.05
