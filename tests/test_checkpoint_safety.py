"""Checkpoints are shared, so loading one never runs code: trainer state is JSON + safetensors, a pickle
file (a crafted ``rng.pt``) is refused unopened, and every damaged file is a one-line error naming it,
found before a model loads."""

from __future__ import annotations

import json
import pickle
import random
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from udpo.training import checkpoint_store as ckpt
from udpo.training.team import AgentEntry, TeamManifest


class Payload:
    """Unpickling this creates ``marker``: what a crafted checkpoint file would do."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def malicious_pickle(marker: Path) -> bytes:
    return pickle.dumps({"python": Payload(marker), "numpy": None, "torch": None})


def test_the_payload_is_live(tmp_path):
    """The control: unpickling the crafted bytes does create the marker, so its absence below means
    the bytes were never unpickled."""
    marker = tmp_path / "control"
    pickle.loads(malicious_pickle(marker))
    assert marker.exists()


def optimizer_and_scheduler():
    from transformers import get_scheduler

    params = [torch.nn.Parameter(torch.randn(3, 2)), torch.nn.Parameter(torch.randn(2))]
    opt = torch.optim.AdamW(
        [{"params": [params[0]], "adapter": "agent_0"}, {"params": [params[1]], "adapter": "agent_1"}],
        lr=1e-3,
        betas=(0.9, 0.99),
    )
    sched = get_scheduler("cosine", opt, num_warmup_steps=2, num_training_steps=10)
    for p in params:
        p.grad = torch.randn_like(p)
    opt.step()
    sched.step()
    return params, opt, sched


def test_state_round_trips_through_json_and_safetensors(tmp_path):
    params, opt, sched = optimizer_and_scheduler()
    ckpt.save_state(tmp_path / "optimizer", opt.state_dict())
    ckpt.save_state(tmp_path / "scheduler", sched.state_dict())
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "optimizer.json",
        "optimizer.safetensors",
        "scheduler.json",
    ]
    fresh_params, fresh, fresh_sched = optimizer_and_scheduler()
    fresh.load_state_dict(ckpt.load_state(tmp_path / "optimizer"))
    fresh_sched.load_state_dict(ckpt.load_state(tmp_path / "scheduler"))
    restored, original = fresh.state_dict(), opt.state_dict()
    assert restored["param_groups"] == original["param_groups"]  # tuples (betas) and int keys survive
    for k in original["state"]:
        for name, value in original["state"][k].items():
            assert torch.equal(restored["state"][k][name], value)
    assert fresh_sched.state_dict() == sched.state_dict()

    # random generators: the same draws after a restore
    random.seed(3), np.random.seed(3), torch.manual_seed(3)
    ckpt.save_state(tmp_path / "rng", [ckpt.rng_state()])
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    ckpt.set_rng_state(ckpt.load_state(tmp_path / "rng")[0])
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


def fabricated_checkpoint(root: Path) -> Path:
    """A complete checkpoint folder of a 2-agent team with tiny stand-in adapters (no model needed)."""
    folder = root / "run" / "checkpoints" / "iter_000003"
    folder.mkdir(parents=True)
    params, opt, sched = optimizer_and_scheduler()
    ckpt.save_state(folder / "optimizer", opt.state_dict())
    ckpt.save_state(folder / "scheduler", sched.state_dict())
    ckpt.save_state(folder / "rng", [ckpt.rng_state()])
    ckpt.save_state(folder / "replay", {"capacity": 4, "items": []})
    ckpt.write_json(folder / "calibration.json", {"coefficients": {}})
    agents = []
    for i in range(2):
        (folder / "adapters" / f"agent_{i}").mkdir(parents=True)
        weights = {"w": torch.zeros_like(params[i])}  # what agent i's parameter group trains
        save_file(weights, str(folder / "adapters" / f"agent_{i}" / "adapter_model.safetensors"))
        (folder / "adapters" / f"agent_{i}" / "adapter_config.json").write_text("{}")
        agents.append(AgentEntry(name=f"agent_{i}", adapter=f"adapters/agent_{i}"))
    TeamManifest(base_model="some/model", agents=agents).save(folder)
    marks = {"metrics.jsonl": {"lines": 0, "bytes": 0}}
    state = {"iteration": 3, "optimizer_steps": 3, "total_iterations": 5, "world_size": 1, "files": marks}
    ckpt.write_json(folder / ckpt.STATE, {**state, "history": {}, "config": {}})
    return folder


def verify(folder: Path, **kw) -> None:
    ckpt.verify(folder, **{"replay": False, "reference": False, "deepspeed": False, **kw})


def test_a_pickled_rng_state_is_refused_unopened(tmp_path):
    folder = fabricated_checkpoint(tmp_path)
    verify(folder)  # the untouched checkpoint passes
    marker = tmp_path / "payload_ran"
    (folder / "rng.json").unlink()
    (folder / "rng.pt").write_bytes(malicious_pickle(marker))
    for check in (lambda: verify(folder), lambda: ckpt.load_state(folder / "rng")):
        with pytest.raises(
            ckpt.CheckpointError, match=r"rng\.pt is a pickle file; loading it could run any code"
        ):
            check()
    # planted beside the real state, or among the adapters: refused as well, never opened
    ckpt.save_state(folder / "rng", [ckpt.rng_state()])
    with pytest.raises(ckpt.CheckpointError, match=r"rng\.pt is a pickle file"):
        verify(folder)
    (folder / "rng.pt").unlink()
    (folder / "adapters" / "agent_1" / "adapter_model.bin").write_bytes(malicious_pickle(marker))
    with pytest.raises(ckpt.CheckpointError, match=r"adapter_model\.bin is a pickle file"):
        verify(folder)
    assert not marker.exists()


def test_the_trainer_refuses_a_pickled_checkpoint_before_any_model_loads(
    tokenizer_path, tmp_path, monkeypatch
):
    """Through the trainer: ``resume`` of a checkpoint whose rng state is a crafted pickle."""
    from train_helpers import tiny_config
    from transformers import AutoModelForCausalLM

    from udpo.training.trainer import Trainer

    monkeypatch.setattr(
        AutoModelForCausalLM, "from_pretrained", lambda *a, **k: pytest.fail("a model loaded")
    )
    folder = fabricated_checkpoint(tmp_path)
    marker = tmp_path / "payload_ran"
    (folder / "rng.json").unlink()
    (folder / "rng.pt").write_bytes(malicious_pickle(marker))
    with pytest.raises(ckpt.CheckpointError, match=r"rng\.pt is a pickle file") as e:
        Trainer(tiny_config(tokenizer_path, folder.parents[1], resume=str(folder)))
    assert "\n" not in str(e.value)
    assert not marker.exists()


def damage(folder: Path, name: str) -> str:
    """Damage one part of a checkpoint; returns what the error must say."""
    if name == "no world_size":
        state = json.loads((folder / ckpt.STATE).read_text())
        del state["world_size"]
        (folder / ckpt.STATE).write_text(json.dumps(state))
        return "trainer_state.json: 'world_size' must be an integer >= 1, got None"
    if name == "files not marks":
        state = json.loads((folder / ckpt.STATE).read_text())
        (folder / ckpt.STATE).write_text(json.dumps({**state, "files": ["metrics.jsonl"]}))
        return "'files' must map each file"
    if name == "last_evaluation text":
        state = json.loads((folder / ckpt.STATE).read_text())
        (folder / ckpt.STATE).write_text(json.dumps({**state, "last_evaluation": "20"}))
        return "'last_evaluation' must be an integer >= 0 or null, got '20'"
    if name == "garbage scheduler":
        (folder / "scheduler.json").write_bytes(b"\x80\x04garbage")
        return "scheduler.json: unreadable"
    if name == "garbage optimizer tensors":
        (folder / "optimizer.safetensors").write_bytes(b"\x00" * 64)
        return "optimizer.safetensors: not a safetensors file"
    if name == "missing optimizer tensors":
        (folder / "optimizer.safetensors").unlink()
        return "optimizer.json: malformed state (KeyError"
    if name == "garbage adapter":
        (folder / "adapters" / "agent_0" / "adapter_model.safetensors").write_bytes(b"{not safetensors")
        return "agent_0/adapter_model.safetensors: not a safetensors file"
    if name == "missing rng":
        (folder / "rng.json").unlink()
        return "rng.json is missing: the checkpoint is incomplete"
    if name == "deep rng":
        (folder / "rng.json").write_text("[" * 200_000 + "]" * 200_000)
        return "rng.json: unreadable (RecursionError"
    if name == "adapter is a number":
        team = json.loads((folder / "team.json").read_text())
        team["agents"][0]["adapter"] = 5
        (folder / "team.json").write_text(json.dumps(team))
        return "agents[0].adapter must be a non-empty string, got 5"
    if name == "calibration list":
        (folder / "calibration.json").write_text("[]")
        return "calibration.json: expected a JSON object"
    raise AssertionError(name)


def edit_state(folder: Path, stem: str, change) -> None:
    """Decode ``stem``'s state, apply ``change`` to it, and write it back."""
    state = ckpt.load_state(folder / stem)
    change(state)
    ckpt.save_state(folder / stem, state)


def set_group(key: str, value) -> Callable[[dict], None]:
    return lambda state: state["param_groups"][0].__setitem__(key, value)


def set_moment(name: str, change) -> Callable[[dict], None]:
    return lambda state: state["state"][0].__setitem__(name, change(state["state"][0][name]))


#: optimizer and scheduler states that decode but do not fit the run: (stem, change, what is said)
MISFITS = {
    "moment transposed": (
        "optimizer",
        set_moment("exp_avg", lambda t: t.T.contiguous()),
        "optimizer.json: state[0]: exp_avg and exp_avg_sq differ in shape [(2, 3), (3, 2)]",
    ),
    "both moments transposed": (
        "optimizer",
        lambda s: [set_moment(m, lambda t: t.T.contiguous())(s) for m in ("exp_avg", "exp_avg_sq")],
        "optimizer.json: state[0] of agent_0 has shape [2, 3], one more than agent_0's tensors have "
        "(their shapes: [[3, 2]])",
    ),
    "lr text": (
        "optimizer",
        set_group("lr", "0.001"),
        "optimizer.json: param_groups[0].lr must be a number, got str '0.001'",
    ),
    "betas of three": (
        "optimizer",
        set_group("betas", (0.9, 0.99, 0.5)),
        "optimizer.json: param_groups[0].betas must be a list of 2 values, got tuple",
    ),
    "amsgrad number": (
        "optimizer",
        set_group("amsgrad", 1),
        "optimizer.json: param_groups[0].amsgrad must be true or false, got int 1",
    ),
    "params text": (
        "optimizer",
        set_group("params", ["0"]),
        "optimizer.json: param_groups[0].params must be a list of values each an integer, got list",
    ),
    "a parameter too many": (
        "optimizer",
        set_group("params", [0, 1]),
        "optimizer.json: param_groups[0] (agent_0) lists parameters [0, 1], but agent_0 has 1 tensors",
    ),
    "groups of another team": (
        "optimizer",
        set_group("adapter", "agent_7"),
        "optimizer.json: parameter groups for ['agent_7', 'agent_1'], but the checkpoint trains "
        "['agent_0', 'agent_1']",
    ),
    "step of two": (
        "optimizer",
        set_moment("step", lambda t: torch.ones(2)),
        "optimizer.json: state[0].step must hold one number, got shape [2]",
    ),
    "last_epoch text": (
        "scheduler",
        lambda s: s.__setitem__("last_epoch", "1"),
        "scheduler.json: last_epoch must be an integer, got str '1'",
    ),
    "base_lrs text": (
        "scheduler",
        lambda s: s.__setitem__("base_lrs", ["0.001", 0.001]),
        "scheduler.json: base_lrs must be a list of values each a number, got list",
    ),
    "one rate for two groups": (
        "scheduler",
        lambda s: s.__setitem__("base_lrs", [0.001]),
        "scheduler.json: base_lrs holds 1 values, the optimizer has 2 parameter groups",
    ),
}


@pytest.mark.parametrize("name", MISFITS)
def test_state_that_does_not_fit_the_run_is_named_before_loading(tmp_path, name):
    """Shapes and types that ``load_state_dict`` takes without a word and the first optimizer step
    trips over (after a debate has run): compared with what the resuming run builds, before it loads."""
    folder = fabricated_checkpoint(tmp_path)
    stem, change, needle = MISFITS[name]
    edit_state(folder, stem, change)
    with pytest.raises(ckpt.CheckpointError) as e:
        verify(folder)
    assert str(e.value).startswith(f"{folder / needle.split(':')[0]}:") and needle in str(e.value), e.value
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("name", ["both moments transposed", "lr text", "last_epoch text"])
def test_the_trainer_refuses_a_misfit_state_before_any_model_loads(
    tokenizer_path, tmp_path, monkeypatch, name
):
    """The three cases of issue 26: before, ``--resume`` debated, then failed at the first optimizer
    step with a traceback naming no file."""
    from train_helpers import tiny_config
    from transformers import AutoModelForCausalLM

    from udpo.training.trainer import Trainer

    monkeypatch.setattr(
        AutoModelForCausalLM, "from_pretrained", lambda *a, **k: pytest.fail("a model loaded")
    )
    folder = fabricated_checkpoint(tmp_path)
    stem, change, needle = MISFITS[name]
    edit_state(folder, stem, change)
    with pytest.raises(ckpt.CheckpointError, match=re.escape(needle)):
        Trainer(tiny_config(tokenizer_path, folder.parents[1], resume=str(folder)))


def test_against_the_live_optimizer_each_parameter_is_compared_in_order(tmp_path):
    """Headers name tensors, not the optimizer's order, so two moments swapped between parameters of
    transposed shapes pass them; the run's own optimizer, once built, tells."""
    params = [torch.nn.Parameter(torch.randn(2, 3)), torch.nn.Parameter(torch.randn(3, 2))]
    opt = torch.optim.AdamW([{"params": params, "adapter": "agent_0"}])
    for p in params:
        p.grad = torch.randn_like(p)
    opt.step()
    state = opt.state_dict()
    state["state"][0], state["state"][1] = state["state"][1], state["state"][0]
    where = tmp_path / "optimizer.json"
    assert ckpt.check_optimizer_state(where, state, {"agent_0": [(3, 2), (2, 3)]}) == 1
    with pytest.raises(ckpt.CheckpointError) as e:
        ckpt.check_optimizer_state(where, state, *ckpt.live_tensors(opt))
    assert str(e.value).startswith(f"{where}: state[0] (of agent_0) has shape [3, 2], its parameter [2, 3]")
    # through verify: the run's optimizer and schedule, types included (initial_lr is the schedule's)
    folder = fabricated_checkpoint(tmp_path)
    _, opt, sched = optimizer_and_scheduler()
    verify(folder, optimizer=opt, scheduler=sched)
    edit_state(folder, "optimizer", set_group("initial_lr", "1e-3"))
    verify(folder)  # AdamW alone has no initial_lr: only the live optimizer knows its type
    with pytest.raises(ckpt.CheckpointError, match=r"param_groups\[0\]\.initial_lr must be a number"):
        verify(folder, optimizer=opt, scheduler=sched)


DAMAGES = [
    "no world_size",
    "files not marks",
    "last_evaluation text",
    "garbage scheduler",
    "garbage optimizer tensors",
    "missing optimizer tensors",
    "garbage adapter",
    "missing rng",
    "deep rng",
    "adapter is a number",
    "calibration list",
]


@pytest.mark.parametrize("name", DAMAGES)
def test_a_damaged_checkpoint_is_named_before_loading(tmp_path, name):
    folder = fabricated_checkpoint(tmp_path)
    needle = damage(folder, name)
    with pytest.raises(ckpt.CheckpointError) as e:
        verify(folder)
    assert needle in str(e.value) and "\n" not in str(e.value)


def name_adapter(folder: Path, adapter: str) -> None:
    team = json.loads((folder / "team.json").read_text())
    team["agents"][0]["adapter"] = adapter
    (folder / "team.json").write_text(json.dumps(team))


@pytest.mark.parametrize("adapter", ["/etc", "../../elsewhere", "adapters/../../../elsewhere"])
def test_a_manifest_naming_a_folder_outside_the_team_is_refused(tmp_path, capsys, adapter):
    """``udpo export``, the checkpoint check and the manifest reader refuse it for what it is, not
    because the outside folder happens to lack an adapter (``/etc/adapter_config.json is missing``)."""
    outside = tmp_path / "elsewhere"  # what ../../elsewhere reaches: a complete adapter, outside
    shutil.copytree(fabricated_checkpoint(tmp_path / "a") / "adapters" / "agent_0", outside)
    folder = fabricated_checkpoint(tmp_path / "b" / "c")
    name_adapter(folder, adapter)
    needle = f"{folder / 'team.json'}: agents[0].adapter {adapter!r} points outside the team folder"
    with pytest.raises(ValueError, match=re.escape(needle)):
        TeamManifest.load(folder)
    with pytest.raises(ckpt.CheckpointError, match=re.escape(needle)):
        verify(folder)
    from udpo.cli import main

    assert main(["export", str(folder), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("what", ["file", "folder"])
def test_a_link_leading_out_of_the_team_is_refused(tmp_path, what):
    folder = fabricated_checkpoint(tmp_path / "run")
    secret, spare = tmp_path / "secret", folder / "spare"
    shutil.copytree(folder / "adapters" / "agent_1", secret)
    shutil.copytree(folder / "adapters" / "agent_1", spare)
    if what == "file":
        link = folder / "adapters" / "agent_1" / "adapter_model.safetensors"
        link.unlink()
        link.symlink_to(secret / "adapter_model.safetensors")
    else:
        link = folder / "adapters" / "agent_1"
        shutil.rmtree(link)
        link.symlink_to(secret)
    # the target is shown to 100 characters at most (a hostile link may be long)
    needle = f"{link} is a link to {str(link.readlink())!r:.100}, outside the team folder {folder}"
    with pytest.raises(ckpt.CheckpointError, match=re.escape(needle)):
        verify(folder)
    link.unlink()  # a link that stays inside the team is fine
    link.symlink_to(spare / link.name if what == "file" else spare)
    verify(folder)


def test_what_the_resuming_run_needs_must_be_there(tmp_path):
    folder = fabricated_checkpoint(tmp_path)
    (folder / "replay.json").unlink()
    with pytest.raises(ckpt.CheckpointError, match="no replay buffer .* resume with replay: false"):
        verify(folder, replay=True)
    with pytest.raises(ckpt.CheckpointError, match="reference/agent_0/adapter_config.json is missing"):
        verify(folder, reference=True)
    verify(folder, deepspeed=True)  # the project's optimizer state (masters from the adapters)
    masters = {f"agent_{i}": [torch.zeros(2, 3)] for i in range(2)}
    ckpt.save_state(folder / ckpt.MASTER, masters)
    with pytest.raises(
        ckpt.CheckpointError, match="master weights of agent_0 do not have its tensors' shapes"
    ):
        verify(folder, deepspeed=True)
    adapters = [folder / "adapters" / f"agent_{i}" / "adapter_model.safetensors" for i in range(2)]
    masters = {f"agent_{i}": list(load_file(str(path)).values()) for i, path in enumerate(adapters)}
    ckpt.save_state(folder / ckpt.MASTER, masters)
    verify(folder, deepspeed=True)
