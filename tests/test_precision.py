"""The numeric path (issue 48): what ``dtype: auto`` resolves to, the ``UDPO_DTYPE`` switch that forces it,
and trainers of either precision one after the other in one process, each updating in its own precision
and moving every adapter, on the tiny digit model (in bf16 on every CPU: emulated where the CPU has no
bf16 units, slower but the same numbers)."""

from __future__ import annotations

import pytest
import torch
import train_helpers
from rounding import scored_bound
from train_helpers import EXPLICIT, QUESTION_DIGEST, read_jsonl, tiny_config

from udpo.env.backends import machine
from udpo.training import accelerate_state
from udpo.training.run_lock import RunBusyError
from udpo.training.trainer import Trainer


@pytest.fixture(scope="module")
def digit_model(tokenizer_path, tmp_path_factory) -> str:
    return train_helpers.digit_model(tokenizer_path, tmp_path_factory)


@pytest.fixture
def fresh_accelerate_state(monkeypatch):
    """accelerate's process-wide state as a fresh process has it (none); what earlier tests left there
    (a trainer of theirs still open) is put back afterwards."""
    from accelerate.state import AcceleratorState, GradientState

    saved = {cls: dict(cls._shared_state) for cls in (AcceleratorState, GradientState)}
    for cls in saved:
        cls._shared_state.clear()
    monkeypatch.setattr(accelerate_state, "_holders", set())
    yield
    for cls, state in saved.items():
        cls._shared_state.clear()
        cls._shared_state.update(state)


def test_udpo_dtype_forces_what_auto_resolves_to(monkeypatch):
    monkeypatch.delenv(machine.DTYPE_ENV, raising=False)
    assert machine.forced_dtype() is None
    native = torch.bfloat16 if machine.cpu_has_bf16() else torch.float32
    assert (
        machine.pick_dtype("auto", "cpu") == native and machine.pick_dtype("auto", "cuda") == torch.bfloat16
    )
    for value, dtype in (("fp32", torch.float32), ("BF16", torch.bfloat16)):
        monkeypatch.setenv(machine.DTYPE_ENV, value)
        assert machine.pick_dtype("auto", "cpu") == machine.pick_dtype("auto", "cuda") == dtype
        assert machine.pick_dtype("fp16", "cpu") == torch.float16  # an explicit dtype is left alone
        assert f"forced by UDPO_DTYPE={value.lower()}" in machine.describe_numeric_path()
    monkeypatch.setenv(machine.DTYPE_ENV, "float64")
    with pytest.raises(ValueError, match=r"UDPO_DTYPE='float64': use fp32 or bf16"):
        machine.pick_dtype("auto", "cpu")


def test_the_header_names_the_matrix_units_and_the_dtype_auto_picks(monkeypatch):
    monkeypatch.delenv(machine.DTYPE_ENV, raising=False)
    line = machine.describe_numeric_path()
    units = machine.cpu_matrix_units()
    assert f"({', '.join(units)}); dtype auto = {'bf16' if machine.cpu_has_bf16() else 'fp32'}" in line
    assert machine.cpu_has_bf16() == bool({"amx_bf16", "avx512_bf16"} & set(units))


#: how far the trainer's log-probs of the sampled tokens may be from the sampler's (``mismatch/abs_mean``,
#: nats per token) under bf16 autocast, where the trainer multiplies by the fp32 LoRA weights rounded to bf16
#: and the sampler does not: another computation, not another order (measured 0.005 to 0.014 once the
#: adapters have moved; docs/backends.md: 0.026 on the real model). fp32 agrees to rounding: the bound of
#: :func:`rounding.scored_bound` (measured 5e-6)
BF16_MISMATCH = 0.05


def lora_b_of(trainer: Trainer, agent: int) -> dict[str, torch.Tensor]:
    """Agent ``agent``'s LoRA B matrices (zero when an adapter is created)."""
    name = trainer.policy.adapter_names[agent]
    model = trainer.policy.model_of(agent)
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_B" in n and f".{name}." in n}


def config_for(digit_model: str, run, dtype: str, **overrides):
    """The tiny digit model's run in ``dtype``, explicit coefficients, no evaluation, and a reward term fixed
    by the question, so the advantages are never all zero."""
    settings = {"max_iterations": 1, "eval_questions": 0, "reward_functions": [QUESTION_DIGEST], **EXPLICIT}
    return tiny_config(digit_model, run, dtype=dtype, **{**settings, **overrides})


@pytest.mark.parametrize(
    "order", [("fp32", "bf16"), ("bf16", "fp32")], ids=["fp32-then-bf16", "bf16-then-fp32"]
)
def test_trainers_of_either_precision_follow_one_another(
    digit_model, tmp_path, order, fresh_accelerate_state
):
    """One iteration each, in one process (accelerate refused the second trainer's mixed precision before,
    issue 48): each trainer scores its update in its own precision (bf16 autocast, or none in fp32), and
    once both are closed (and one that could not start, its run folder busy) accelerate's state is gone: a
    later Accelerator may ask for any precision."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    for dtype in order:
        config = config_for(digit_model, tmp_path / dtype, dtype)
        with Trainer(config) as trainer:
            assert trainer.policy.dtype == machine.DTYPES[dtype]
            with pytest.raises(RunBusyError):  # a trainer that fails to start lets go of accelerate too
                Trainer(config)
            precisions = []
            scored = trainer.policy.token_logprobs

            def recording(*args, scored=scored, precisions=precisions, **kwargs):
                on = torch.is_autocast_enabled("cpu")
                precisions.append(torch.get_autocast_dtype("cpu") if on else torch.float32)
                return scored(*args, **kwargs)

            trainer.policy.token_logprobs = recording
            trainer.train()
            assert set(precisions) == {machine.DTYPES[dtype]}, dtype
    assert not AcceleratorState._shared_state
    Accelerator(cpu=True, mixed_precision="bf16")  # what a later run of another library may ask for


@pytest.mark.numeric
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_training_moves_every_adapter_and_resumes_exactly(digit_model, tmp_path, dtype):
    """Two iterations: every LoRA B of every agent moves from zero, the trainer's log-probs match the
    sampler's within the dtype's tolerance, and the run resumed from checkpoint 1 ends as the whole run
    did, to the bit: the same debates, metrics and adapters."""
    import shutil

    from safetensors.torch import load_file

    whole = tmp_path / "whole"
    with Trainer(config_for(digit_model, whole, dtype, max_iterations=2)) as trainer:
        trainer.train()
        for agent in range(2):
            lora_b = lora_b_of(trainer, agent)
            assert lora_b and all(p.abs().sum() > 0 for p in lora_b.values()), agent
        turns = [
            t for d in read_jsonl(whole / "trajectories" / "train.jsonl") for row in d["turns"] for t in row
        ]
        sequences = [t["prompt_ids"] + t["completion_ids"] for t in turns]
        bound = scored_bound(trainer.policy._set_active(0), sequences, trainer.config.temperature)
    records = [r for r in read_jsonl(whole / "metrics.jsonl") if r["kind"] == "train"]
    assert records[-1]["mismatch/abs_mean"] < (bound if dtype == "fp32" else BF16_MISMATCH), records[-1]

    resumed = tmp_path / "resumed"
    shutil.copytree(whole, resumed)
    checkpoint = resumed / "checkpoints" / "iter_000001"
    with Trainer(config_for(digit_model, resumed, dtype, max_iterations=2, resume=str(checkpoint))) as again:
        again.train()
    drop = ("time", "tokens_per_s", "seconds", "memory")  # wall clock and memory differ between runs

    def train_metrics(run):
        rows = [r for r in read_jsonl(run / "metrics.jsonl") if r["kind"] == "train"]
        return [{k: v for k, v in r.items() if not k.startswith(drop)} for r in rows]

    def texts(run):
        return [
            [[t["text"] for t in row] for row in d["turns"]]
            for d in read_jsonl(run / "trajectories" / "train.jsonl")
        ]

    # exact: the resumed run repeats the whole run's second iteration with the same kernels, shapes and order
    assert train_metrics(resumed) == train_metrics(whole) and len(train_metrics(whole)) == 2
    assert texts(resumed) == texts(whole)
    final = "checkpoints/iter_000002/adapters"
    for adapter in ("agent_0", "agent_1"):
        a, b = (
            load_file(str(run / final / adapter / "adapter_model.safetensors")) for run in (whole, resumed)
        )
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), adapter
