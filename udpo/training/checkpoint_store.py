"""Checkpoints that survive being killed at any moment, and exact resumption.

Where checkpoints lie in the run folder: :class:`udpo.env.run_folder.RunFolder`. What one holds::

    checkpoints/iter_000010/
        team.json, adapters/agent_i/          # the team: loadable by export, eval, vLLM
        trainer_state.json                    # iteration, optimizer steps, append-only file marks
        optimizer.{json,safetensors}, scheduler.json, rng.{json,safetensors}, replay.json, calibration.json
        master.{json,safetensors}             # DeepSpeed runs: the adapters' fp32 master weights

Checkpoints are passed around, so loading one never runs code: every file is JSON or safetensors
(:func:`save_state` / :func:`load_state`), nothing is unpickled, and :func:`verify` checks a whole
checkpoint (files, their structure, the adapters' headers) before a model loads. A pickle file in a
checkpoint (a planted one) is refused without being opened. A DeepSpeed run writes its optimizer state
gathered in the same format (:mod:`udpo.training.zero_state`).

A checkpoint is written into a hidden staging folder and renamed into place with ``os.replace``; the
``latest`` pointer is replaced last. A reader therefore sees either the previous checkpoint or the
new one, never half of one. The run's append-only files (trajectory JSONL, metrics.jsonl) keep
growing between checkpoints; ``trainer_state.json`` records their length (lines and bytes) at the
checkpoint, and :func:`rewind_files` cuts them back to it on resume so no iteration is logged twice.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import torch

from udpo.env.jsonl import brief, write_json, write_text_atomic
from udpo.env.run_folder import CALIBRATION, LATEST, RunFolder, iteration_folders, iteration_of
from udpo.training.team import ADAPTER_FILES, TeamManifest, check_adapter_folder

STATE = "trainer_state.json"
#: stem of a DeepSpeed run's fp32 master weights (adapter -> its tensors, in the optimizer's order)
MASTER = "master"
#: suffixes of pickle files (torch.save, pickle): never loaded from a checkpoint
PICKLE_SUFFIXES = (".pt", ".pth", ".pkl", ".pickle", ".bin")
_TENSOR, _TUPLE, _DICT = "__tensor__", "__tuple__", "__dict__"


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete or does not match the run's files."""


def list_checkpoints(run_dir: str | os.PathLike) -> list[Path]:
    """Complete checkpoints of a run (those with a trainer_state.json), oldest first."""
    return [p for _, p in iteration_folders(RunFolder(Path(run_dir)).checkpoints) if (p / STATE).is_file()]


# --- writing ---------------------------------------------------------------------------------
def staging_dir(run_dir: str | os.PathLike, iteration: int) -> Path:
    """An empty hidden folder to write checkpoint ``iteration`` into (leftovers of a crash are removed)."""
    path = RunFolder(Path(run_dir)).checkpoint_staging(iteration)
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def commit(run_dir: str | os.PathLike, staging: Path, iteration: int) -> Path:
    """Move a fully written staging folder into place, then point ``latest`` at it."""
    if not (staging / STATE).is_file():
        raise CheckpointError(f"{staging} has no {STATE}; write the trainer state before committing")
    _fsync_tree(staging)
    folder = RunFolder(Path(run_dir))
    final = folder.checkpoint(iteration)
    if final.exists():  # re-reached after resuming from an older checkpoint: the new one replaces it
        old = folder.checkpoint_replaced(iteration)
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
        os.replace(staging, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(staging, final)
    write_text_atomic(folder.latest, final.name + "\n")
    _fsync_dir(folder.checkpoints)
    return final


def prune(run_dir: str | os.PathLike, keep: int | None) -> list[Path]:
    """Delete all but the newest ``keep`` checkpoints (never the one ``latest`` names)."""
    if keep is None:
        return []
    latest = _read_latest(RunFolder(Path(run_dir)))
    ckpts = list_checkpoints(run_dir)
    doomed = [p for p in ckpts[: max(len(ckpts) - keep, 0)] if p.name != latest]
    for p in doomed:
        shutil.rmtree(p)
    return doomed


# --- reading ---------------------------------------------------------------------------------
def resolve(run_dir: str | os.PathLike, resume: str) -> Path:
    """The checkpoint folder ``resume`` names: ``latest`` (in run_dir), or a checkpoint path."""
    if resume == LATEST:
        folder = RunFolder(Path(run_dir))
        root = folder.checkpoints
        name = _read_latest(folder)
        if name is not None and (root / name / STATE).is_file():
            return root / name
        ckpts = list_checkpoints(run_dir)  # pointer lost (killed between rename and pointer write)
        if not ckpts:
            raise CheckpointError(f"--resume latest: no checkpoint under {root}; start without --resume")
        return ckpts[-1]
    path = Path(resume)
    if not (path / STATE).is_file():
        hint = (
            f" (run dir {path}? use --resume latest with output_dir {path})"
            if RunFolder(path).checkpoints.is_dir()
            else ""
        )
        raise CheckpointError(f"--resume {resume}: not a checkpoint folder, {STATE} missing{hint}")
    return path


def _is_count(value: Any, low: int) -> bool:
    """An integer (not a bool) of at least ``low``."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def read_state(ckpt: Path) -> dict[str, Any]:
    """``trainer_state.json`` of a checkpoint, its keys and types checked."""
    path = ckpt / STATE
    state = read_json(path)
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    counts = {"iteration": 0, "optimizer_steps": 0, "total_iterations": 0, "world_size": 1}
    for key, low in counts.items():
        value = state.get(key)
        if not _is_count(value, low):
            raise CheckpointError(f"{path}: {key!r} must be an integer >= {low}, got {value!r}")
    files = state.get("files")
    if not isinstance(files, dict) or not all(
        isinstance(mark, dict)
        and all(isinstance(mark.get(k), int) and mark[k] >= 0 for k in ("lines", "bytes"))
        for mark in files.values()
    ):
        raise CheckpointError(
            f"{path}: 'files' must map each file to its 'lines' and 'bytes', got {files!r:.100}"
        )
    last = state.get("last_evaluation")
    if last is not None and not _is_count(last, 0):
        raise CheckpointError(f"{path}: 'last_evaluation' must be an integer >= 0 or null, got {last!r}")
    for key in ("history", "config"):
        if not isinstance(state.get(key, {}), dict):
            raise CheckpointError(f"{path}: {key!r} must be an object")
    return state


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise CheckpointError(f"{path}: unreadable ({brief(e)})") from None


# --- trainer state as JSON + safetensors -------------------------------------------------------
def save_state(stem: Path, obj: Any) -> None:
    """Write ``obj`` (nested dicts, lists, tuples, numbers, strings, None and tensors, e.g. an optimizer's
    ``state_dict()``) as ``stem.json`` plus, when it holds tensors, ``stem.safetensors``."""
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    tree = _encode(obj, tensors)
    if tensors:
        save_file(tensors, str(stem.with_suffix(".safetensors")))
    write_json(stem.with_suffix(".json"), tree)


def load_state(stem: Path) -> Any:
    """What :func:`save_state` wrote at ``stem``; a missing, malformed or pickled state is a CheckpointError."""
    path = stem.with_suffix(".json")
    if not path.is_file():
        pickled = [p.name for p in (stem.with_suffix(s) for s in PICKLE_SUFFIXES) if p.exists()]
        if pickled:
            raise _pickle_error(stem.parent / pickled[0])
        raise CheckpointError(f"{path} is missing: the checkpoint is incomplete")
    tree = read_json(path)
    tensors: dict[str, torch.Tensor] = {}
    weights = stem.with_suffix(".safetensors")
    if weights.exists():
        from safetensors.torch import load_file

        try:
            tensors = load_file(str(weights))
        except Exception as e:  # safetensors raises its own error types for damaged files
            raise CheckpointError(f"{weights}: not a safetensors file ({brief(e)})") from None
    try:
        return _decode(tree, tensors)
    except (KeyError, TypeError, ValueError, RecursionError) as e:
        raise CheckpointError(f"{path}: malformed state ({brief(e)})") from None


def _encode(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(obj, torch.Tensor):
        key = str(len(tensors))
        tensors[key] = obj.detach().cpu().contiguous().clone()
        return {_TENSOR: key}
    if isinstance(obj, tuple):
        return {_TUPLE: [_encode(v, tensors) for v in obj]}
    if isinstance(obj, list):
        return [_encode(v, tensors) for v in obj]
    if isinstance(obj, dict):
        if all(isinstance(k, str) for k in obj) and not {_TENSOR, _TUPLE, _DICT} & set(obj):
            return {k: _encode(v, tensors) for k, v in obj.items()}
        return {_DICT: [[_encode(k, tensors), _encode(v, tensors)] for k, v in obj.items()]}
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    raise TypeError(f"cannot save a {type(obj).__name__} in a checkpoint state")


def _decode(tree: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(tree, list):
        return [_decode(v, tensors) for v in tree]
    if isinstance(tree, dict):
        if set(tree) == {_TENSOR}:
            return tensors[tree[_TENSOR]]
        if set(tree) == {_TUPLE}:
            return tuple(_decode(v, tensors) for v in tree[_TUPLE])
        if set(tree) == {_DICT}:
            return {_hashable(_decode(k, tensors)): _decode(v, tensors) for k, v in tree[_DICT]}
        return {k: _decode(v, tensors) for k, v in tree.items()}
    return tree


def _hashable(key: Any) -> Any:
    if isinstance(key, list | dict | torch.Tensor):
        raise TypeError(f"a {type(key).__name__} cannot be a dictionary key")
    return key


def _pickle_error(path: Path) -> CheckpointError:
    return CheckpointError(
        f"{path} is a pickle file; loading it could run any code it holds, so it is refused unopened. "
        f"UDPO writes checkpoint state as JSON and safetensors only"
    )


def verify(
    ckpt: Path,
    *,
    replay: bool,
    reference: bool,
    deepspeed: bool,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
) -> None:
    """Check a whole checkpoint before anything is loaded into a model: the trainer state, every state
    file (decoded), the calibration, the team manifest and each adapter's safetensors header, the
    optimizer and schedule states against what the run trains (:func:`check_optimizer_state`) and, for
    a DeepSpeed run, the master weights; no pickle file.

    replay / reference / deepspeed: whether the resuming run needs the replay buffer, the lagged
    reference adapters, DeepSpeed's master weights. optimizer / scheduler: the run's own, once built (the
    states are then compared with them parameter by parameter; before, with the adapters' headers
    and the types torch gives). Raises CheckpointError naming the file at fault."""
    read_state(ckpt)
    for folder in (ckpt, ckpt / "adapters", *(ckpt / "adapters").glob("*"), *(ckpt / "reference").glob("*")):
        for p in folder.glob("*") if folder.is_dir() else ():
            if p.suffix in PICKLE_SUFFIXES:
                raise _pickle_error(p)
    masters = deepspeed and (ckpt / f"{MASTER}.json").is_file()
    stems = [
        "rng",
        "optimizer",
        "scheduler",
        *([MASTER] if masters else []),
        *(["replay"] if replay else []),
    ]
    states = {}
    for stem in stems:
        if stem == "replay" and not (ckpt / "replay.json").exists():
            raise CheckpointError(
                f"{ckpt} has no replay buffer (written with replay: false); resume with replay: false"
            )
        states[stem] = load_state(ckpt / stem)
    if not isinstance(read_json(ckpt / CALIBRATION), dict):
        raise CheckpointError(f"{ckpt / CALIBRATION}: expected a JSON object")
    try:
        team = TeamManifest.load(ckpt)
    except (OSError, ValueError) as e:
        raise CheckpointError(str(e)) from None
    folders = list(team.adapter_paths(ckpt).values())
    if reference:
        folders += [str(ckpt / "reference" / Path(f).name) for f in folders]
    for adapter in folders:
        try:
            check_adapter_folder(adapter)
        except ValueError as e:
            raise CheckpointError(str(e)) from None
    where = ckpt / "optimizer.json"
    if optimizer is None:
        groups = check_optimizer_state(where, states["optimizer"], trained_tensors(ckpt, team))
    else:
        groups = check_optimizer_state(where, states["optimizer"], *live_tensors(optimizer))
    check_scheduler_state(ckpt / "scheduler.json", states["scheduler"], groups, scheduler)
    if masters:
        check_master_state(ckpt / f"{MASTER}.json", states[MASTER], trained_tensors(ckpt, team))


def check_master_state(where: Path, state: Any, trained: dict[str, list[tuple[int, ...]]]) -> None:
    """Check a DeepSpeed run's master weights (decoded ``master.json``): adapter -> a list of tensors,
    the adapters the checkpoint trains, each with tensors of the shapes its adapter has."""
    if not isinstance(state, dict) or list(state) != [a for a in trained if a != "critic"]:
        raise CheckpointError(f"{where}: expected the master weights of {list(trained)}, got {state!r:.100}")
    for adapter, tensors in state.items():
        if not isinstance(tensors, list) or not all(isinstance(t, torch.Tensor) for t in tensors):
            raise CheckpointError(f"{where}: {adapter} must list tensors")
        if Counter(tuple(t.shape) for t in tensors) != Counter(trained[adapter]):
            raise CheckpointError(
                f"{where}: the master weights of {adapter} do not have its tensors' shapes; they belong to "
                f"another model or LoRA setting"
            )


# --- optimizer and scheduler state against what the resuming run builds ------------------------
def trained_tensors(ckpt: Path, team) -> dict[str, list[tuple[int, ...]]]:
    """The shapes of the tensors the run trains, per optimizer group (each distinct adapter of ``team``
    in agent order, then ``critic`` when the checkpoint holds one), read from the safetensors headers
    without loading a tensor: what the resuming run's optimizer will hold."""
    from udpo.algorithms.critic import HEAD_FILE

    files = {name: [Path(folder, ADAPTER_FILES[1])] for name, folder in team.adapter_paths(ckpt).items()}
    if (ckpt / "critic").is_dir():
        files["critic"] = [ckpt / "critic" / "adapter.safetensors", ckpt / "critic" / HEAD_FILE]
    return {
        name: [shape for path in paths for shape in _header_shapes(path)] for name, paths in files.items()
    }


def _header_shapes(path: Path) -> list[tuple[int, ...]]:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as fh:
            keys = fh.keys()
            return [tuple(fh.get_slice(key).get_shape()) for key in keys]
    except Exception as e:  # missing or damaged: safetensors raises its own error types
        raise CheckpointError(f"{path}: not a safetensors file ({brief(e)})") from None


def live_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict[str, list[tuple[int, ...]]], list[dict]]:
    """What a built optimizer trains: the shapes of each group's parameters in order (keyed by its
    ``adapter``), and its groups' settings (the types a saved state must have)."""
    trained = {g["adapter"]: [tuple(p.shape) for p in g["params"]] for g in optimizer.param_groups}
    return trained, optimizer.state_dict()["param_groups"]


def check_optimizer_state(
    where: Path,
    state: Any,
    trained: dict[str, list[tuple[int, ...]]],
    settings: list[dict] | None = None,
) -> int:
    """Check an optimizer state (decoded ``optimizer.json``) against the groups the run trains: one
    parameter group per entry of ``trained``, in order, each with as many parameters as its tensors,
    moment estimates of their shapes and every setting of the type ``settings`` (the live optimizer's
    groups, :func:`live_tensors`) or, without them, ``torch.optim.AdamW`` gives it. With ``settings``
    the shapes are in parameter order and compared one by one; from :func:`trained_tensors` (headers,
    which name tensors, not the optimizer's order) as a multiset. Returns the number of groups; raises
    CheckpointError naming ``where`` and the key."""
    if not isinstance(state, dict) or not isinstance(state.get("state"), dict):
        raise CheckpointError(f"{where}: expected an object with 'state' (an object) and 'param_groups'")
    groups = state.get("param_groups")
    if not isinstance(groups, list) or not all(isinstance(g, dict) for g in groups):
        raise CheckpointError(f"{where}: 'param_groups' must be a list of objects")
    names = [g.get("adapter") for g in groups]
    if names != list(trained):
        raise CheckpointError(
            f"{where}: parameter groups for {names}, but the checkpoint trains {list(trained)}"
        )
    default = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))]).state_dict()["param_groups"][0]
    seen: set[int] = set()
    for k, (group, shapes) in enumerate(zip(groups, trained.values(), strict=True)):
        key = f"param_groups[{k}]"
        _check_kinds(where, key, group, settings[k] if settings else default)
        params = group.get("params")
        if not isinstance(params, list):
            raise CheckpointError(f"{where}: {key}.params must be a list of parameter indices")
        if len(params) != len(shapes) or seen & set(params) or len(set(params)) != len(params):
            raise CheckpointError(
                f"{where}: {key} ({names[k]}) lists parameters {params!r:.80}, but {names[k]} has "
                f"{len(shapes)} tensors (each parameter once, in one group)"
            )
        seen |= set(params)
        entries = [state["state"].get(i) for i in params]
        _check_moments(where, names[k], entries, params, shapes, in_order=settings is not None)
    unknown = sorted(set(state["state"]) - seen, key=str)
    if unknown:
        raise CheckpointError(f"{where}: 'state' holds parameter(s) {unknown[:5]} of no parameter group")
    return len(groups)


def _check_moments(
    where: Path,
    name: str,
    entries: list[Any],
    params: list[int],
    shapes: list[tuple[int, ...]],
    in_order: bool,
) -> None:
    """Each parameter's AdamW state (absent before its first step): tensors, a one-element ``step``,
    ``exp_avg`` and ``exp_avg_sq`` of one shape, that of its parameter (``in_order``: ``shapes`` are
    the parameters' own) or, together, shapes that the group's tensors have."""
    found = []
    for index, entry, own in zip(params, entries, shapes, strict=True):
        if entry is None:
            continue
        key = f"state[{index}]"
        if not isinstance(entry, dict) or not all(isinstance(v, torch.Tensor) for v in entry.values()):
            raise CheckpointError(f"{where}: {key} must map names to tensors, got {entry!r:.80}")
        if "step" in entry and entry["step"].numel() != 1:
            raise CheckpointError(
                f"{where}: {key}.step must hold one number, got shape {list(entry['step'].shape)}"
            )
        moments = {tuple(entry[m].shape) for m in ("exp_avg", "exp_avg_sq") if m in entry}
        if len(moments) > 1:
            raise CheckpointError(f"{where}: {key}: exp_avg and exp_avg_sq differ in shape {sorted(moments)}")
        if in_order and moments - {own}:
            raise CheckpointError(
                f"{where}: {key} (of {name}) has shape {list(moments.pop())}, its parameter {list(own)}; "
                f"the optimizer state belongs to another model or LoRA setting"
            )
        found += [(index, shape) for shape in moments]
    extra = Counter(shape for _, shape in found) - Counter(shapes)
    if extra:
        index, shape = next((i, s) for i, s in found if s in extra)
        raise CheckpointError(
            f"{where}: state[{index}] of {name} has shape {list(shape)}, one more than {name}'s tensors "
            f"have (their shapes: {[list(x) for x in sorted(set(shapes))]!s:.120}); the optimizer "
            f"state belongs to another model or LoRA setting"
        )


def check_scheduler_state(where: Path, state: Any, groups: int, scheduler: Any = None) -> None:
    """Check a learning-rate schedule's state (decoded ``scheduler.json``): every value of the type the
    run's ``scheduler`` (default: transformers' ``LambdaLR``, which the trainer builds) gives it, one
    learning rate per optimizer group."""
    if scheduler is None:
        from transformers import get_scheduler

        optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))])
        scheduler = get_scheduler("cosine", optimizer, num_warmup_steps=1, num_training_steps=2)
    reference = scheduler.state_dict()
    if not isinstance(state, dict):
        raise CheckpointError(f"{where}: expected an object, got {type(state).__name__}")
    _check_kinds(where, "", state, reference)
    for key in ("base_lrs", "_last_lr", "lr_lambdas"):
        if key in state and len(state[key]) != groups:
            raise CheckpointError(
                f"{where}: {key} holds {len(state[key])} values, the optimizer has {groups} parameter groups"
            )


def _check_kinds(where: Path, prefix: str, saved: dict, reference: dict) -> None:
    """Raise CheckpointError naming ``where`` and the key when a value of ``saved`` is not of the kind
    of the same key in ``reference`` (what torch builds); keys only one of them has are left alone."""
    for key in saved.keys() & reference.keys():
        wanted = _kind_wanted(saved[key], reference[key])
        if wanted is not None:
            name = f"{prefix}.{key}" if prefix else key
            value = saved[key]
            raise CheckpointError(
                f"{where}: {name} must be {wanted}, got {type(value).__name__} {value!r:.60}"
            )


def _kind_wanted(value: Any, reference: Any) -> str | None:
    """None when ``value`` is of the kind of ``reference``, else that kind in words."""
    if isinstance(reference, bool):
        return None if isinstance(value, bool) else "true or false"
    if isinstance(reference, int):
        return None if isinstance(value, int) and not isinstance(value, bool) else "an integer"
    if isinstance(reference, float):
        return None if isinstance(value, int | float) and not isinstance(value, bool) else "a number"
    if reference is None:
        return None if value is None or isinstance(value, bool) else "true, false or null"
    if isinstance(reference, str):
        return None if isinstance(value, str) else "a string"
    if isinstance(reference, dict):
        return None if value is None or isinstance(value, dict) else "an object or null"
    if isinstance(reference, tuple | list):
        return _list_wanted(value, reference)
    return None


def _list_wanted(value: Any, reference: tuple | list) -> str | None:
    """:func:`_kind_wanted` of a sequence: a tuple's length and each element's kind, a list's elements
    each of the kind of its first (a list of one learning rate per group, say)."""
    if isinstance(reference, tuple):
        if not isinstance(value, tuple | list) or len(value) != len(reference):
            return f"a list of {len(reference)} values"
        pairs = list(zip(value, reference, strict=True))
    elif not isinstance(value, list):
        return "a list"
    else:
        pairs = [(v, reference[0]) for v in value] if reference else []
    wanted = next((w for w in (_kind_wanted(v, r) for v, r in pairs) if w is not None), None)
    return None if wanted is None else f"a list of values each {wanted}"


def _read_latest(folder: RunFolder) -> str | None:
    try:
        name = folder.latest.read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return name if iteration_of(name) is not None else None


# --- append-only files -----------------------------------------------------------------------
def file_marks(run_dir: str | os.PathLike, relpaths: list[str]) -> dict[str, dict[str, int]]:
    """Length of each append-only file now: ``{relpath: {"lines": n, "bytes": b}}`` (0 when absent)."""
    marks = {}
    for rel in relpaths:
        path = Path(run_dir) / rel
        if path.exists():
            data = path.read_bytes()
            marks[rel] = {"lines": data.count(b"\n"), "bytes": len(data)}
        else:
            marks[rel] = {"lines": 0, "bytes": 0}
    return marks


def rewind_files(run_dir: str | os.PathLike, marks: dict[str, dict[str, int]]) -> dict[str, int]:
    """Truncate each append-only file back to its recorded length; returns lines dropped per file.

    Raises CheckpointError when a file is shorter than recorded or its kept part does not have the
    recorded number of lines (the file was edited or belongs to another run).
    """
    dropped = {}
    for rel, mark in marks.items():
        path = Path(run_dir) / rel
        size = path.stat().st_size if path.exists() else 0
        if size < mark["bytes"]:
            raise CheckpointError(
                f"{path} has {size} bytes but the checkpoint recorded {mark['bytes']}: the file lost data "
                f"after the checkpoint was written; restore it or start a new run"
            )
        if mark["bytes"] == 0:
            if path.exists():
                dropped[rel] = _count_lines(path.read_bytes())
                path.unlink()
            continue
        with open(path, "rb+") as fh:
            kept = fh.read(mark["bytes"])
            lines = kept.count(b"\n")
            if lines != mark["lines"] or not kept.endswith(b"\n"):
                raise CheckpointError(
                    f"{path}: its first {mark['bytes']} bytes hold {lines} lines, the checkpoint "
                    f"recorded {mark['lines']}; the file does not belong to this checkpoint"
                )
            dropped[rel] = _count_lines(fh.read())
            fh.truncate(mark["bytes"])
            fh.flush()
            os.fsync(fh.fileno())
    return dropped


def _count_lines(data: bytes) -> int:
    """Lines in ``data``, a half-written last line included."""
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)


# --- random number generators ----------------------------------------------------------------
def rng_state() -> dict[str, Any]:
    """Python, NumPy and torch (CPU and CUDA) generator states of this process (what :func:`save_state`
    can write: NumPy's key as a list of integers)."""
    numpy_state = np.random.get_state(legacy=False)
    numpy_state["state"] = {**numpy_state["state"], "key": numpy_state["state"]["key"].tolist()}
    state = {"python": random.getstate(), "numpy": numpy_state, "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore :func:`rng_state`; a state of the wrong shape is a ValueError."""
    try:
        numpy_state = dict(state["numpy"])
        numpy_state["state"] = {
            **numpy_state["state"],
            "key": np.asarray(numpy_state["state"]["key"], dtype=np.uint32),
        }
        random.setstate(state["python"])
        np.random.set_state(numpy_state)
        torch.set_rng_state(state["torch"])
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda"])
    except (KeyError, TypeError, ValueError, RuntimeError, OverflowError) as e:
        raise ValueError(f"not a random-generator state ({brief(e)})") from None


# --- fsync helpers ---------------------------------------------------------------------------
def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _fsync_tree(path: Path) -> None:
    for p in sorted(path.rglob("*"), reverse=True):
        if p.is_file():
            with open(p, "rb") as fh:
                os.fsync(fh.fileno())
        else:
            _fsync_dir(p)
    _fsync_dir(path)
