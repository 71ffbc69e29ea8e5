"""The hf backend on the real SmolLM2 model: batching, token ids, log-probs, per-row adapters."""

from __future__ import annotations

import pytest
import torch
from rounding import CallLog, assert_same_row, scored_bound, steps_of

from udpo.env.backends import BackendError, ChatRequest, SamplingParams
from udpo.env.backends.hf import HFBackend

pytestmark = [pytest.mark.slow, pytest.mark.numeric]

GREEDY = SamplingParams(temperature=0.0, max_tokens=12)


def ask(text: str, sampling=GREEDY, adapter=None) -> ChatRequest:
    return ChatRequest(messages=[{"role": "user", "content": text}], sampling=sampling, adapter=adapter)


def same_greedy_rows(model, batched, batch_call, rows, singles, single_calls) -> None:
    """Each request's reply in a batch (its row ``rows[k]`` of ``batch_call``) against the same request
    alone: a padded batch sums in another order, so greedy tokens are equal unless the top-2 gap is
    within rounding (:func:`rounding.assert_same_row`); a reply that never parts is the same text."""
    for k, (b, s) in enumerate(zip(batched, singles, strict=True)):
        columns = max(batch_call.columns, single_calls[k].columns)
        parted, _ = assert_same_row(
            s, b, steps_of(single_calls[k].draws, 0), steps_of(batch_call.draws, rows[k]),
            model.config, model.dtype, columns,
        )  # fmt: skip
        assert parted or b.text == s.text


def test_batch_matches_single_requests(hf_backend, monkeypatch):
    reqs = [ask("What is 2+3?"), ask("Name a color."), ask("What is 7*6? Answer briefly.")]
    calls = CallLog(monkeypatch)
    batched = hf_backend.generate(reqs)
    single = [hf_backend.generate([r])[0] for r in reqs]
    batch_call, *single_calls = calls.take_calls()
    order = sorted(range(len(reqs)), key=lambda k: len(batched[k].prompt_ids))  # the call's rows
    rows = [order.index(k) for k in range(len(reqs))]
    same_greedy_rows(hf_backend.model, batched, batch_call, rows, single, single_calls)
    for req, b in zip(reqs, batched, strict=True):
        assert len(b.logprobs) == len(b.completion_ids) > 0
        assert all(lp <= 0 for lp in b.logprobs)
        assert b.prompt_ids == hf_backend.encode(req.messages)


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_logprobs_are_those_of_the_sampling_distribution(hf_backend, temperature):
    """Recorded log-probs equal log-softmax(logits / T) of a teacher-forced forward pass over prompt +
    completion, T the sampling temperature (the distribution the tokens were drawn from)."""
    sampling = SamplingParams(temperature=temperature, max_tokens=10, seed=1)
    c = hf_backend.generate([ask("Say hello.", sampling)])[0]
    ids = torch.tensor([c.prompt_ids + c.completion_ids])
    with torch.no_grad():
        logits = hf_backend.model(ids).logits[0, len(c.prompt_ids) - 1 : -1].float()
    chosen = torch.tensor(c.completion_ids)[:, None]
    ref = torch.log_softmax(logits / temperature, -1).gather(-1, chosen).squeeze(-1)
    bound = scored_bound(hf_backend.model, [ids[0].tolist()], temperature)  # a KV-cache loop vs one pass
    assert torch.allclose(ref, torch.tensor(c.logprobs), rtol=0, atol=bound)
    scored = hf_backend.completion_logprobs(c.prompt_ids, c.completion_ids, temperature=temperature)
    assert torch.allclose(ref, torch.tensor(scored), rtol=0, atol=bound)
    if temperature != 1.0:  # temperature-1 log-probs of the same tokens are a different distribution
        raw = torch.log_softmax(logits, -1).gather(-1, chosen).squeeze(-1)
        assert (raw - ref).abs().max() > 0.05


def test_greedy_logprobs_are_at_temperature_one(hf_backend):
    c = hf_backend.generate([ask("Say hello.")])[0]
    scored = hf_backend.completion_logprobs(c.prompt_ids, c.completion_ids)
    assert c.logprobs == pytest.approx(
        scored, abs=scored_bound(hf_backend.model, [c.prompt_ids + c.completion_ids])
    )


def test_chat_template_kwargs_reach_the_template(hf_backend):
    # SmolLM2's template has no variables to set; a template that reads one shows it arrives
    tok = hf_backend.tokenizer
    saved = tok.chat_template
    tok.chat_template = "{% if loud %}LOUD {% endif %}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    try:
        from udpo.env.backends.chat import chat_prompt_ids

        msgs = [{"role": "user", "content": "hi"}]
        assert tok.decode(chat_prompt_ids(tok, msgs, {"loud": True})) == "LOUD hi"
        assert tok.decode(chat_prompt_ids(tok, msgs)) == "hi"
        backend = HFBackend(model_obj=hf_backend.model, tokenizer=tok, chat_template_kwargs={"loud": True})
        assert tok.decode(backend.encode(msgs)) == "LOUD hi"
    finally:
        tok.chat_template = saved


def test_mixed_adapters_in_one_batch(model_path, tmp_path, monkeypatch):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    paths = {}
    for seed, name in [(1, "a"), (2, "b")]:
        torch.manual_seed(seed)
        base = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        cfg = LoraConfig(r=4, lora_alpha=32, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
        get_peft_model(base, cfg).save_pretrained(tmp_path / name)
        paths[name] = str(tmp_path / name)
    backend = HFBackend(model=model_path, dtype="fp32")  # fp32: compared to fp32's rounding bound
    for name, path in paths.items():
        backend.load_adapter(name, path)
    assert sorted(backend.adapters) == ["a", "b"]
    prompt = "What is 4+4?"
    calls = CallLog(monkeypatch)
    outs = backend.generate([ask(prompt), ask(prompt, adapter="a"), ask(prompt, adapter="b")])
    alone = [backend.generate([ask(prompt, adapter=n)])[0] for n in (None, "a", "b")]
    # each row was served by its own adapter: the mixed batch equals the one-adapter batches
    batch_call, *single_calls = calls.take_calls()
    same_greedy_rows(backend.model, outs, batch_call, [0, 1, 2], alone, single_calls)
    assert (
        len({tuple(o.completion_ids) for o in outs}) > 1 or len({round(o.logprobs[0], 4) for o in outs}) == 3
    )
    with pytest.raises(BackendError, match="not loaded"):
        backend.generate([ask(prompt, adapter="missing")])
    backend.close()
