"""The openai backend against a real local vLLM server (the real SmolLM2-135M-Instruct, LoRA adapters
loaded at run time), checked against the fp32 hf backend with the same adapters."""

from __future__ import annotations

import json
import shutil

import pytest
from vllm_helpers import POEM, QUESTION, VLLM_TEST_OPTIONS, engine_dtype, logprob_gap_bound, mean_abs_diff

from udpo.env.backends import BackendError, ChatRequest, SamplingParams

pytestmark = [pytest.mark.slow, pytest.mark.vllm]


@pytest.fixture(scope="module")
def vllm_server(model_path) -> str:
    """The OpenAI base URL of a local vLLM server (LoRA enabled, runtime adapter loading allowed),
    started once for this file on a free port and terminated at its end."""
    pytest.importorskip("vllm")
    from udpo.env.backends.vllm_server import VLLMServer

    server = VLLMServer(
        model=model_path,
        served_model_name="smollm2",
        extra_args=("--dtype", engine_dtype()),
        **VLLM_TEST_OPTIONS,
    )
    server.start()
    yield server.url
    server.stop()


@pytest.fixture(scope="module")
def remote(vllm_server, lora_adapters):
    from udpo.env.backends.openai import OpenAIBackend

    backend = OpenAIBackend(base_url=vllm_server, timeout=60, max_concurrency=8)
    for name, path in lora_adapters.items():
        backend.load_adapter(name, path)
    yield backend
    backend.close()


def test_openai_backend_on_vllm_server(remote, hf_with_adapters):
    assert remote.is_vllm and remote.model == "smollm2"
    assert set(remote.adapters) >= {"a", "b"}
    adapters = [None, "a", "b"]
    for temperature in (1.0, 0.7):
        sampling = SamplingParams(temperature=temperature, max_tokens=20, seed=5)
        out = remote.generate([ChatRequest(QUESTION, sampling, adapter=name) for name in adapters])
        for c, name in zip(out, adapters, strict=True):
            assert c.prompt_ids == hf_with_adapters.encode(QUESTION)  # the server renders the same template
            assert 0 < len(c.completion_ids) == len(c.logprobs) <= 20
            assert c.finish_reason in ("stop", "length")
            if temperature == 1.0:  # the adapter's own model: they match its scores in the hf backend
                scored = hf_with_adapters.completion_logprobs(c.prompt_ids, c.completion_ids, name)
                assert mean_abs_diff(c.logprobs, scored) < logprob_gap_bound(), name
            else:  # the server reports the sampling distribution's log-probs (processed_logprobs)
                scored = hf_with_adapters.completion_logprobs(
                    c.prompt_ids, c.completion_ids, name, temperature
                )
                assert mean_abs_diff(c.logprobs, scored) < 0.1, name


def test_openai_backend_replaces_an_adapter_at_run_time(remote, hf_with_adapters, lora_adapters, tmp_path):
    def served_as() -> str:
        """Which local adapter the server's "swap" matches, judged by the log-probs it returns."""
        (c,) = remote.generate(
            [ChatRequest(POEM, SamplingParams(temperature=1.0, max_tokens=16), adapter="swap")]
        )
        gaps = {
            n: mean_abs_diff(
                c.logprobs, hf_with_adapters.completion_logprobs(c.prompt_ids, c.completion_ids, n)
            )
            for n in "ab"
        }
        assert min(gaps.values()) < logprob_gap_bound() < max(gaps.values()), gaps
        return min(gaps, key=gaps.get)

    remote.load_adapter("swap", lora_adapters["a"])
    assert served_as() == "a"
    copy_b = tmp_path / "b_v2"  # a new version goes to a new folder
    shutil.copytree(lora_adapters["b"], copy_b)
    remote.load_adapter("swap", str(copy_b))
    assert served_as() == "b"


def test_openai_backend_unknown_adapter_fails_without_retrying(remote):
    with pytest.raises(BackendError, match=r"chat/completions failed: HTTP 404"):
        remote.generate([ChatRequest(QUESTION, adapter="missing")])


def test_autotransform_attacker_served_over_http(vllm_server, tmp_path):
    from udpo.env.attacks import AttackConfig, attacker_backend, transform_profile

    config = AttackConfig(
        name="autotransform", attacker="smollm2", attacker_backend="openai", attacker_base_url=vllm_server,
        max_tokens=96,
    )  # fmt: skip
    assert config.describe()["attacker_base_url"] == vllm_server
    with attacker_backend(config, team_backend=None) as attacker:
        assert attacker.model == "smollm2"
        made = transform_profile(
            "You are a careful math tutor.", "gsm8k", attacker, config.attacker, sampling=config.sampling(),
            cache_root=tmp_path,
        )  # fmt: skip
    assert made.source == "attacker" and made.profile.strip()
    record = json.loads(open(made.path).read())
    assert record["attacker_model"] == "smollm2" and record["malicious_profile"] == made.profile
