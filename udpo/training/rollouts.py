"""The run's debate engine: the rollout backend, the protocol, the agents (one adapter each), debates
shared by the processes, the generators of evaluations, and handing updated adapters to the engine."""

from __future__ import annotations

import random
import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from udpo.config.groups import DebateArgs, ModelArgs, RunArgs, mapping
from udpo.env.backends.base import Backend
from udpo.env.debate import AgentSpec, DebateConfig, DebateEnv
from udpo.env.progress import DebateProgress
from udpo.env.protocols import Protocol, build_protocol
from udpo.env.run_folder import RunFolder
from udpo.env.tasks.base import Question, Task
from udpo.env.trajectory import Trajectory
from udpo.training import distributed as dist

from .data import agent_profiles, debate_config
from .team import DEBATE_SETTINGS

#: on GPUs, the share of device memory a vLLM engine takes beside the trainer when none is configured
COLOCATED_GPU_SHARE = 0.3


def colocated_engine_options(
    model: ModelArgs, world: int, cuda: bool, card_share: float | None = None
) -> dict[str, Any]:
    """Memory and placement of a vLLM engine that shares its device with the trainer.

    On GPUs every process starts one engine on its own device: with ``external_launcher`` vLLM runs the
    engine inside the calling process (on the device the launcher gave it, the way TRL's colocated mode
    does) instead of spawning workers that all see GPU 0; the engine takes ``vllm_gpu_memory_utilization``
    of the device (default ``COLOCATED_GPU_SHARE``, leaving the rest to the trainer's weights, optimizer
    and activations; of the process's ``card_share`` of the card where several runs share it,
    :mod:`udpo.gpu_share`). On CPU the KV cache is sized in GiB (``vllm_kv_cache_gib``, default a tenth
    of RAM).
    """
    share, kv = model.vllm_gpu_memory_utilization, model.vllm_kv_cache_gib
    if cuda and share is None and kv is None:
        share = COLOCATED_GPU_SHARE * (1.0 if card_share is None else card_share)
    options: dict[str, Any] = {"gpu_memory_utilization": share, "kv_cache_gib": kv}
    if cuda and world > 1:
        options["engine_kwargs"] = {"distributed_executor_backend": "external_launcher"}
    return options


class Rollouts:
    """Debates with the policy's current adapters.

    model: the engine's settings (backend, vLLM's sizes); debate: the team, its sampling and protocol; run:
    the seeds, the run folder (adapter files for the engine) and the progress line. backend: a running
    engine of kind ``model.backend`` to use instead of starting one (it is never closed here); otherwise
    one is started for the policy. engine: the DeepSpeed engine of a ZeRO-3 run, whose weights ``hf``
    rollouts gather once per debate call (:func:`udpo.training.distributed.whole_model`)."""

    def __init__(
        self,
        model: ModelArgs,
        debate: DebateArgs,
        run: RunArgs,
        task: Task,
        policy,
        rank: int,
        world: int,
        backend: Backend | None = None,
        engine=None,
        card_share: float | None = None,
    ):
        self.model, self.debate_settings, self.run = model, debate, run
        self.card_share = card_share  # this process's share of its GPU (udpo.gpu_share), None: the whole card
        self.task, self.policy = task, policy
        self.engine = engine if model.backend_capabilities.serves_live_model else None
        self.rank, self.world, self.main = rank, world, rank == 0
        self.folder = RunFolder(Path(run.output_dir))
        self.own_backend = backend is None
        self.backend = backend if backend is not None else self._make_backend()
        self._protocol: Protocol | None = None
        self._sync_dirs: list[Path] = []
        # one line that moves during every debate of the run (warm-up, rollouts, evaluations), drawn
        # below the iteration bar on the main process when ``progress`` is on
        self.line = DebateProgress(desc="rollout", enabled=run.progress and self.main, leave=False)

    def _make_backend(self) -> Backend:
        cfg, debate = self.model, self.debate_settings
        template_kwargs = mapping(debate.chat_template_kwargs) or None
        if cfg.backend_capabilities.serves_live_model:
            return self.policy.rollout_backend(**hf_rollout_settings(cfg, debate))
        from udpo.env.backends import backend_from_settings
        from udpo.env.models import resolve_model

        if cfg.backend_capabilities.remote:  # a vLLM server that loads adapters from this file system
            return backend_from_settings(
                cfg.backend, base_url=cfg.base_url, chat_template_kwargs=template_kwargs
            )
        from udpo.env.backends.vllm import lora_rank_slot  # the one engine started here: vLLM

        return backend_from_settings(
            cfg.backend,
            model=resolve_model(cfg.model),
            # the trainer's own dtype (``dtype: auto`` resolved), not vLLM's "auto" (the checkpoint's):
            # the engine samples in the precision the trainer recomputes the log-probs in
            dtype=str(self.policy.dtype).removeprefix("torch."),
            max_loras=cfg.vllm_max_loras or len(dict.fromkeys(self.policy.adapter_names)),
            max_lora_rank=lora_rank_slot(cfg.lora_r),
            max_model_len=cfg.vllm_max_model_len,
            seed=self.run.seed + self.rank,
            chat_template_kwargs=template_kwargs,
            **colocated_engine_options(cfg, self.world, torch.cuda.is_available(), self.card_share),
        )

    def agent_specs(self) -> list[AgentSpec]:
        """The debate's agents: profile, adapter (served name) and base model of each."""
        models, names = self.model.agent_models, self.policy.adapter_names
        return [
            AgentSpec(profile=profile, adapter=names[i], model=models[i] if models else None)
            for i, profile in enumerate(agent_profiles(self.debate_settings))
        ]

    def debate_config(self) -> DebateConfig:
        return debate_config(self.debate_settings, self.agent_specs())

    def team_settings(self) -> dict[str, Any]:
        """What team.json records of the team besides its adapters and iteration: the task's name, each
        agent's profile and the debate settings the team trains with (``task``, ``profiles``, ``debate``
        of :func:`~udpo.training.team.save_team`)."""
        settings = self.debate_settings
        return {
            "task": settings.task,
            "profiles": [s.profile for s in self.agent_specs()],
            "debate": {key: getattr(settings, key) for key in DEBATE_SETTINGS},
        }

    def protocol(self) -> Protocol:
        """The protocol of rollouts and evaluations (``protocol``, ``protocol_options``), built on first use."""
        if self._protocol is None:
            self._protocol = build_protocol(self.debate_settings.protocol_config(), self.task, self.backend)
        return self._protocol

    def debate(
        self,
        questions: Sequence[Question],
        meta: dict[str, Any],
        protocol: Protocol | None = None,
    ) -> list[Trajectory]:
        """Debate ``questions`` (all processes together, each a shard); every process gets all of them.
        ``protocol``: instead of the run's (e.g. with RMAAC's adversary appended). The progress line is
        labelled by ``meta``'s phase and iteration."""
        idx = dist.shard(len(questions), self.rank, self.world)
        env = DebateEnv(
            self.task, self.backend, self.debate_config(), protocol=protocol or self.protocol(), meta=meta
        )
        self.line.reset(desc=" ".join(str(meta[k]) for k in ("phase", "iteration") if k in meta))
        with dist.whole_model(self.engine):
            local = env.run([questions[i] for i in idx], progress=self.line)
        return dist.gather_in_order(local, idx, len(questions))

    @contextmanager
    def eval_rng(self) -> Iterator[None]:
        """Run a block on random generators seeded with ``eval_seed`` (+ rank), then give training its own
        generators back as they were: evaluations compare on the same draws and leave training unchanged."""
        devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
        py, np_state = random.getstate(), np.random.get_state()
        with torch.random.fork_rng(devices=devices):
            seed = self.run.eval_seed + self.rank
            torch.manual_seed(seed)
            random.seed(seed)
            np.random.seed(seed)
            try:
                yield
            finally:
                random.setstate(py)
                np.random.set_state(np_state)

    def sync_adapters(self, k: int) -> None:
        """Give the rollout engine the current adapters (hf: nothing to do, it serves the live model)."""
        if self.model.backend_capabilities.serves_live_model:
            return
        folder = self.folder.sync(self.rank, k)
        with self.policy.full_adapters():
            paths = self.policy.save_adapters(folder)
        for name, path in paths.items():
            self.backend.load_adapter(name, path)
        self._sync_dirs.append(folder)
        while len(self._sync_dirs) > 2:  # the engine may still read the previous files
            shutil.rmtree(self._sync_dirs.pop(0), ignore_errors=True)

    def close(self) -> None:
        """Stop the engine started here (a backend passed in stays open) and the protocol's own models."""
        self.line.close()
        if self._protocol is not None:
            self._protocol.close()
            self._protocol = None
        if self.own_backend:
            self.backend.close()
            self.own_backend = False  # closed once


def hf_rollout_settings(model: ModelArgs, debate: DebateArgs) -> dict[str, Any]:
    """What the hf backend of a run's rollouts is built with besides its model: the batch, the chat
    template's options and the decode path."""
    return {
        "max_batch": max(debate.debate_batch_size * debate.n_agents, 1),
        "chat_template_kwargs": mapping(debate.chat_template_kwargs) or None,
        "decode": model.hf_decode,
        "decode_shapes": model.hf_decode_shapes,
    }
