"""Export a trained team for serving: one PEFT adapter per agent and a manifest, optionally merged models.

``OUT/adapters/<name>/`` holds ``adapter_config.json`` + ``adapter_model.safetensors`` (loadable by
``PeftModel.from_pretrained`` and by vLLM as a ``LoRARequest``); ``OUT/team.json`` names the agents,
their base model(s) and profiles. With ``merge=True`` every adapter is also folded into its base model,
``OUT/merged/<name>/`` (safetensors + tokenizer, loadable by ``AutoModelForCausalLM``). Trainer state
(optimizer, replay buffer, ...) is left behind.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

from tqdm.auto import tqdm

from udpo.team import TEAM_FILE, TeamManifest

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


def find_checkpoint(path: str | os.PathLike) -> Path:
    """A team folder itself, or the latest ``checkpoints/iter_*`` of a run directory."""
    path = Path(path)
    if (path / TEAM_FILE).exists():
        return path
    candidates = [p for p in (path / "checkpoints").glob("iter_*") if (p / TEAM_FILE).exists()]
    if not candidates:
        raise FileNotFoundError(f"{path} has no {TEAM_FILE} and no checkpoints/iter_*/{TEAM_FILE}")
    return max(candidates, key=lambda p: int(re.sub(r"\D", "", p.name) or 0))


def export_team(
    checkpoint: str | os.PathLike,
    out: str | os.PathLike,
    merge: bool = False,
    dtype: str = "auto",
    overwrite: bool = False,
) -> TeamManifest:
    """Export the team in ``checkpoint`` (team folder or run directory) to ``out``; returns the new manifest.

    dtype (merged models): "auto" keeps the base model's stored dtype; "fp32", "bf16" or "fp16".
    The export is assembled in a temporary folder and moved into place at the end, so a failure leaves
    ``out`` untouched; an existing non-empty ``out`` is replaced only with ``overwrite=True``.
    """
    source = find_checkpoint(checkpoint)
    team = TeamManifest.load(source)
    out = Path(out)
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise ValueError(f"{out} exists and is not empty; choose another --out or pass --overwrite")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        adapters = team.adapter_paths(source)
        for name, folder in adapters.items():
            for f in ADAPTER_FILES:
                if not Path(folder, f).exists():
                    raise FileNotFoundError(f"adapter {name!r}: missing {f} in {folder}")
            (staging / "adapters" / name).mkdir(parents=True)
            for f in ADAPTER_FILES:
                shutil.copy2(Path(folder, f), staging / "adapters" / name / f)
        agents = [replace(a, adapter=f"adapters/{a.adapter_name}", merged=None) for a in team.agents]
        if merge:
            bases = {a.adapter_name: a.base_model or team.base_model for a in team.agents}
            for name in tqdm(list(adapters), desc="merge", unit="adapter"):
                merge_adapter(bases[name], staging / "adapters" / name, staging / "merged" / name, dtype)
            agents = [replace(a, merged=f"merged/{a.adapter_name}") for a in agents]
        exported = replace(team, agents=agents)
        exported.save(staging)
        if out.exists():
            shutil.rmtree(out)
        os.replace(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    exported.root = out
    return exported


def merge_adapter(
    base_model: str, adapter: str | os.PathLike, out: str | os.PathLike, dtype: str = "auto"
) -> None:
    """Fold a LoRA adapter into its base model and save the full model (safetensors) with its tokenizer.

    The merge is done in fp32 and the result cast to ``dtype`` ("auto": the base's stored dtype).
    """
    import torch
    from peft import PeftModel
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from udpo.env.backends.hf import pick_dtype
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
