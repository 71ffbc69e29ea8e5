"""``dtype: auto`` by the work: training keeps the rule of the CPU's matrix units; generation alone (debate,
eval, Team) on a CPU with bf16 units takes the faster dtype of a probed decode step, cached per CPU, torch
and model shape (udpo.env.backends.machine.choose_dtype, udpo.env.backends.dtype_probe). The probe's
timing is injected (a function of the config), so the choices do not depend on this machine's speed or
load; one test runs the real probe on a tiny shape."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import LlamaConfig

from udpo.cli import main
from udpo.env.backends import dtype_probe, machine


def tiny_config(**overrides) -> LlamaConfig:
    shape = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 6, "num_attention_heads": 4}
    shape |= {"num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 512}
    return LlamaConfig(**(shape | overrides))


class Timings:
    """An injected probe timing: each dtype's seconds, and how often it was asked."""

    def __init__(self, bf16: float, fp32: float):
        self.seconds = {"bf16": bf16, "fp32": fp32}
        self.calls = 0

    def __call__(self, config) -> dict[str, float]:
        self.calls += 1
        return dict(self.seconds)


@pytest.fixture
def bf16_cpu(monkeypatch, tmp_path):
    """A CPU with bf16 matrix units, nothing forced, the probe's cache in a fresh folder."""
    monkeypatch.delenv(machine.DTYPE_ENV, raising=False)
    monkeypatch.setenv("UDPO_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(machine, "cpu_has_bf16", lambda: True)
    return tmp_path / "cache" / dtype_probe.FILE


def test_generation_takes_the_faster_dtype_of_the_probe_and_caches_it(bf16_cpu):
    slower = Timings(bf16=1.31, fp32=1.0)
    first = machine.choose_dtype("auto", "cpu", "generate", tiny_config(), measure=slower)
    assert first.dtype == torch.float32 and slower.calls == 1
    assert first.describe().startswith(
        "dtype auto = fp32 for generation (probe: bf16 1.31x slower on this CPU; measured now, cached in"
    )
    entry = next(iter(json.loads(bf16_cpu.read_text()).values()))
    assert entry["picked"] == "fp32" and (entry["bf16_s"], entry["fp32_s"], entry["ratio"]) == (
        1.31,
        1.0,
        1.31,
    )

    # the same CPU, torch and shape: read back, not measured again (a probe that would now say bf16)
    again = machine.choose_dtype("auto", "cpu", "generate", tiny_config(), measure=Timings(1.0, 2.0))
    assert again.dtype == torch.float32
    assert "probe: bf16 1.31x slower on this CPU; cached in" in again.describe()

    # another model shape is probed on its own, beside the first
    faster = Timings(bf16=0.5, fp32=1.0)
    other = machine.choose_dtype("auto", "cpu", "generate", tiny_config(hidden_size=64), measure=faster)
    assert other.dtype == torch.bfloat16 and faster.calls == 1
    assert "probe: bf16 2.00x faster on this CPU; measured now" in other.describe()
    assert len(json.loads(bf16_cpu.read_text())) == 2

    # training keeps the rule of the matrix units: bf16, no probe
    trained = machine.choose_dtype("auto", "cpu", "train", tiny_config(), measure=slower)
    assert trained.dtype == torch.bfloat16 and slower.calls == 1
    assert trained.describe().startswith("dtype auto = bf16 for training (bf16 matrix units")
    assert machine.pick_dtype("auto", "cpu") == torch.bfloat16


def test_a_forced_or_named_dtype_a_gpu_and_a_cpu_without_bf16_units_skip_the_probe(bf16_cpu, monkeypatch):
    def no_probe(config):
        raise AssertionError("probed")

    def choose(name="auto", device="cpu"):
        return machine.choose_dtype(name, device, "generate", tiny_config(), measure=no_probe)

    assert (choose("fp32").dtype, choose("bf16").dtype) == (torch.float32, torch.bfloat16)
    assert choose("fp32").describe() == "dtype fp32 (asked for)"
    gpu = choose(device="cuda")
    assert gpu.dtype == torch.bfloat16 and gpu.describe() == "dtype auto = bf16 for generation (GPU)"
    for value, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        monkeypatch.setenv(machine.DTYPE_ENV, value)
        forced = choose()
        assert forced.dtype == dtype and f"(forced by UDPO_DTYPE={value})" in forced.describe()
    monkeypatch.delenv(machine.DTYPE_ENV)
    monkeypatch.setattr(machine, "cpu_has_bf16", lambda: False)
    avx2 = choose()
    assert avx2.dtype == torch.float32 and "no bf16 matrix units" in avx2.describe()
    assert not bf16_cpu.exists()
    with pytest.raises(ValueError, match="unknown work"):
        machine.choose_dtype("auto", "cpu", "serve")


def test_a_probe_that_fails_takes_bf16_and_says_why(bf16_cpu):
    def fails(config):
        raise RuntimeError("no such layer")

    choice = machine.choose_dtype("auto", "cpu", "generate", tiny_config(), measure=fails)
    assert (
        choice.dtype == torch.bfloat16
        and "the probe failed (RuntimeError: no such layer)" in choice.describe()
    )
    assert not bf16_cpu.exists()


def test_an_unreadable_cache_is_measured_again_and_replaced(bf16_cpu):
    bf16_cpu.parent.mkdir(parents=True)
    bf16_cpu.write_text("{not json")
    timings = Timings(bf16=0.8, fp32=1.0)
    assert (
        machine.choose_dtype("auto", "cpu", "generate", tiny_config(), measure=timings).dtype
        == torch.bfloat16
    )
    assert timings.calls == 1 and len(json.loads(bf16_cpu.read_text())) == 1


def test_the_probe_times_a_decode_step_of_the_shape_in_both_dtypes():
    """The real probe, on a tiny shape: a step of each dtype measured, the full model's step estimated
    from its layers (more layers: a longer estimate)."""
    state = torch.get_rng_state()
    seconds = dtype_probe.measure_steps(tiny_config())
    assert set(seconds) == {"bf16", "fp32", "ratio"} and all(s > 0 for s in seconds.values())
    assert torch.equal(torch.get_rng_state(), state)  # a seeded run samples the same, probed or not
    key = json.loads(dtype_probe.probe_key(tiny_config(), machine.cpu_model()))
    assert key["shape"]["hidden_size"] == 32 and key["threads"] == torch.get_num_threads()
    assert key["torch"] == torch.__version__ and key["cpu"] == machine.cpu_model()


def test_the_debate_command_names_the_dtype_it_picked_and_why(
    bf16_cpu, tiny_model, tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(dtype_probe, "measure_steps", Timings(bf16=1.31, fp32=1.0))
    args = ["debate", "--task", "arithmetic", "--n-agents", "1", "--rounds", "0", "--max-tokens", "2"]
    args += ["--limit", "1", "--model", tiny_model, "--output-dir", str(tmp_path / "run"), "--no-progress"]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert (
        "dtype auto = fp32 for generation (probe: bf16 1.31x slower on this CPU; measured now, cached in"
        in err
    )


def test_a_team_that_only_debates_takes_the_generation_choice_and_a_trainer_keeps_bf16(
    bf16_cpu, tiny_model, monkeypatch
):
    """``work="generate"`` (what ``Team.from_pretrained`` asks for) probes; the trainer's policy does not."""
    from udpo.training.policy import MultiAgentPolicy

    timings = Timings(bf16=1.31, fp32=1.0)
    monkeypatch.setattr(dtype_probe, "measure_steps", timings)
    team = MultiAgentPolicy(model=tiny_model, n_agents=1, work="generate")
    assert team.dtype == torch.float32 and team.dtype_choice.work == "generate" and timings.calls == 1
    assert next(team.models[team.base_model].parameters()).dtype == torch.float32
    trainer = MultiAgentPolicy(model=tiny_model, n_agents=1)
    assert trainer.dtype == torch.bfloat16 and timings.calls == 1
