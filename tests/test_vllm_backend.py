"""The vllm backend (offline engine): the real SmolLM2-135M-Instruct on vLLM's CPU build, with two random
LoRA adapters (``lora_adapters``) served in the same batch as the base model. The trainer's updates
reaching the engine and an exported adapter served: tests/test_vllm_sync.py; the OpenAI-compatible
server: tests/test_vllm_server.py.
"""

from __future__ import annotations

import json
import shutil

import pytest
from vllm_helpers import POEM, QUESTION, mean_abs_diff

from udpo.env.backends import BackendError, ChatRequest, SamplingParams

pytestmark = [pytest.mark.slow, pytest.mark.vllm]


@pytest.fixture(scope="module")
def served(vllm_backend, lora_adapters):
    """vllm_backend with adapters a and b registered."""
    for name, path in lora_adapters.items():
        vllm_backend.load_adapter(name, path)
    return vllm_backend


@pytest.fixture(scope="module")
def fixed_completion(vllm_backend) -> list[int]:
    """A completion of QUESTION the tests score under every model (greedy from the base model)."""
    (c,) = vllm_backend.generate([ChatRequest(QUESTION, SamplingParams(temperature=0.0, max_tokens=24))])
    assert len(c.completion_ids) > 5
    return c.completion_ids


def test_one_batch_serves_base_and_two_adapters(served, hf_with_adapters):
    adapters = [None, "a", "b"] * 2
    sampling = SamplingParams(temperature=1.0, max_tokens=24, seed=3)
    requests = [ChatRequest(QUESTION, sampling, adapter=name) for name in adapters]
    out = served.generate(requests)
    assert len(out) == len(requests)
    expected_prompt = hf_with_adapters.encode(QUESTION)
    for c in out:
        assert c.prompt_ids == expected_prompt  # the chat template as the model saw it, same as hf
        assert 0 < len(c.completion_ids) == len(c.logprobs) <= 24
        assert all(lp <= 0.0 for lp in c.logprobs)
        assert c.finish_reason in ("stop", "length")
        assert c.finish_reason == "stop" or len(c.completion_ids) == 24
        assert c.text == served.tokenizer.decode(c.completion_ids, skip_special_tokens=True)
    # the behavior log-probs come from the row's own adapter: sampled at temperature 1 (where the sampling
    # distribution is the model's own), they match the log-probs of the same tokens scored afterwards
    # under that adapter (vLLM scores prompts at temperature 1). The first token
    # (prefill in both) matches exactly; later tokens drift by bf16 noise once finished rows leave the
    # batch (up to ~0.02 mean measured on CPU), far below the gap to any other adapter (0.3 to 1.5)
    models = (None, "a", "b")
    for c, name in zip(out[:3], adapters[:3], strict=True):  # one row of each (their copies: the same code)
        scored = {m: served.completion_logprobs(c.prompt_ids, c.completion_ids, adapter=m) for m in models}
        assert abs(c.logprobs[0] - scored[name][0]) < 1e-3, name
        own = mean_abs_diff(c.logprobs, scored[name])
        assert own < 0.05, name
        assert all(5 * own < mean_abs_diff(c.logprobs, scored[m]) for m in models if m != name), name


def test_sampled_logprobs_are_at_the_sampling_temperature(served, hf_with_adapters):
    # sampled at 0.7, each token's log-prob is log-softmax(logits / 0.7) under the row's own adapter: it
    # matches the fp32 hf scores at 0.7 within bf16 rounding, and temperature-1 scores are far off
    adapters = [None, "a", "b"]
    out = served.generate(
        [
            ChatRequest(POEM, SamplingParams(temperature=0.7, max_tokens=24, seed=9), adapter=n)
            for n in adapters
        ]
    )
    for c, name in zip(out, adapters, strict=True):
        at_t = hf_with_adapters.completion_logprobs(c.prompt_ids, c.completion_ids, name, temperature=0.7)
        at_1 = hf_with_adapters.completion_logprobs(c.prompt_ids, c.completion_ids, name)
        own = mean_abs_diff(c.logprobs, at_t)
        assert own < 0.1, name
        assert 2 * own < mean_abs_diff(c.logprobs, at_1), name
    with pytest.raises(BackendError, match="temperature 1 only"):
        served.completion_logprobs(QUESTION, [1, 2], temperature=0.7)


def test_base_rows_beside_a_full_set_of_adapters_stay_base(served, lora_adapters):
    # vLLM's CPU LoRA ops read "no adapter" as the last adapter slot (vllm-project/vllm#48421): with
    # every slot (max_loras=4) holding an adapter, the base row of a mixed batch must still be the base
    served.load_adapter("a2", lora_adapters["a"])
    served.load_adapter("b2", lora_adapters["b"])
    greedy = SamplingParams(temperature=0.0, max_tokens=16)
    mixed = served.generate([ChatRequest(QUESTION, greedy, adapter=n) for n in ("a", "b", None, "a2", "b2")])
    # each row's log-probs are those of its own model scored afterwards, far from the last slot's (b2):
    # no comparison of tokens between batches, whose sums run in another order (a near tie may flip)
    for row, own in ((2, None), (3, "a")):  # the base row; a2, a copy of a, served as a
        c = mixed[row]
        scored = {
            m: served.completion_logprobs(c.prompt_ids, c.completion_ids, adapter=m) for m in (own, "b2")
        }
        assert mean_abs_diff(c.logprobs, scored[own]) < 0.05, row
        assert 5 * mean_abs_diff(c.logprobs, scored[own]) < mean_abs_diff(c.logprobs, scored["b2"]), row


def test_adapters_change_the_log_probs(served, fixed_completion):
    scores = {
        name: served.completion_logprobs(QUESTION, fixed_completion, adapter=name)
        for name in (None, "a", "b")
    }
    assert all(len(s) == len(fixed_completion) for s in scores.values())
    assert mean_abs_diff(scores[None], scores["a"]) > 0.01
    assert mean_abs_diff(scores[None], scores["b"]) > 0.01
    assert mean_abs_diff(scores["a"], scores["b"]) > 0.01


def test_log_probs_match_the_hf_backend(served, hf_with_adapters, fixed_completion):
    # vLLM runs the bf16 checkpoint, hf runs fp32: agreement within bf16 rounding, for base and adapters
    for name in (None, "a", "b"):
        ours = served.completion_logprobs(QUESTION, fixed_completion, adapter=name)
        theirs = hf_with_adapters.completion_logprobs(QUESTION, fixed_completion, adapter=name)
        assert mean_abs_diff(ours, theirs) < 0.1, name


def test_replacing_an_adapter_gives_a_new_id_and_new_weights(served, lora_adapters, fixed_completion):
    base_before = served.completion_logprobs(QUESTION, fixed_completion)
    score_a = served.completion_logprobs(QUESTION, fixed_completion, adapter="a")
    score_b = served.completion_logprobs(QUESTION, fixed_completion, adapter="b")
    served.load_adapter("policy", lora_adapters["a"])
    first_id = served.lora_id("policy")
    assert served.completion_logprobs(QUESTION, fixed_completion, adapter="policy") == pytest.approx(
        score_a, abs=1e-4
    )
    served.load_adapter("policy", lora_adapters["b"])
    assert served.lora_id("policy") > first_id
    assert served.completion_logprobs(QUESTION, fixed_completion, adapter="policy") == pytest.approx(
        score_b, abs=1e-4
    )
    # same folder again (a trainer overwriting its checkpoint): still a new id, no stale cache
    served.load_adapter("policy", lora_adapters["a"])
    assert served.completion_logprobs(QUESTION, fixed_completion, adapter="policy") == pytest.approx(
        score_a, abs=1e-4
    )
    assert served.completion_logprobs(QUESTION, fixed_completion) == pytest.approx(base_before, abs=1e-4)
    assert "policy" in served.adapters


def test_seeded_batches_repeat_and_identical_prompts_still_differ(served):
    requests = [ChatRequest(POEM, SamplingParams(temperature=1.0, max_tokens=24, seed=11)) for _ in range(3)]
    first = [c.completion_ids for c in served.generate(requests)]
    # exact: the same batch on the same engine, the same kernels in the same order
    assert [c.completion_ids for c in served.generate(requests)] == first
    assert len({tuple(ids) for ids in first}) > 1


def test_seeded_batch_larger_than_one_prefill_step(served):
    # distinct long prompts overflow one step's token budget; with seeds this crashed vLLM's CPU
    # engine under chunked prefill, which the backend turns off on CPU
    filler = " ".join(f"item{k}" for k in range(150))
    requests = [
        ChatRequest([{"role": "user", "content": f"List {q}: {filler}. Which item comes first?"}],
                    SamplingParams(max_tokens=4, seed=q))
        for q in range(8)
    ]  # fmt: skip
    out = served.generate(requests)
    assert sum(len(c.prompt_ids) for c in out) > 2048 and all(c.completion_ids for c in out)


def test_vllm_errors_are_clear(served, lora_adapters, tmp_path):
    with pytest.raises(BackendError, match="'nope' is not loaded"):
        served.generate([ChatRequest(QUESTION, adapter="nope")])
    with pytest.raises(BackendError, match="not a PEFT adapter folder"):
        served.load_adapter("bad", str(tmp_path))
    wide = tmp_path / "wide"
    shutil.copytree(lora_adapters["a"], wide)
    config = json.loads((wide / "adapter_config.json").read_text())
    (wide / "adapter_config.json").write_text(json.dumps({**config, "r": 64}))
    with pytest.raises(BackendError, match="rank 64 > max_lora_rank=16"):
        served.load_adapter("wide", str(wide))
    with pytest.raises(BackendError, match="max_model_len"):
        served.generate([ChatRequest([{"role": "user", "content": "word " * 3000}])])
    with pytest.raises(BackendError, match="serves"):
        served.generate([ChatRequest(QUESTION, model="some/other-model")])
    assert "bad" not in served.adapters and "wide" not in served.adapters
