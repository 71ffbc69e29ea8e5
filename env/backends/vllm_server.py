"""Start a local vLLM OpenAI-compatible server in a subprocess, for the ``openai`` backend.

Used by the tests and handy on one machine; on a cluster, start ``vllm serve`` yourself and point
``OpenAIBackend(base_url=...)`` at it. The server process and every process it starts form one
process group, which ``stop`` (or leaving the ``with`` block) terminates.

    with VLLMServer("smollm2-135m-instruct", lora_modules={"agent0": "ckpt/agent0"}) as server:
        backend = OpenAIBackend(base_url=server.url)
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from .base import BackendError


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class VLLMServer:
    """``python -m vllm.entrypoints.openai.api_server`` on ``host:port``.

    model: alias, folder or Hub id; served under ``served_model_name`` (default: ``model`` as given).
    port: None picks a free one. lora_modules: adapters served from the start, name -> folder.
    enable_lora / max_loras / max_lora_rank / gpu_memory_utilization / kv_cache_gib / max_model_len:
        as for ``VLLMBackend`` (same defaults). allow_runtime_lora: set
        ``VLLM_ALLOW_RUNTIME_LORA_UPDATING`` so ``OpenAIBackend.load_adapter`` can add or replace
        adapters (vLLM calls this a development setting: do not expose such a server publicly).
    extra_args: more ``vllm serve`` flags. startup_timeout: seconds to wait for ``/health``.
    log_path: where the server's output goes (default: a temporary file, shown on failure).
    """

    def __init__(
        self,
        model: str = "smollm2-135m-instruct",
        host: str = "127.0.0.1",
        port: int | None = None,
        served_model_name: str | None = None,
        lora_modules: dict[str, str] | None = None,
        enable_lora: bool = True,
        max_loras: int = 4,
        max_lora_rank: int = 16,
        gpu_memory_utilization: float | None = None,
        kv_cache_gib: float | None = None,
        max_model_len: int = 4096,
        seed: int = 0,
        allow_runtime_lora: bool = True,
        extra_args: tuple[str, ...] = (),
        startup_timeout: float = 300.0,
        log_path: str | None = None,
    ):
        from ..models import resolve_model

        self.model = model
        self.path = resolve_model(model)
        self.host = host
        self.port = port or free_port(host)
        self.served_model_name = served_model_name or model
        self.lora_modules = dict(lora_modules or {})
        self.enable_lora = enable_lora
        self.max_loras = max_loras
        self.max_lora_rank = max_lora_rank
        self.gpu_memory_utilization = gpu_memory_utilization
        self.kv_cache_gib = kv_cache_gib
        self.max_model_len = max_model_len
        self.seed = seed
        self.allow_runtime_lora = allow_runtime_lora
        self.extra_args = tuple(extra_args)
        self.startup_timeout = startup_timeout
        self.log_path = log_path or os.path.join(tempfile.mkdtemp(prefix="udpo-vllm-"), "server.log")
        self.process: subprocess.Popen | None = None

    @property
    def root(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def url(self) -> str:
        """The OpenAI base URL (``.../v1``) to give ``OpenAIBackend``."""
        return f"{self.root}/v1"

    def command(self) -> list[str]:
        from vllm.platforms import current_platform

        from .vllm import LOGPROBS_MODE, cpu_safe_options, memory_options

        on_cpu = current_platform.is_cpu()
        options = {
            **cpu_safe_options(on_cpu),
            **memory_options(on_cpu, self.gpu_memory_utilization, self.kv_cache_gib),
            "logprobs_mode": LOGPROBS_MODE,
        }  # the engine options VLLMBackend uses, as command-line flags
        cmd = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", self.path, "--served-model-name", self.served_model_name,
            "--host", self.host, "--port", str(self.port),
            "--max-model-len", str(self.max_model_len), "--seed", str(self.seed),
        ]  # fmt: skip
        for key, value in options.items():
            flag = key.replace("_", "-")
            cmd += (
                [f"--{flag}" if value else f"--no-{flag}"]
                if isinstance(value, bool)
                else [f"--{flag}", str(value)]
            )
        if self.enable_lora:
            cmd += [
                "--enable-lora",
                "--max-loras",
                str(self.max_loras),
                "--max-lora-rank",
                str(self.max_lora_rank),
            ]
            if self.lora_modules:
                cmd += ["--lora-modules", *(f"{n}={Path(p).resolve()}" for n, p in self.lora_modules.items())]
        return cmd + list(self.extra_args)

    def start(self) -> str:
        """Start the server and wait until ``/health`` answers; returns ``url``."""
        if self.process is not None:
            return self.url
        env = dict(os.environ)
        if self.allow_runtime_lora:
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                code = self.process.returncode
                self.process = None
                raise BackendError(f"vLLM server exited with code {code} while starting:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.root}/health", timeout=2.0).status_code == 200:
                    return self.url
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        self.stop()
        raise BackendError(
            f"vLLM server at {self.root} did not become healthy within {self.startup_timeout:g}s:\n{self.log_tail()}"
        )

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(Path(self.log_path).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return f"(no log at {self.log_path})"

    def stop(self, timeout: float = 30.0) -> None:
        """Terminate the server's process group (SIGTERM, then SIGKILL after ``timeout`` s)."""
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        pgid = os.getpgid(proc.pid)
        os.killpg(pgid, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(pgid, signal.SIGKILL)
            proc.wait()
        with contextlib.suppress(ProcessLookupError):  # engine workers that outlived the server
            os.killpg(pgid, signal.SIGKILL)

    def __enter__(self) -> VLLMServer:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
