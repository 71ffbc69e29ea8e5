"""Export a trained team for serving: one PEFT adapter per agent and a manifest, optionally merged models.

``OUT/adapters/<name>/`` holds ``adapter_config.json`` + ``adapter_model.safetensors`` (loadable by
``PeftModel.from_pretrained``, ``AutoPeftModelForCausalLM`` and by vLLM as a ``LoRARequest``) and a model card
``README.md`` (:mod:`udpo.training.model_card`). The adapter names its base so that another machine's
loaders find it: a Hub id (with the commit this machine's Hub cache holds) or a folder as the user gave it,
the packaged SmolLM2 (an alias, de-quantized into this machine's cache) by the Hub id of its model, with the
tokenizer trained with beside it; ``base_models`` names a base otherwise. No file names this machine's
cache. ``OUT/team.json`` names the agents,
their base model(s) and profiles; ``OUT/critic/`` holds the centralized critic of a MAPPO or RMAAC
run (its adapter and value head, :class:`udpo.algorithms.critic.Critic`). With ``merge=True`` every adapter is also folded into its base model,
``OUT/merged/<name>/`` (safetensors + tokenizer, loadable by ``AutoModelForCausalLM``). Trainer state
(optimizer, replay buffer, ...) is left behind.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from tqdm.auto import tqdm

from udpo.env.jsonl import write_json
from udpo.env.models import hub_revision, portable_name
from udpo.env.run_folder import (
    CHECKPOINTS_DIR,
    DEBATES,
    METRICS,
    TRAJECTORIES_DIR,
    RunFolder,
    iteration_folders,
)
from udpo.training.model_card import ExportBase, adapter_card, merged_card
from udpo.training.team import ADAPTER_FILES, TEAM_FILE, TeamManifest

#: what an export folder holds
EXPORT_ENTRIES = (TEAM_FILE, "adapters", "merged", "critic")
#: files and folders that mark a run directory (training or ``udpo debate`` / ``udpo eval``)
RUN_MARKS = (CHECKPOINTS_DIR, "trainer_state.json", METRICS, TRAJECTORIES_DIR, DEBATES)


def find_checkpoint(path: str | os.PathLike) -> Path:
    """A team folder itself, or the latest ``checkpoints/iter_*`` of a run directory."""
    path = Path(path)
    if (path / TEAM_FILE).exists():
        return path
    candidates = [p for _, p in iteration_folders(RunFolder(path).checkpoints) if (p / TEAM_FILE).exists()]
    if not candidates:
        raise FileNotFoundError(f"{path} has no {TEAM_FILE} and no checkpoints/iter_*/{TEAM_FILE}")
    return candidates[-1]


def export_team(
    checkpoint: str | os.PathLike,
    out: str | os.PathLike,
    merge: bool = False,
    dtype: str = "auto",
    overwrite: bool = False,
    base_models: str | Mapping[str, str] | None = None,
    command: str | None = None,
) -> TeamManifest:
    """Export the team in ``checkpoint`` (team folder or run directory) to ``out``; returns the new manifest.

    dtype (merged models): "auto" keeps the base model's stored dtype; "fp32", "bf16" or "fp16".
    base_models: the team's base model (as ``team.json`` names it) -> the name the adapters and cards give
    it instead of :func:`export_base`'s (one name: the base of a team with one) (a folder or Hub id on the machines that load them); ``team.json``
    keeps the name trained on, which :meth:`udpo.Team.from_pretrained` loads. command: the line the cards
    say wrote them (default the ``udpo export`` line of ``checkpoint`` and ``out``).
    The export is assembled in a temporary folder and moved into place at the end, so a failure leaves
    ``out`` untouched; an existing non-empty ``out`` is replaced only with ``overwrite=True``, and only
    when it holds an earlier export and nothing else (see :func:`check_out`).
    """
    source = find_checkpoint(checkpoint)
    team = TeamManifest.load(source)
    trained = {a.adapter_name: a.base_model or team.base_model for a in team.agents}
    renamed = chosen_names(base_models, list(dict.fromkeys(trained.values())))
    bases = {name: export_base(model, renamed.get(model)) for name, model in trained.items()}
    if command is None:
        flags = [" --merge" if merge else "", f" --dtype {dtype}" if merge and dtype != "auto" else ""]
        flags += [f" --base-model {n}" for n in [base_models] if isinstance(n, str)]
        flags += [f" --base-model {m}={n}" for m, n in renamed.items() if not isinstance(base_models, str)]
        command = f"udpo export {shown(checkpoint)} --out {shown(out)}{''.join(flags)}"
    out = Path(out)
    check_out(out, source, overwrite)
    target = out.resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        team.check_adapters(source)
        adapters = team.adapter_paths(source)
        for name, folder in adapters.items():
            write_adapter(Path(folder), staging / "adapters" / name, bases[name])
            card = adapter_card(team, name, bases[name], command)
            (staging / "adapters" / name / "README.md").write_text(card, encoding="utf-8")
        if (source / "critic").is_dir():  # a baseline's critic travels with its team
            shutil.copytree(source / "critic", staging / "critic")
        agents = [replace(a, adapter=f"adapters/{a.adapter_name}", merged=None) for a in team.agents]
        if merge:
            for name in tqdm(list(adapters), desc="merge", unit="adapter"):
                merged = staging / "merged" / name
                merge_adapter(trained[name], staging / "adapters" / name, merged, dtype)
                card = merged_card(team, name, bases[name], command)
                (merged / "README.md").write_text(card, encoding="utf-8")
            agents = [replace(a, merged=f"merged/{a.adapter_name}") for a in agents]
        exported = replace(team, agents=agents)
        exported.save(staging)
        if target.exists():  # an earlier export (check_out): set aside, replaced, then removed
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}-old-", dir=target.parent))
            os.replace(target, old / "export")
            os.replace(staging, target)
            shutil.rmtree(old)
        else:
            os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    exported.root = out
    return exported


def chosen_names(base_models: str | Mapping[str, str] | None, trained: list[str]) -> dict[str, str]:
    """``base_models`` (see :func:`export_team`) as base trained on -> name, checked against the team's bases."""
    if base_models is None:
        return {}
    if isinstance(base_models, str):
        if len(trained) > 1:
            raise ValueError(
                f"the team has {len(trained)} base models ({', '.join(trained)}): name each as "
                f"--base-model MODEL=NAME"
            )
        return {trained[0]: base_models}
    unknown = [m for m in base_models if m not in trained]
    if unknown:
        raise ValueError(
            f"--base-model names {', '.join(unknown)}, which the team was not trained on "
            f"(its base models: {', '.join(trained)})"
        )
    return dict(base_models)


def export_base(trained: str, name: str | None = None) -> ExportBase:
    """How exported adapters name the base model ``trained`` (as ``team.json`` names it): ``name`` when
    given, else :func:`udpo.env.models.portable_name` (an alias by its Hub id); a Hub id trained on
    carries the commit this machine's Hub cache holds for it, when it holds one."""
    if name is not None:
        if not name.strip():
            raise ValueError("--base-model names an empty base model")
        return ExportBase(name, None, trained)
    portable = portable_name(trained)
    hub_id = portable == trained and trained.count("/") == 1 and not Path(trained).expanduser().exists()
    return ExportBase(portable, hub_revision(trained) if hub_id else None, trained)


def write_adapter(source: Path, folder: Path, base: ExportBase) -> None:
    """Copy the PEFT adapter in ``source`` to ``folder``, its config naming ``base`` (name and revision,
    instead of the path it was loaded from here); a rebuilt base's tokenizer (the one trained with) beside it."""
    folder.mkdir(parents=True)
    shutil.copy2(source / ADAPTER_FILES[1], folder / ADAPTER_FILES[1])
    config = json.loads((source / ADAPTER_FILES[0]).read_text(encoding="utf-8"))
    write_json(
        folder / ADAPTER_FILES[0], {**config, "base_model_name_or_path": base.name, "revision": base.revision}
    )
    if base.rebuilt:
        from transformers import AutoTokenizer

        from udpo.env.models import resolve_model

        AutoTokenizer.from_pretrained(resolve_model(base.trained)).save_pretrained(str(folder))


def shown(path: str | os.PathLike) -> str:
    """A path as a card shows it: as given when relative, else only its name (no machine's folders)."""
    text = os.fspath(path)
    return text if not (Path(text).is_absolute() or text.startswith("~")) else f".../{Path(text).name}"


def check_out(out: Path, source: Path, overwrite: bool) -> None:
    """Refuse an output folder the export could damage: the working directory or a folder above it, the
    checkpoint itself or a folder holding it, a folder that holds a run or lies inside one, a file.
    A non-empty ``out`` is replaced only with ``overwrite`` and only when it holds an earlier export
    (``team.json``, ``adapters/``, ``merged/``) and nothing else: an export never deletes what it did
    not write."""
    target, cwd, src = out.resolve(), Path.cwd().resolve(), source.resolve()
    if target == cwd or target in cwd.parents:
        raise ValueError(
            f"--out {out} is the working directory or a folder above it; export into a new folder"
        )
    for folder in (target, *target.parents):
        marks = [m for m in RUN_MARKS if (folder / m).exists()]
        if marks:
            where = "holds" if folder == target else f"lies inside {folder}, which holds"
            raise ValueError(f"--out {out} {where} a run ({', '.join(marks)}); export into a new folder")
    if target == src or target in src.parents or src in target.parents:
        raise ValueError(
            f"--out {out} holds or lies inside the checkpoint {source}; export into a new folder"
        )
    if not target.exists():
        return
    if not target.is_dir():
        raise ValueError(f"--out {out} is a file")
    entries = sorted(p.name for p in target.iterdir())
    if not entries:
        return
    if not overwrite:
        raise ValueError(f"{out} exists and is not empty; choose another --out or pass --overwrite")
    foreign = [e for e in entries if e not in EXPORT_ENTRIES]
    if foreign or TEAM_FILE not in entries:
        raise ValueError(
            f"--overwrite replaces only an earlier export, and {out} holds "
            f"{', '.join(foreign[:5]) or f'no {TEAM_FILE}'}{' ...' if len(foreign) > 5 else ''}; "
            f"export into a new folder"
        )


def merge_adapter(
    base_model: str, adapter: str | os.PathLike, out: str | os.PathLike, dtype: str = "auto"
) -> None:
    """Fold a LoRA adapter into its base model and save the full model (safetensors) with its tokenizer.

    The merge is done in fp32 and the result cast to ``dtype`` ("auto": the base's stored dtype).
    """
    import torch
    from peft import PeftModel
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from udpo.env.backends.machine import pick_dtype
    from udpo.env.models import resolve_model

    path = resolve_model(base_model)
    if dtype == "auto":
        stored = getattr(AutoConfig.from_pretrained(path), "dtype", None)
        target = (
            stored
            if isinstance(stored, torch.dtype)
            else getattr(torch, str(stored or "float32"), torch.float32)
        )
    else:
        target = pick_dtype(dtype, "cpu")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    merged = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    merged.to(target).save_pretrained(str(out), safe_serialization=True)
    AutoTokenizer.from_pretrained(path).save_pretrained(str(out))
