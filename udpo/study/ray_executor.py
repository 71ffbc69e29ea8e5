"""A study's runs on a Ray cluster (``udpo study PLAN --ray [auto|ADDRESS]``): each run one Ray task.

The driver (this process) submits every run without a record as one task asking for the plan's
``resources`` (``num_cpus``: its torch threads too; ``num_gpus``: a fraction below 1 shares a card, and
the run caps its memory at that share, :mod:`udpo.gpu_share`), and Ray places them. A task trains its run
in the run folder the plan names, on whatever node it landed (a shared path, or node-local), builds the
run's record there and hands back its files; **the driver writes each record into ``results_dir`` as its
run returns**, so the records need no shared file system, and writes the tables once the last is recorded.

Each task's output (its fds 1 and 2) streams to the driver while it runs, into
``output_dir/logs/<method>_seed<s>.log``, every attempt under a header naming its node. A task whose
worker or node is lost is submitted again, at most :data:`RETRIES` more times (then reported failed, its
log kept); the new attempt resumes the run's latest checkpoint when the run folder is where it lands (a
shared path), else it starts again from its first iteration and its log says so. A run that raises is
not retried: it is reported failed with its error, in its log too. A run is recorded once: the driver
writes a record only where there is none. The runs of a killed driver die with it (Ray ends a job's tasks
with its driver); the same command picks up where the records stop. ``output_dir/logs/ray.json`` names
the runs in flight and where, for ``udpo study PLAN --status`` (:func:`udpo.study.runner.in_flight`).

On one machine (``--ray local`` or a loopback address) Ray is held to 127.0.0.1 (:data:`LOOPBACK_ONLY`).
"""

from __future__ import annotations

import os
import socket
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from udpo.study.plan import CompareConfig
from udpo.study.record import record_name
from udpo.study.runner import IN_FLIGHT

#: how many more times a run whose worker or node was lost is submitted before it is reported failed
RETRIES = 2
#: seconds between the driver's looks at its runs (and at their logs)
POLL = 1.0
#: Ray's switch that keeps a node's addresses on 127.0.0.1 (its setting for one-machine clusters), set for
#: ``--ray local`` and loopback addresses (:func:`hold_to_loopback`)
LOOPBACK_ONLY = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
#: seconds a finished task waits for the last of its output to be read
READER_PATIENCE = 10.0


def bootstrap_address(address: str) -> str:
    """The address ``ray.init`` will connect to: ``auto`` as Ray resolves it (``RAY_ADDRESS``, else the
    cluster the last ``ray start`` on this machine started), anything else as given."""
    if address != "auto":
        return address
    if os.environ.get("RAY_ADDRESS"):
        return os.environ["RAY_ADDRESS"]
    current = Path("/tmp/ray/ray_current_cluster")  # where `ray start` leaves its address
    return current.read_text().strip() if current.is_file() else address


def loopback(address: str) -> bool:
    """Whether ``address`` is a cluster on this machine alone: ``local`` (started here) or a loopback host."""
    host = address.removeprefix("ray://").rsplit(":", 1)[0].strip("[]")
    return address == "local" or host in {"127.0.0.1", "localhost", "::1"}


def hold_to_loopback() -> None:
    """Keep Ray on 127.0.0.1, in this process and the ones it starts: :data:`LOOPBACK_ONLY` in the
    environment and, where ray was imported before (vLLM imports it), the flag ray read from it then."""
    os.environ.update(LOOPBACK_ONLY)
    if "ray" in sys.modules:
        from ray._private import ray_constants

        ray_constants.ENABLE_RAY_CLUSTER = False


@dataclass(frozen=True)
class RayCluster:
    """The Ray executor (:class:`udpo.study.executor.Executor`). ``address``: ``auto`` (the running cluster),
    ``local`` (start one here for this study, on 127.0.0.1) or ``HOST:PORT``; ``retries``: more attempts of
    a run whose worker or node was lost."""

    address: str = "auto"
    retries: int = RETRIES

    def run(self, config: CompareConfig, seeds: Sequence[int] | None = None) -> int:
        from udpo.study.runner import plan_jobs
        from udpo.training import run_lock

        jobs = [job for job in plan_jobs(config, seeds) if not config.recorded(*job)]
        if loopback(bootstrap_address(self.address)):
            hold_to_loopback()
        import ray

        connected = not ray.is_initialized()
        if connected:  # (auto as given: Ray then also finds the token of a cluster started here)
            local = {"include_dashboard": False} if self.address == "local" else {}
            ray.init(address=self.address, log_to_driver=False, **local)
        try:
            # one driver at a time: its lock on output_dir, lent to the tables it writes at the end
            with run_lock.held(config.output_dir, resume=f"udpo study PLAN --ray {self.address}", lend=True):
                return Driver(config, self.retries).run(jobs)
        finally:
            if connected:
                ray.shutdown()


class Driver:
    """One study's runs on the connected cluster: submits, retries, writes records and logs as they come."""

    def __init__(self, config: CompareConfig, retries: int) -> None:
        import ray

        self.config, self.retries = config, retries
        self.logs = Path(config.output_dir) / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        here = ray.get_runtime_context().get_node_id()  # the log sink stays with the driver
        affinity = ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(here, soft=False)
        self.sink = ray.remote(num_cpus=0, scheduling_strategy=affinity)(LogSink).remote()
        self.task = ray.remote(max_calls=1, max_retries=0)(train_on_worker)  # a fresh process per run
        self.pending: dict[Any, tuple[str, int, int]] = {}  # ref -> method, seed, attempt
        self.where: dict[str, str] = {}

    def submit(self, method: str, seed: int, attempt: int) -> None:
        resources = self.config.resources
        tc = self.config.train_config(method, seed)
        ref = self.task.options(
            num_cpus=resources["num_cpus"],
            num_gpus=resources["num_gpus"],
            name=f"{record_name(method, seed)} attempt {attempt}",
        ).remote(tc, method, seed, attempt, self.sink, threads(resources), share(resources))
        self.pending[ref] = (method, seed, attempt)
        self.where[record_name(method, seed)] = f"attempt {attempt}, waiting for a node"

    def run(self, jobs: Sequence[tuple[str, int]]) -> int:
        import ray

        resources = self.config.resources
        print(
            f"ray: {len(jobs)} run(s) to train on {len(ray.nodes())} node(s), each with "
            f"{resources['num_cpus']:g} CPU(s) and {resources['num_gpus']:g} GPU(s); logs in {self.logs}"
        )
        for method, seed in jobs:
            self.submit(method, seed, 1)
        failed: list[str] = []
        try:
            while self.pending:
                self.note_in_flight()
                done, _ = ray.wait(list(self.pending), num_returns=1, timeout=POLL)
                self.take_logs()
                for ref in done:
                    failed += self.returned(ref, *self.pending.pop(ref))
        finally:
            self.take_logs()
            (self.logs / IN_FLIGHT).unlink(missing_ok=True)
        if failed:
            print(f"ray: {len(failed)} run(s) failed, their logs in {self.logs}: {', '.join(failed)}")
            return 1
        if self.config.tables_when_done and self.config.all_recorded():
            from udpo.study.runner import write_results

            write_results(self.config)
        return 0

    def returned(self, ref: Any, method: str, seed: int, attempt: int) -> list[str]:
        """Handle one finished task: its record written (once), a lost attempt retried, or a failure
        reported; returns the runs that failed for good."""
        import ray

        from udpo.study.record import place_record

        name = record_name(method, seed)
        self.where.pop(name, None)
        try:
            result = ray.get(ref)
        except lost_errors() as e:
            lost = f"attempt {attempt} lost ({type(e).__name__}: {str(e).splitlines()[0][:200]})"
            if attempt > self.retries:
                self.log(name, f"== {lost}; no attempt left: failed\n")
                print(f"ray: {name}: {lost}; failed after {attempt} attempt(s), log {self.log_path(name)}")
                return [name]
            self.log(name, f"== {lost}; submitted again\n")
            print(f"ray: {name}: {lost}; attempt {attempt + 1} of {self.retries + 1} submitted")
            self.submit(method, seed, attempt + 1)
            return []
        except ray.exceptions.RayTaskError as e:
            self.log(name, f"== attempt {attempt} failed:\n{e}\n")
            print(f"ray: {name}: failed ({type(e.cause).__name__}: {e.cause}), log {self.log_path(name)}")
            return [name]
        if self.config.recorded(method, seed):
            print(f"ray: {name}: returned, its record was already written; kept as it was")
            return []
        place_record(result["files"], self.config.record_dir(method, seed))
        print(f"ray: {name}: recorded ({result['where']}): {self.config.record_dir(method, seed)}")
        return []

    def take_logs(self) -> None:
        import ray

        chunks, starts = ray.get(self.sink.take.remote())
        for name, text in chunks:
            self.log(name, text)
        live = {record_name(method, seed) for method, seed, _ in self.pending.values()}
        self.where.update({name: where for name, where in starts.items() if name in live})

    def log_path(self, name: str) -> Path:
        return self.logs / f"{name}.log"

    def log(self, name: str, text: str) -> None:
        with self.log_path(name).open("a", encoding="utf-8") as fh:
            fh.write(text)

    def note_in_flight(self) -> None:
        from udpo.env.jsonl import write_json

        write_json(
            self.logs / IN_FLIGHT, {"driver": f"pid {os.getpid()} on {socket.gethostname()}", **self.where}
        )


def threads(resources: dict[str, float]) -> int:
    """A run's torch threads: its CPUs, at least one."""
    return max(1, int(resources["num_cpus"]))


def share(resources: dict[str, float]) -> float | None:
    """A run's share of one GPU's memory: its fraction of a card, None with none or whole cards."""
    gpus = resources["num_gpus"]
    return gpus if 0 < gpus < 1 else None


class LogSink:
    """A Ray actor beside the driver that the tasks stream their output to (and say where they started);
    the driver takes what came in since its last look."""

    def __init__(self) -> None:
        self.chunks: list[tuple[str, str]] = []
        self.starts: dict[str, str] = {}

    def write(self, name: str, text: str) -> None:
        self.chunks.append((name, text))

    def start(self, name: str, where: str) -> None:
        self.starts[name] = where

    def take(self) -> tuple[list[tuple[str, str]], dict[str, str]]:
        out, starts = self.chunks, self.starts
        self.chunks, self.starts = [], {}
        return out, starts


def train_on_worker(
    tc: Any, method: str, seed: int, attempt: int, sink: Any, n_threads: int, gpu_share: float | None
) -> dict[str, Any]:
    """One run, as a Ray task: train it (resuming its latest checkpoint where its run folder holds one),
    mark it done, and return its record's files (:func:`udpo.study.record.record_files`) and where it ran.
    Its output streams to ``sink``."""
    import tempfile

    import ray

    from udpo import gpu_share as shares
    from udpo.study.record import record_files, write_record
    from udpo.study.runner import DONE, mark_done, resume_if_started
    from udpo.threads import ENV

    os.environ.update(
        {ENV: str(n_threads), "OMP_NUM_THREADS": str(n_threads), **shares.environment(gpu_share)}
    )
    name, run = record_name(method, seed), Path(tc.output_dir)
    where = f"attempt {attempt} on {socket.gethostname()} (Ray node {ray.get_runtime_context().get_node_id()[:8]})"
    sink.start.remote(name, where)
    with streamed_output(lambda text: sink.write.remote(name, text)):
        card = f", {gpu_share:g} of a GPU" if gpu_share else ""
        print(f"== {name}: {where}, {n_threads} thread(s){card}, run folder {run}", flush=True)
        if (run / DONE).exists():
            print("its run folder says it finished: recording it", flush=True)
        else:
            if resume_if_started(tc):
                print("resuming its latest checkpoint", flush=True)
            elif attempt > 1:
                print(
                    "no checkpoint of the earlier attempt here (its run folder is not on a shared path): "
                    "starting again from its first iteration",
                    flush=True,
                )
            from udpo.training.trainer import train

            train(tc)
            mark_done(run, method, seed)
        with tempfile.TemporaryDirectory() as tmp:
            write_record(run, tmp, method, seed)
            files = record_files(tmp)
        print(f"== {name}: finished", flush=True)
    ray.get(sink.write.remote(name, ""))  # after every chunk: the driver has the whole log with the result
    return {"files": files, "where": where}


@contextmanager
def streamed_output(send: Callable[[str], Any]) -> Iterator[None]:
    """This process's fds 1 and 2 (Python's, the libraries', its children's) handed to ``send`` as they
    come, through a pipe read by a thread; everything is sent when the block ends."""
    read_end, write_end = os.pipe()
    saved = [os.dup(1), os.dup(2)]

    def forward() -> None:
        with os.fdopen(read_end, "rb", buffering=0) as pipe:
            while chunk := pipe.read(65536):
                send(chunk.decode("utf-8", errors="replace"))

    reader = threading.Thread(target=forward, daemon=True)
    reader.start()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    for fd in (1, 2):
        os.dup2(write_end, fd)
    os.close(write_end)
    try:
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        for fd, old in zip((1, 2), saved, strict=True):
            os.dup2(old, fd)
            os.close(old)
        reader.join(timeout=READER_PATIENCE)  # (a child still holding the pipe would keep it open)


def lost_errors() -> tuple[type[BaseException], ...]:
    """The Ray errors of a lost worker or node, or of a result lost with its node: the run is retried."""
    import ray.exceptions as rex

    return (
        rex.WorkerCrashedError,
        rex.NodeDiedError,
        rex.LocalRayletDiedError,
        rex.OutOfMemoryError,
        rex.ObjectLostError,
    )
