"""A trained team on disk: ``team.json`` plus one PEFT adapter folder per agent.

``team.json`` names the base model, each agent's adapter folder (relative to the team folder), system
prompt (profile) and base model (heterogeneous teams), the LoRA settings and the training iteration.
Checkpoints, exports, evaluation and resumption all read it through :class:`TeamManifest`.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from udpo.env.backends.base import Backend
from udpo.env.debate import AgentSpec
from udpo.env.jsonl import brief, write_json

TEAM_FILE = "team.json"
#: the files of one PEFT adapter folder
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
#: the debate settings a trained team records in team.json ("debate"), with their types
DEBATE_SETTINGS: dict[str, type | tuple[type, ...]] = {
    "rounds": int,
    "max_tokens": int,
    "temperature": (int, float),
    "top_p": (int, float),
}


@dataclass
class AgentEntry:
    """One agent: ``name``, ``adapter`` folder (relative to the team folder), ``profile`` (system prompt,
    None: the task's default), ``base_model`` (None: the team's), ``merged`` (full-model folder written
    by ``udpo export --merge``, else None)."""

    name: str
    adapter: str
    profile: str | None = None
    base_model: str | None = None
    merged: str | None = None

    @property
    def adapter_name(self) -> str:
        """The name the adapter is served under (agents sharing a folder share the name)."""
        return Path(self.adapter).name


@dataclass
class TeamManifest:
    """Contents of ``team.json``. ``debate``: the debate settings the team was trained with (keys of
    :data:`DEBATE_SETTINGS`; empty for a team saved outside training), which ``udpo eval --checkpoint``
    debates with unless told otherwise. ``root``: the folder it was loaded from or saved to (not written)."""

    base_model: str
    agents: list[AgentEntry]
    shared_adapter: bool = False
    task: str | None = None
    lora: dict = field(default_factory=dict)
    iteration: int = 0
    debate: dict = field(default_factory=dict)
    root: Path | None = field(default=None, compare=False, repr=False)

    @property
    def n_agents(self) -> int:
        return len(self.agents)

    @property
    def heterogeneous(self) -> bool:
        return len({a.base_model or self.base_model for a in self.agents}) > 1

    def to_dict(self) -> dict:
        return {
            "base_model": self.base_model,
            "n_agents": self.n_agents,
            "shared_adapter": self.shared_adapter,
            "task": self.task,
            "agents": [asdict(a) for a in self.agents],
            "lora": dict(self.lora),
            "iteration": self.iteration,
            "debate": dict(self.debate),
        }

    def save(self, directory: str | os.PathLike) -> Path:
        """Write ``directory/team.json`` (atomically: a crash leaves the old file or the new one)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / TEAM_FILE
        write_json(path, self.to_dict())
        self.root = directory
        return path

    @classmethod
    def load(cls, directory: str | os.PathLike) -> TeamManifest:
        """Read ``team.json`` from a team folder (or the file's own path); errors name the file and key."""
        path = Path(directory)
        path = path if path.name == TEAM_FILE else path / TEAM_FILE
        if not path.exists():
            raise FileNotFoundError(f"no {TEAM_FILE} in {path.parent}: not a team or checkpoint folder")
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
            raise ValueError(f"{path}: invalid JSON ({brief(e)})") from None
        if not isinstance(d, dict):
            raise ValueError(f"{path}: expected a JSON object, got {type(d).__name__}")
        _check_no_links_out(path.parent)
        for key in ("base_model", "agents"):
            if key not in d:
                raise ValueError(f"{path}: missing key {key!r}")
        if not isinstance(d["agents"], list) or not d["agents"]:
            raise ValueError(f"{path}: 'agents' must be a non-empty list")
        agents = []
        for k, a in enumerate(d["agents"]):
            if not isinstance(a, dict) or "name" not in a or "adapter" not in a:
                raise ValueError(f"{path}: agents[{k}] needs 'name' and 'adapter'")
            unknown = sorted(set(a) - set(AgentEntry.__dataclass_fields__))
            if unknown:
                raise ValueError(f"{path}: agents[{k}] has unknown key(s) {unknown}")
            for key in ("name", "adapter"):
                if not isinstance(a[key], str) or not a[key].strip():
                    raise ValueError(
                        f"{path}: agents[{k}].{key} must be a non-empty string, got {a[key]!r:.60}"
                    )
            _check_types(
                path,
                a,
                {"profile": (str, type(None)), "base_model": (str, type(None)), "merged": (str, type(None))},
                f"agents[{k}].",
            )
            if Path(a["adapter"]).name in ("", ".", ".."):
                raise ValueError(
                    f"{path}: agents[{k}].adapter {a['adapter']!r} does not name an adapter folder"
                )
            for key in ("adapter", "merged"):
                if a.get(key) is not None:
                    _check_inside(path, a[key], f"agents[{k}].{key}")
            agents.append(AgentEntry(**a))
        _check_types(
            path,
            d,
            {
                "base_model": str,
                "n_agents": int,
                "shared_adapter": bool,
                "task": (str, type(None)),
                "lora": (dict, type(None)),
                "iteration": int,
                "debate": dict,
            },
        )
        debate = d.get("debate", {})
        unknown = sorted(set(debate) - set(DEBATE_SETTINGS))
        if unknown:
            raise ValueError(
                f"{path}: debate has unknown key(s) {unknown}; known: {', '.join(DEBATE_SETTINGS)}"
            )
        _check_types(path, debate, DEBATE_SETTINGS, "debate.")
        if not d["base_model"].strip():
            raise ValueError(f"{path}: 'base_model' is empty")
        if d.get("n_agents", len(agents)) != len(agents):
            raise ValueError(f"{path}: n_agents is {d['n_agents']} but {len(agents)} agents are listed")
        return cls(
            base_model=d["base_model"],
            agents=agents,
            shared_adapter=d.get("shared_adapter", False),
            task=d.get("task"),
            lora=dict(d.get("lora") or {}),
            iteration=d.get("iteration", 0),
            debate=dict(debate),
            root=path.parent,
        )

    @classmethod
    def from_policy(
        cls,
        policy,
        task: str | None = None,
        profiles: list[str | None] | None = None,
        iteration: int = 0,
        debate: dict | None = None,
    ) -> TeamManifest:
        """The manifest of a :class:`~udpo.training.policy.MultiAgentPolicy` whose adapters are (to be) saved
        under ``adapters/<name>`` (``policy.save_adapters(team_folder / "adapters")``); ``debate``: the
        settings it was trained with."""
        if profiles is not None and len(profiles) != policy.n_agents:
            raise ValueError(f"{len(profiles)} profiles for {policy.n_agents} agents")
        return cls(
            base_model=policy.base_model,
            agents=[
                AgentEntry(
                    name=f"agent_{i}",
                    adapter=f"adapters/{policy.adapter_names[i]}",
                    profile=profiles[i] if profiles else None,
                    base_model=policy.agent_models[i],
                )
                for i in range(policy.n_agents)
            ],
            shared_adapter=policy.shared_adapter,
            task=task,
            lora=policy.lora.to_dict(),
            iteration=iteration,
            debate=dict(debate or {}),
        )

    def _root(self, root: str | os.PathLike | None) -> Path:
        if root is None and self.root is None:
            raise ValueError("this manifest was neither loaded nor saved: pass the team folder as root")
        return Path(root) if root is not None else self.root  # type: ignore[return-value]

    def adapter_paths(self, root: str | os.PathLike | None = None) -> dict[str, str]:
        """Adapter name -> absolute PEFT folder, once per distinct adapter."""
        base = self._root(root)
        return {a.adapter_name: str((base / a.adapter).resolve()) for a in self.agents}

    def agent_specs(self) -> list[AgentSpec]:
        """Debate agent specs serving each agent with its adapter (and its base model, when they differ)."""
        return [
            AgentSpec(
                profile=a.profile,
                adapter=a.adapter_name,
                model=(a.base_model or self.base_model) if self.heterogeneous else None,
            )
            for a in self.agents
        ]

    def check_adapters(self, root: str | os.PathLike | None = None) -> None:
        """Raise ValueError naming the file unless every adapter folder holds a loadable PEFT adapter
        (:func:`check_adapter_folder`); cheap, so callers run it before a model loads."""
        for folder in self.adapter_paths(root).values():
            check_adapter_folder(folder)

    def register(self, backend: Backend, root: str | os.PathLike | None = None) -> list[str]:
        """Load every adapter into ``backend`` under its name (checked first); returns the names."""
        self.check_adapters(root)
        paths = self.adapter_paths(root)
        for name, folder in paths.items():
            backend.load_adapter(name, folder)
        return list(paths)


def check_adapter_folder(folder: str | os.PathLike) -> None:
    """Raise ValueError naming the file unless ``folder`` holds ``adapter_config.json`` (a JSON object)
    and ``adapter_model.safetensors`` (whose header parses; safetensors never runs code)."""
    from safetensors import safe_open

    config, weights = (Path(folder, f) for f in ADAPTER_FILES)
    for path in (config, weights):
        if not path.is_file():
            raise ValueError(f"{path} is missing")
    try:
        if not isinstance(json.loads(config.read_text(encoding="utf-8")), dict):
            raise ValueError("not an object")
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise ValueError(f"{config}: not a JSON object ({brief(e)})") from None
    try:
        with safe_open(str(weights), framework="pt") as fh:
            fh.keys()
    except Exception as e:  # safetensors raises its own error types for damaged files
        raise ValueError(f"{weights}: not a safetensors file ({brief(e)})") from None


def _check_inside(manifest: Path, relative: str, key: str) -> None:
    """Raise ValueError naming ``manifest`` and ``key`` unless ``relative`` is a path inside the team
    folder (the manifest's folder), links followed: a shared team must not make the program read,
    load or copy anything outside it."""
    root = manifest.parent.resolve()
    target = (root / relative).resolve()
    if Path(relative).is_absolute() or not target.is_relative_to(root):
        raise ValueError(
            f"{manifest}: {key} {relative!r:.100} points outside the team folder {manifest.parent}; a "
            f"team names only folders inside its own (e.g. adapters/agent_0)"
        )


def _check_no_links_out(root: Path) -> None:
    """Raise ValueError naming the link when a symbolic link under the team folder ``root`` leads
    outside it (a file or folder planted to be read, loaded or copied in its place)."""
    inside = root.resolve()
    for folder, dirs, files in os.walk(root):
        for name in (*dirs, *files):
            entry = Path(folder, name)
            if entry.is_symlink() and not entry.resolve().is_relative_to(inside):
                raise ValueError(
                    f"{entry} is a link to {os.readlink(entry)!r:.100}, outside the team folder {root}; a "
                    f"team holds its own files"
                )


def _check_types(path: Path, d: dict, types: dict[str, type | tuple[type, ...]], prefix: str = "") -> None:
    """Raise ValueError naming ``path`` and the key when a present key of ``d`` has the wrong type."""
    for key, kind in types.items():
        value = d.get(key)
        kinds = kind if isinstance(kind, tuple) else (kind,)
        wrong = key in d and (not isinstance(value, kinds) or isinstance(value, bool) and bool not in kinds)
        if wrong:
            raise ValueError(
                f"{path}: {prefix}{key} has the wrong type ({type(value).__name__} {value!r:.60})"
            )


def save_team(
    policy,
    directory: str | os.PathLike,
    task: str | None = None,
    profiles: list[str | None] | None = None,
    iteration: int = 0,
    debate: dict | None = None,
) -> TeamManifest:
    """Write a policy's adapters to ``directory/adapters/<name>`` and ``directory/team.json``."""
    policy.save_adapters(Path(directory) / "adapters")
    manifest = TeamManifest.from_policy(
        policy, task=task, profiles=profiles, iteration=iteration, debate=debate
    )
    manifest.save(directory)
    return manifest
