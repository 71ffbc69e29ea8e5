"""MultiAgentPolicy: log-probs of stored token ids, gradient isolation between agents' adapters,
references, saving/loading, teams. Mechanics on a tiny random Llama; the numbers that matter (the
ratio starts at 1, isolation through the full UDPO loss) on the real SmolLM2 model."""

from __future__ import annotations

import json

import pytest
import torch
from rounding import scored_bound
from tiny_models import build_tiny_llama, perturb_adapters

from udpo.algorithms.base import RolloutBatch, fill_behavior_logprobs
from udpo.algorithms.udpo import UDPO, Coefficients, compute_rewards
from udpo.env.backends.base import ChatRequest, SamplingParams
from udpo.env.backends.team import TeamBackend
from udpo.env.debate import DebateConfig, DebateEnv
from udpo.env.tasks import get_task
from udpo.training.logprobs import plan_passes
from udpo.training.policy import LoraSettings, MultiAgentPolicy
from udpo.training.team import TeamManifest, save_team

pytestmark = pytest.mark.numeric

PROMPTS = [[1, 9690, 198, 2683, 314], [1, 4093, 28, 253], [1, 18, 19, 20, 21, 22, 23, 24, 25]]
COMPLETIONS = [[2683, 314, 253], [19], [30, 31, 32, 33, 34, 35]]
SEQUENCES = [p + c for p, c in zip(PROMPTS, COMPLETIONS, strict=True)]


@pytest.fixture(scope="module")
def tiny_path(tokenizer_path, tmp_path_factory) -> str:
    return build_tiny_llama(tmp_path_factory.mktemp("tiny"), tokenizer_path)


@pytest.fixture(scope="module")
def tiny_b_path(tokenizer_path, tmp_path_factory) -> str:
    return build_tiny_llama(tmp_path_factory.mktemp("tiny_b"), tokenizer_path, seed=1)


def tiny_policy(path, n_agents=3, **kw) -> MultiAgentPolicy:
    """fp32 unless asked: these tests compare log-probs to fp32's rounding bound (:func:`rounding.scored_bound`)."""
    kw.setdefault("dtype", "fp32")
    policy = MultiAgentPolicy(path, n_agents=n_agents, lora=LoraSettings(r=4, alpha=8), **kw)
    perturb_adapters(policy)
    return policy


def manual_logprobs(model, prompt, completion, temperature: float = 1.0) -> torch.Tensor:
    """log p(completion | prompt) from one unpadded forward pass and a full log-softmax of logits / T."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + completion])).logits[0].float()
    logp = (logits / temperature).log_softmax(-1)[len(prompt) - 1 : -1]
    return logp.gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)


def param_snapshot(policy, agent):
    return [p.detach().clone() for p in policy.parameters_of(agent)]


# tiny model: mechanics ----------------------------------------------------------------------------------
def test_logprobs_batched_equal_unbatched_and_manual(tiny_path):
    policy = tiny_policy(tiny_path)
    assert policy.dtype == torch.float32  # tiny_policy pins fp32
    batched = policy.token_logprobs(1, PROMPTS, COMPLETIONS, batch_size=2)
    assert [len(lp) for lp in batched] == [len(c) for c in COMPLETIONS]
    model = policy.model_of(1)
    model.set_adapter("agent_1")
    bound = scored_bound(model, SEQUENCES)  # padded rows and single ones sum in other orders
    for k in range(len(PROMPTS)):
        single = policy.token_logprobs(1, [PROMPTS[k]], [COMPLETIONS[k]])[0]
        assert torch.allclose(batched[k], single, rtol=0, atol=bound)
        assert torch.allclose(
            batched[k], manual_logprobs(model, PROMPTS[k], COMPLETIONS[k]), rtol=0, atol=bound
        )
    # other agents' adapters give other log-probs; an empty completion gives an empty tensor
    assert not torch.allclose(policy.token_logprobs(0, PROMPTS, COMPLETIONS)[2], batched[2])
    assert policy.token_logprobs(0, [[1, 2]], [[]])[0].numel() == 0


def debate_rounds(seed: int, rounds: int = 3) -> tuple[list[list[int]], list[list[int]]]:
    """One agent's rounds of a made-up debate: each round's prompt is the previous round's prompt and
    completion plus new tokens (peer answers), as a chat history that only grows."""
    g = torch.Generator().manual_seed(seed)
    ids = lambda n: torch.randint(20, 3000, (n,), generator=g).tolist()  # noqa: E731
    prompts, completions = [ids(5)], [ids(3)]
    for _ in range(rounds - 1):
        prompts.append(prompts[-1] + completions[-1] + ids(4))
        completions.append(ids(2 + len(prompts) % 3))
    return prompts, completions


def test_shared_prefix_rounds_are_scored_in_one_row_with_unchanged_values(tiny_path):
    policy = tiny_policy(tiny_path)
    first, second = debate_rounds(0), debate_rounds(1)
    broken = debate_rounds(2)
    broken[0][2] = (
        broken[0][2][:-7] + [7] + broken[0][2][-6:]
    )  # round 1's completion re-tokenized differently
    prompts = first[0] + second[0] + broken[0] + [PROMPTS[0]]
    completions = first[1] + second[1] + broken[1] + [[]]
    rows, passes = plan_passes(prompts, completions, batch_size=8, token_budget=10_000)
    # a debate's rounds share the row of its last round, except where the prefix breaks
    assert [[k for k, _, _ in r.spans] for r in rows] == [[0, 1, 2], [3, 4, 5], [6, 7], [8]]
    assert rows[0].ids == prompts[2] + completions[2]
    policy.forward_stats.reset()
    scored = policy.token_logprobs(1, prompts, completions, batch_size=8, token_budget=10_000)
    assert policy.forward_stats.passes == len(passes)
    assert (
        policy.forward_stats.tokens == sum(len(r.ids) for r in rows) == 22 + 22 + 16 + 22
    )  # not 46 + 46 + 46
    model = policy.model_of(1)
    policy._set_active(1)
    bound = scored_bound(model, [p + c for p, c in zip(prompts, completions, strict=True)])
    for k in range(9):
        assert torch.allclose(
            scored[k].detach(), manual_logprobs(model, prompts[k], completions[k]), rtol=0, atol=bound
        ), k
    assert scored[9].numel() == 0
    # the reference of several agents at once: adapters off, the same values as one agent at a time
    refs = policy.reference_logprobs([0] * 9 + [2] * 9, prompts[:9] * 2, completions[:9] * 2, token_budget=64)
    with model.disable_adapter():
        bound = scored_bound(model, [p + c for p, c in zip(prompts, completions, strict=True)])
        for k in range(18):
            assert torch.allclose(
                refs[k], manual_logprobs(model, prompts[k % 9], completions[k % 9]), rtol=0, atol=bound
            )
    with pytest.raises(ValueError, match="empty prompt"):
        policy.token_logprobs(0, [[]], [[5]])


def test_token_budget_bounds_each_pass_and_sorting_keeps_padding_small():
    lengths = [30, 7, 12, 31, 8, 29, 11, 50]
    prompts = [[1] * (n - 2) for n in lengths]
    completions = [[2, 3]] * len(lengths)
    rows, passes = plan_passes(prompts, completions, batch_size=3, token_budget=64)
    assert sorted(k for p in passes for k in p) == list(range(len(lengths)))
    widths = [[len(rows[j].ids) for j in p] for p in passes]
    # sorted; at most 3 rows, 64 positions (rows x longest) and 10% padding per pass
    assert widths == [[7, 8], [11, 12], [29, 30], [31], [50]]
    assert all(len(w) == 1 or (len(w) * max(w) <= 64 and sum(w) >= 0.9 * len(w) * max(w)) for w in widths)
    assert plan_passes([[1] * 9] * 3, [[2]] * 3, batch_size=3, token_budget=64)[1] == [[0, 1, 2]]
    assert plan_passes([[1] * 200], [[2]], batch_size=8, token_budget=64)[1] == [[0]]  # too long: alone


def test_temperature_divides_the_logits(tiny_path):
    policy = tiny_policy(tiny_path)
    plain = policy.token_logprobs(0, PROMPTS, COMPLETIONS)
    hot = policy.token_logprobs(0, PROMPTS, COMPLETIONS, temperature=0.5)
    greedy = policy.token_logprobs(0, PROMPTS, COMPLETIONS, temperature=0)
    model = policy._set_active(0)
    bound = scored_bound(model, SEQUENCES, temperature=0.5)
    for k in range(len(PROMPTS)):
        assert torch.allclose(
            hot[k].detach(), manual_logprobs(model, PROMPTS[k], COMPLETIONS[k], 0.5), rtol=0, atol=bound
        )
        assert torch.equal(greedy[k].detach(), plain[k].detach())  # greedy has no distribution: scored at 1
        assert not torch.allclose(hot[k].detach(), plain[k].detach())
    with pytest.raises(ValueError, match="temperature"):
        policy.token_logprobs(0, PROMPTS, COMPLETIONS, temperature=-1)


def test_gradients_reach_only_the_agents_adapter(tiny_path):
    policy = tiny_policy(tiny_path)
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-2)
    before = {i: param_snapshot(policy, i) for i in range(3)}
    for agent in (0, 2):  # each agent's adapter is switched on in turn, after another one was active
        optimizer.zero_grad(set_to_none=True)
        loss = -sum(lp.sum() for lp in policy.token_logprobs(agent, PROMPTS, COMPLETIONS))
        loss.backward()
        for i in range(3):
            grads = [p.grad for p in policy.parameters_of(i)]
            if i == agent:
                assert all(g is not None and g.abs().sum() > 0 for g in grads)
            else:
                assert all(g is None for g in grads)
        # every adapter the optimizer owns stays trainable after the switch
        assert all(p.requires_grad for p in policy.trainable_parameters())
    optimizer.zero_grad(set_to_none=True)
    (-policy.token_logprobs(1, PROMPTS, COMPLETIONS)[0].sum()).backward()
    optimizer.step()
    after = {i: param_snapshot(policy, i) for i in range(3)}
    assert any(not torch.equal(a, b) for a, b in zip(before[1], after[1], strict=True))
    for i in (0, 2):
        assert all(torch.equal(a, b) for a, b in zip(before[i], after[i], strict=True))


def test_reference_base_is_the_model_without_adapters(tiny_path):
    from transformers import AutoModelForCausalLM

    policy = tiny_policy(tiny_path)
    plain = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32)
    ref = policy.token_logprobs(2, PROMPTS, COMPLETIONS, reference=True)
    assert not any(r.requires_grad for r in ref)
    bound = scored_bound(plain, SEQUENCES)
    for k in range(len(PROMPTS)):
        assert torch.allclose(ref[k], manual_logprobs(plain, PROMPTS[k], COMPLETIONS[k]), rtol=0, atol=bound)
    assert not torch.allclose(ref[2], policy.token_logprobs(2, PROMPTS, COMPLETIONS)[2].detach())


def test_lagged_reference_follows_refresh(tiny_path):
    policy = tiny_policy(tiny_path, reference="lagged")
    policy.refresh_reference()  # the snapshot of the perturbed adapters
    snapshot = [lp.detach() for lp in policy.token_logprobs(0, PROMPTS, COMPLETIONS)]
    optimizer = torch.optim.SGD(policy.parameters_of(0), lr=0.5)
    (-sum(lp.sum() for lp in policy.token_logprobs(0, PROMPTS, COMPLETIONS))).backward()
    optimizer.step()
    moved = policy.token_logprobs(0, PROMPTS, COMPLETIONS)
    ref = policy.token_logprobs(0, PROMPTS, COMPLETIONS, reference=True)
    bound = scored_bound(policy._set_active(0), SEQUENCES)  # the snapshot's adapter against the live one
    assert all(torch.allclose(r, s, rtol=0, atol=bound) for r, s in zip(ref, snapshot, strict=True))
    assert not torch.allclose(moved[0].detach(), snapshot[0])
    policy.refresh_reference()
    ref = policy.token_logprobs(0, PROMPTS, COMPLETIONS, reference=True)
    assert all(torch.allclose(r, m.detach(), rtol=0, atol=bound) for r, m in zip(ref, moved, strict=True))
    # the snapshot is never trained
    assert all(p.requires_grad for p in policy.trainable_parameters())
    snapshots = [p for n, p in policy.model_of(0).named_parameters() if "__ref" in n]
    assert snapshots and not any(p.requires_grad for p in snapshots)
    with pytest.raises(ValueError, match="lagged"):
        tiny_policy(tiny_path).refresh_reference()


def test_shared_adapter(tiny_path, tmp_path):
    policy = tiny_policy(tiny_path, shared_adapter=True)
    assert policy.adapter_names == ["shared"] * 3
    assert policy.parameters_of(0) is policy.parameters_of(2)
    assert len(policy.trainable_parameters()) == len(policy.parameters_of(0))
    assert list(policy.save_adapters(tmp_path)) == ["shared"]
    a, b = policy.token_logprobs(0, PROMPTS, COMPLETIONS), policy.token_logprobs(1, PROMPTS, COMPLETIONS)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_save_load_adapters_in_place(tiny_path, tmp_path):
    policy = tiny_policy(tiny_path, reference="lagged")
    expected = [lp.detach() for lp in policy.token_logprobs(1, PROMPTS, COMPLETIONS)]
    paths = policy.save_adapters(tmp_path / "adapters")
    policy.save_adapters(tmp_path / "reference", reference=True)
    assert sorted(paths) == ["agent_0", "agent_1", "agent_2"]
    config = json.loads((tmp_path / "adapters" / "agent_1" / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["inference_mode"] is True
    params = policy.parameters_of(1)
    with torch.no_grad():
        for p in policy.trainable_parameters():
            p.zero_()
    policy.load_adapters(tmp_path / "adapters")
    policy.load_adapters(tmp_path / "reference", reference=True)
    assert all(p is q for p, q in zip(params, policy.parameters_of(1), strict=True))  # same objects
    restored = policy.token_logprobs(1, PROMPTS, COMPLETIONS)
    assert all(torch.allclose(a, b) for a, b in zip(restored, expected, strict=True))
    other = MultiAgentPolicy(tiny_path, n_agents=3, lora=LoraSettings(r=8))
    with pytest.raises(ValueError, match="adapter_config.json: r is 4"):
        other.load_adapters(tmp_path / "adapters")
    with pytest.raises(FileNotFoundError, match="agent_0"):
        other.load_adapters(tmp_path / "missing")


def test_heterogeneous_team(tiny_path, tiny_b_path):
    policy = tiny_policy(tiny_path, agent_models=[tiny_path, tiny_b_path, tiny_path])
    assert list(policy.models) == [tiny_path, tiny_b_path]
    assert policy.model_of(1) is policy.models[tiny_b_path] and policy.model_of(2) is policy.models[tiny_path]
    model_b = policy.models[tiny_b_path]
    model_b.set_adapter("agent_1")
    lp = policy.token_logprobs(1, PROMPTS, COMPLETIONS)
    bound = scored_bound(model_b, SEQUENCES[:1])
    assert torch.allclose(
        lp[0].detach(), manual_logprobs(model_b, PROMPTS[0], COMPLETIONS[0]), rtol=0, atol=bound
    )
    lp[0].sum().backward()
    assert all(p.grad is None for i in (0, 2) for p in policy.parameters_of(i))
    backend = policy.rollout_backend()
    assert isinstance(backend, TeamBackend)
    sampling = SamplingParams(temperature=0, max_tokens=3)
    messages = [{"role": "user", "content": "Hi"}]
    out = backend.generate(
        [
            ChatRequest(messages, sampling, adapter="agent_1", model=tiny_b_path),
            ChatRequest(messages, sampling, adapter="agent_0", model=tiny_path),
        ]
    )
    for c, agent in zip(out, (1, 0), strict=True):
        recomputed = policy.token_logprobs(agent, [c.prompt_ids], [c.completion_ids])[0]
        bound = scored_bound(
            policy._set_active(agent), [c.prompt_ids + c.completion_ids]
        )  # sampler vs trainer
        assert torch.allclose(recomputed.detach(), torch.tensor(c.logprobs), rtol=0, atol=bound)
    with pytest.raises(ValueError, match="same base model"):
        MultiAgentPolicy(tiny_path, n_agents=2, agent_models=[tiny_path, tiny_b_path], shared_adapter=True)


def test_every_base_is_checked_for_the_lora_targets_before_any_weight_loads(tiny_path, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM, GPT2Config

    other = tmp_path / "gpt2"  # a second base whose layers have other names (c_attn, c_proj, c_fc)
    GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64).save_pretrained(str(other))
    loaded = []
    monkeypatch.setattr(
        AutoModelForCausalLM, "from_pretrained", lambda path, **kw: loaded.append(path) or 1 / 0
    )
    with pytest.raises(
        ValueError, match="lora_target_modules: q_proj, k_proj, v_proj, o_proj name.s. no module of .*c_attn"
    ):
        MultiAgentPolicy(tiny_path, n_agents=2, agent_models=[tiny_path, str(other)], lora=LoraSettings())
    assert loaded == []  # the first base's weights were not read either


def test_team_manifest_round_trip_and_register(tiny_path, tmp_path):
    policy = tiny_policy(tiny_path, n_agents=2)
    team = save_team(policy, tmp_path / "team", task="arithmetic", profiles=["calm", None], iteration=7)
    loaded = TeamManifest.load(tmp_path / "team")
    assert loaded == team and loaded.iteration == 7 and loaded.n_agents == 2
    specs = loaded.agent_specs()
    assert [(s.profile, s.adapter, s.model) for s in specs] == [
        ("calm", "agent_0", None),
        (None, "agent_1", None),
    ]
    rebuilt = MultiAgentPolicy.from_team(tmp_path / "team", dtype="fp32")
    for agent in range(2):
        a = policy.token_logprobs(agent, PROMPTS, COMPLETIONS)
        b = rebuilt.token_logprobs(agent, PROMPTS, COMPLETIONS)
        bound = scored_bound(policy._set_active(agent), SEQUENCES)
        assert all(torch.allclose(x, y, rtol=0, atol=bound) for x, y in zip(a, b, strict=True))
    # register into a plain HF backend on the same base: it serves the saved adapters
    from udpo.env.backends.hf import HFBackend

    backend = HFBackend(model=tiny_path, dtype="fp32")
    assert sorted(loaded.register(backend)) == ["agent_0", "agent_1"]
    c = backend.generate(
        [ChatRequest([{"role": "user", "content": "Hi"}], SamplingParams(0, max_tokens=4), "agent_1")]
    )[0]
    recomputed = policy.token_logprobs(1, [c.prompt_ids], [c.completion_ids])[0]
    bound = scored_bound(policy._set_active(1), [c.prompt_ids + c.completion_ids])  # sampler vs trainer
    assert torch.allclose(recomputed.detach(), torch.tensor(c.logprobs), rtol=0, atol=bound)
    # bad manifests name the file and the key
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "team.json").write_text(json.dumps({"agents": []}))
    with pytest.raises(ValueError, match="team.json: missing key 'base_model'"):
        TeamManifest.load(tmp_path / "bad")
    with pytest.raises(FileNotFoundError, match="no team.json"):
        TeamManifest.load(tmp_path)


def test_fill_behavior_logprobs(tiny_path):
    policy = tiny_policy(tiny_path, n_agents=2)
    from udpo.env.backends.scripted import ScriptedBackend

    task = get_task("arithmetic")
    questions = task.load("train", limit=2)
    trajectories = DebateEnv(task, ScriptedBackend(["\\boxed{2}", "\\boxed{3}"]), DebateConfig(2, 1)).run(
        questions, progress=False
    )
    for t in trajectories:  # scripted ids are characters, not real prompts: give them real prompt ids
        for row in t.turns:
            for turn in row:
                turn.prompt_ids, turn.logprobs = PROMPTS[0], []
    assert (
        fill_behavior_logprobs(trajectories, policy, temperature=0.7) == 8
    )  # 2 debates x 2 agents x 2 rounds
    assert all(turn.logprobs == [] for t in trajectories for row in t.turns for turn in row)  # the engine's
    rewards, terms = compute_rewards(trajectories, Coefficients.uniform(2))
    batch = RolloutBatch.from_trajectories(trajectories, rewards, terms)
    prompts, completions = batch.agent_sequences(1)
    flat = policy.token_logprobs(1, prompts, completions, temperature=0.7)
    behavior = batch.behavior(1).logprobs
    bound = scored_bound(
        policy._set_active(1), [p + c for p, c in zip(prompts, completions, strict=True)], 0.7
    )
    assert all(
        torch.allclose(a.detach(), b, rtol=0, atol=bound)
        for a, b in zip(batch.per_debate(1, flat), behavior, strict=True)
    )
    # recorded as the turns' trainer log-probs (what a replay buffer keeps), not in the trajectory files
    stored = [torch.tensor([x for turn in t.turns[1] for x in turn.trainer_logprobs]) for t in trajectories]
    assert all(torch.equal(a, b) for a, b in zip(stored, behavior, strict=True))
    assert all("trainer_logprobs" not in turn for row in trajectories[0].to_dict()["turns"] for turn in row)
    assert fill_behavior_logprobs(trajectories, policy, temperature=0.7) == 0  # nothing missing now


# sampled debates: the ratio starts at 1, and the full UDPO loss trains one adapter ----------------------------
@pytest.fixture(scope="module")
def real_policy(tiny_model):
    """The tiny model (std 0.3: varied replies) in fp32 with perturbed adapters: the same sampling, chat
    templates and log-prob paths as the real model, at a fraction of the time."""
    policy = MultiAgentPolicy(tiny_model, n_agents=2, dtype="fp32")
    perturb_adapters(policy, std=0.01)
    return policy


@pytest.fixture(scope="module")
def real_debates(real_policy):
    """Two debates (2 agents, 1 round) sampled by the policy's own backend, each agent with its adapter."""
    task = get_task("arithmetic")
    config = DebateConfig(
        n_agents=2,
        rounds=1,
        sampling=SamplingParams(0.7, max_tokens=16, seed=1),
        agents=TeamManifest.from_policy(real_policy).agent_specs(),
    )
    backend = real_policy.rollout_backend()
    return DebateEnv(task, backend, config).run(task.load("train", limit=2), progress=False)


def test_logprobs_match_backend_behavior_logprobs(real_policy, real_debates):
    """Recomputed log-probs of the sampled tokens (at the sampling temperature) equal the backend's behavior
    log-probs: rho starts at 1."""
    for t in real_debates:
        for agent, row in enumerate(t.turns):
            logp = real_policy.token_logprobs(
                agent,
                [turn.prompt_ids for turn in row],
                [turn.completion_ids for turn in row],
                temperature=0.7,
            )
            model = real_policy._set_active(agent)
            for turn, lp in zip(row, logp, strict=True):
                behavior = torch.tensor(turn.logprobs)
                assert turn.adapter == f"agent_{agent}" and lp.requires_grad and len(behavior) > 0
                # the sampler's KV-cache loop against the trainer's packed pass: other orders of summation
                bound = scored_bound(model, [turn.prompt_ids + turn.completion_ids], temperature=0.7)
                assert (lp.detach() - behavior).abs().max().item() <= bound
                assert abs((lp.detach().sum() - behavior.sum()).item()) <= bound * len(behavior)


def test_real_logprobs_are_log_softmax_of_logits_over_temperature(real_policy, real_debates):
    """Current and reference log-probs of real debate turns (rounds packed into one row where the chat
    history is a token-exact prefix) equal log_softmax(logits / T) of a plain forward pass, by hand."""
    packed = 0
    for agent, row in enumerate(real_debates[0].turns):
        prompts, completions = [t.prompt_ids for t in row], [t.completion_ids for t in row]
        packed += len(plan_passes(prompts, completions, 8, 4096)[0]) == 1  # both rounds in one row
        model = real_policy._set_active(agent)
        with torch.no_grad():
            logits = [
                model(input_ids=torch.tensor([p + c])).logits[0, len(p) - 1 : -1]
                for p, c in zip(prompts, completions, strict=True)
            ]
            with model.disable_adapter():
                base = [
                    model(input_ids=torch.tensor([p + c])).logits[0, len(p) - 1 : -1]
                    for p, c in zip(prompts, completions, strict=True)
                ]
        for temperature in (0.7, 1.0):
            with torch.no_grad():
                current = real_policy.token_logprobs(agent, prompts, completions, temperature=temperature)
            reference = real_policy.token_logprobs(
                agent, prompts, completions, reference=True, temperature=temperature
            )
            bound = scored_bound(
                model, [p + c for p, c in zip(prompts, completions, strict=True)], temperature
            )
            for k, c in enumerate(completions):
                by_hand = (logits[k] / temperature).log_softmax(-1).gather(-1, torch.tensor(c)[:, None])[:, 0]
                by_hand_ref = (
                    (base[k] / temperature).log_softmax(-1).gather(-1, torch.tensor(c)[:, None])[:, 0]
                )
                assert (current[k] - by_hand).abs().max().item() <= bound
                assert (reference[k] - by_hand_ref).abs().max().item() <= bound  # (base logits: smaller)
                assert (by_hand - by_hand_ref).abs().max().item() > bound  # the adapter changes the numbers
    assert packed > 0, "no agent's rounds shared a row: the packed path went untested"


def test_udpo_update_on_a_real_debate_moves_only_that_agent(real_policy, real_debates):
    coefficients = Coefficients.uniform(2, eta=1.0)  # a real KL to the base model: gradients for sure
    rewards, terms = compute_rewards(real_debates, coefficients)
    batch = RolloutBatch.from_trajectories(real_debates, rewards, terms)
    algo = UDPO(coefficients)
    advantages = algo.advantages(batch)
    optimizer = torch.optim.AdamW(real_policy.trainable_parameters(), lr=1e-3)
    before = {i: param_snapshot(real_policy, i) for i in range(2)}
    agent = 1
    prompts, completions = batch.agent_sequences(agent)
    logp = batch.per_debate(agent, real_policy.token_logprobs(agent, prompts, completions, temperature=0.7))
    with torch.no_grad():
        ref = batch.per_debate(
            agent, real_policy.token_logprobs(agent, prompts, completions, reference=True, temperature=0.7)
        )
    loss, info = algo.loss(batch, agent, logp, batch.behavior(agent), ref, advantages.values[:, agent])
    assert info["ratio_min"] == pytest.approx(1, abs=2e-3) and info["ratio_max"] == pytest.approx(1, abs=2e-3)
    assert info["kl"] > 0 and info["clip_frac"] == 0
    loss.backward()
    assert all(p.grad is None for p in real_policy.parameters_of(0))
    assert sum(p.grad.abs().sum() for p in real_policy.parameters_of(1)) > 0
    optimizer.step()
    after = {i: param_snapshot(real_policy, i) for i in range(2)}
    assert all(torch.equal(a, b) for a, b in zip(before[0], after[0], strict=True))
    assert any(not torch.equal(a, b) for a, b in zip(before[1], after[1], strict=True))
