"""Debate protocols through the real model code: a DIGRA debate of the real SmolLM2 model with controlled
injection from the command line and its woozle report (slow); on a tiny random model of the same code
path, forced-decoding entropies against a forward pass, an interventions debate with the packaged sentence
embedder and misconception refutation by the model, and a short training run under DIGRA."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from rounding import entropy_bound, logit_bound, max_abs
from train_helpers import EXPLICIT, read_jsonl, tiny_config

from udpo.cli import main
from udpo.env.backends.base import ScoreRequest
from udpo.env.debate import DebateConfig, DebateEnv
from udpo.env.protocols import Interventions, Refuter
from udpo.env.protocols.embeddings import SentenceEmbedder
from udpo.env.tasks import get_task


@pytest.fixture(scope="module")
def tiny_hf(tiny_model):
    """The hf backend on the tiny model, in fp32."""
    from udpo.env.backends.hf import HFBackend

    backend = HFBackend(model=tiny_model, dtype="fp32")
    yield backend
    backend.close()


@pytest.mark.numeric
def test_token_entropies_are_the_models_full_vocabulary_entropies(tiny_hf):
    requests = [
        ScoreRequest([{"role": "user", "content": "What is 2+3?"}], "The sum is 5, so \\boxed{5}."),
        ScoreRequest(
            [{"role": "system", "content": "You are careful."}, {"role": "user", "content": "Name a color."}],
            "Blue.",
        ),
    ]
    batched = tiny_hf.token_entropies(requests)
    tok = tiny_hf.tokenizer
    for r, got in zip(requests, batched, strict=True):
        prompt = tiny_hf.encode(r.messages)
        response = tok.encode(r.response, add_special_tokens=False) + [tok.eos_token_id]
        with torch.no_grad():
            logits = tiny_hf.model(torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1]
        logp = torch.log_softmax(logits.float(), -1)
        expected = -(logp.exp() * logp).sum(-1)
        # a padded batch against one unpadded pass: the same sums in another order
        config = tiny_hf.model.config
        difference = logit_bound(config, torch.float32, max_abs(logits), len(prompt) + len(response))
        bound = entropy_bound(difference, config.vocab_size)
        assert len(got) == len(response) and torch.allclose(torch.tensor(got), expected, rtol=0, atol=bound)
        assert tiny_hf.token_entropies([r])[0] == pytest.approx(got, abs=bound)  # batching changes nothing
    assert all(0 < h <= torch.log(torch.tensor(float(len(tok)))).item() for e in batched for h in e)


@pytest.mark.slow
def test_digra_debate_with_injection_and_the_woozle_report(tmp_path, capsys):
    """``udpo debate --protocol digra`` on 2 Du et al. items, N = 3, T = 1, agent 0 injected wrong."""
    run = tmp_path / "digra"
    args = ["debate", "--task", "du-arithmetic", "--limit", "2", "--n-agents", "3", "--rounds", "1"]
    args += [
        "--max-tokens",
        "16",
        "--protocol",
        "digra",
        "--inject",
        "wrong,own,own",
        "--output-dir",
        str(run),
    ]
    assert main(args) == 0, capsys.readouterr().err
    trajectories = read_jsonl(run / "trajectories.jsonl")
    assert len(trajectories) == 2
    for t in trajectories:
        assert t["meta"]["protocol"]["name"] == "digra"
        assert t["turns"][0][0]["finish_reason"] == "injected" and t["answers"][0][0] != t["gold"]
        for row in t["turns"]:
            for turn in row[1:]:
                d = turn["details"]["digra"]
                assert sorted(d["igr"]) == sorted(d["conditional_entropy"]) and len(d["igr"]) == 3
                best = max(d["igr"], key=d["igr"].get)
                assert d["selected"] == [int(j) for j in best.split(",")]
                peers = [j for j, _ in turn["reads"]]
                assert sorted(peers) == d["selected"] and turn["agent"] not in peers
                entropies = [d["peer_entropy"][str(j)] for j in peers]
                assert entropies == sorted(entropies, reverse=True)  # read in descending entropy
                assert all(e > 0 for e in entropies) and d["own_entropy"] > 0
    out = tmp_path / "diagnosis"
    assert main(["diagnose", str(run), "--out", str(out), "--no-plots"]) == 0
    (group,) = json.loads((out / "summary.json").read_text())["runs"]["digra"]["woozle"]
    assert group["inject"] == ["wrong", "own", "own"] and group["n_debates"] == 2
    assert len(group["ma"]) == 2 and len(group["mr"]) == len(group["cr"]) == 1
    assert 0 < group["read_degree"][0] <= 1
    assert "woozle metrics" in capsys.readouterr().out


def test_interventions_debate_with_real_embeddings_and_refutation(tiny_hf):
    task = get_task("du-arithmetic")
    questions = task.load(limit=2)
    embedder = SentenceEmbedder()
    assert embedder([questions[0].text]).shape == (1, 384)  # all-MiniLM-L6-v2 from the package
    stage = Interventions(task, embedder=embedder, refuter=Refuter(tiny_hf, _greedy(24)))
    config = DebateConfig(n_agents=3, rounds=1, sampling=_greedy(16, temperature=0.7), debate_batch_size=2)
    trajectories = DebateEnv(task, tiny_hf, config, protocol=[stage]).run(questions, progress=False)
    for t in trajectories:
        reads = [turn.reads for row in t.turns for turn in row if turn.round == 1]
        assert all(r == reads[0] for r in reads) and len(reads[0]) == 2  # QP keeps ceil(3 / 2) of 3
        own = {turn.agent: turn.text.strip() for row in t.turns for turn in row if turn.round == 0}
        prompt = t.turns[0][1].messages[-1]["content"]
        shown = dict(re.findall(r"\[Agent (\d)\]\n(.*?)\n\n(?=\[Agent |Weigh their)", prompt, re.S))
        assert sorted(int(k) - 1 for k in shown) == [j for j, _ in reads[0]]
        assert any(text != own[int(k) - 1] for k, text in shown.items())  # MR rewrote what is read
    assert stage.refuter.requests == 2 * 2 * len(questions)  # two calls per kept response


def test_training_under_a_digra_topology(tiny_model, tmp_path):
    from udpo.training.trainer import Trainer

    config = tiny_config(
        tiny_model,
        tmp_path / "run",
        n_agents=3,
        max_iterations=1,
        eval_questions=0,
        protocol="digra",
        **EXPLICIT,
    )
    trainer = Trainer(config)
    try:
        trainer.train()
        stats = trainer.debate_protocol().stages[0].stats()
    finally:
        trainer.close()
    train = read_jsonl(tmp_path / "run" / "trajectories" / "train.jsonl")
    assert len(train) == 2 and all(t["meta"]["protocol"]["name"] == "digra" for t in train)
    assert all("digra" in turn["details"] for t in train for row in t["turns"] for turn in row[1:])
    assert stats["passes"] > 0 and stats["calls"] >= 2
    records = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    (record,) = [r for r in records if r["kind"] == "train"]
    assert record["iteration"] == 1 and record["tokens"] > 0 and record["debates"] == 2
    for key in ("update/loss", "update/kl", "grad_norm/agent_0", "grad_norm/agent_2", "reward/mean"):
        assert math.isfinite(record[key]), key
    assert record["update/ratio_mean"] == pytest.approx(1.0, abs=1e-3)  # one update on fresh rollouts


def _greedy(max_tokens: int, temperature: float = 0.0):
    from udpo.env.backends.base import SamplingParams

    return SamplingParams(temperature=temperature, max_tokens=max_tokens, logprobs=temperature > 0)
