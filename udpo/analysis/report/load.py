"""Read run folders for ``udpo report``: which kind of run a folder is, and its debates in page form.

A folder is recognised by what it holds:

- *debate run* or *evaluation folder*: ``trajectories.jsonl`` (and usually ``summary.json``), as
  ``udpo debate`` and every evaluation write them (a ``.jsonl`` file is read the same way);
- *training run* (:class:`udpo.env.run_folder.RunFolder`): ``metrics.jsonl`` or ``config.json`` with
  ``eval/``; its debate sets are the held-out evaluations, the attack evaluations' rows, and the warm-up
  and training debates, each named by its path in the run folder;
- *attack run* (``udpo eval --output-dir``): ``summary.json`` with ``rows``, one sub-folder per row;
- *collection* (e.g. a ``udpo compare`` folder, ``<method>/seed_<s>/`` training runs): any folder
  whose sub-folders (two levels deep at most) are runs; each becomes a child run (training runs with
  their evaluations only). Of a compare folder it also reads the table ``udpo compare`` wrote
  (``results.json``), or while there is none, which ``<method>/seed_<s>/`` runs are done (``done.json``).

Only files inside the run folder are read; nothing else is ever embedded in a page.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from udpo.env.run_folder import (
    DEBATES,
    EVAL_DIR,
    METRICS,
    SUMMARY,
    DebateFolder,
    RunFolder,
    iteration_folders,
    iteration_of,
)

#: ``udpo compare``'s table (written once every run is done) and a finished run's mark
RESULTS = "results.json"
DONE = "done.json"
SEED_DIR = re.compile(r"^seed_\d+$")
#: how deep below a collection folder sub-runs are looked for
COLLECTION_DEPTH = 2


class NotARunError(ValueError):
    """A path that holds no run ``udpo report`` can read; the message says what was looked for."""


@dataclass
class DebateSet:
    """One trajectory file's debates, compacted for the page.

    debates: one dict per debate (see :func:`compact_debate`). stats: n, accuracy, mean U_intra,
    U_inter, U_sys and the unparsed rate. common_meta: the ``meta`` entries every debate shares. forms: per
    agent, the shares of the forms its answers were read in and its echo rate, as recorded
    (:func:`udpo.env.answer_forms.agent_form_shares`).
    """

    name: str
    path: Path
    debates: list[dict[str, Any]]
    stats: dict[str, float | int | None]
    common_meta: dict[str, Any] = field(default_factory=dict)
    forms: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class Run:
    """A run folder as the report shows it.

    kind: ``debate``, ``evaluation``, ``training``, ``attack`` or ``collection``. sets: its debate
    sets in display order; ``primary`` indexes the one shown first (a training run's latest
    evaluation). metrics / config / calibration: a training run's files; attack: an attack run's
    summary; children: a collection's sub-runs (their sets are also in ``sets``, prefixed).
    results: a compare folder's ``results.json``; done: its ``<method>/seed_<s>`` runs -> finished.
    """

    label: str
    path: Path
    kind: str
    sets: list[DebateSet] = field(default_factory=list)
    primary: int = 0
    metrics: list[dict[str, Any]] = field(default_factory=list)
    config: dict[str, Any] | None = None
    calibration: dict[str, Any] | None = None
    attack: dict[str, Any] | None = None
    children: list[Run] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    results: dict[str, Any] | None = None
    done: dict[str, bool] = field(default_factory=dict)


def load_run(path: str | Path, label: str | None = None, lam: float = 0.5, rollouts: bool = True) -> Run:
    """Read the run at ``path`` (any kind in the module docstring); NotARunError when it is none.

    rollouts: include a training run's warm-up and training debates (a collection's training runs
    never do: comparisons are about their evaluations, and a page of many runs' rollouts grows large).
    """
    path = Path(path)
    if not path.exists():
        raise NotARunError(f"{path}: no such file or folder")
    label = label or (path.resolve().name if path.is_dir() else path.stem)
    if path.is_file():
        if path.suffix != ".jsonl":
            raise NotARunError(f"{path}: not a run folder or a trajectory .jsonl file")
        return Run(label, path, "debate", sets=[load_set(path, label, lam)])
    kind = run_kind(path)
    if kind in ("debate", "evaluation"):
        return Run(label, path, kind, sets=[load_set(DebateFolder(path).trajectories, label, lam)])
    if kind == "training":
        return load_training(path, label, lam, rollouts)
    if kind == "attack":
        return load_attack(path, label, lam)
    children, skipped = [], []
    for sub in sub_runs(path):
        try:
            children.append(load_run(sub, _relative(sub, path), lam, rollouts=False))
        except NotARunError as e:  # one empty or unfinished sub-run does not hide the others
            skipped.append(str(e))
    if not children:
        raise NotARunError(
            f"{path} is not a run folder: it holds no {DEBATES} (udpo debate, evaluations), no {METRICS} "
            f"(udpo train), no {SUMMARY} with attack rows (udpo eval), and no sub-folders that are runs"
            + (f" with debates ({'; '.join(skipped)})" if skipped else "")
        )
    run = Run(label, path, "collection", children=children, skipped=skipped)
    results = read_json(path / RESULTS)
    if isinstance(results, dict) and isinstance(results.get("methods"), dict):
        run.results = results
    run.done = {
        _relative(d, path): (d / DONE).is_file()
        for d in sorted(path.glob("*/seed_*"))
        if d.is_dir() and SEED_DIR.match(d.name)
    }
    for child in children:
        for s in child.sets:
            s.name = f"{child.label}/{s.name}" if s.name != child.label else child.label
        run.sets.extend(child.sets)
    return run


def run_kind(folder: Path) -> str | None:
    """What kind of run a folder is by the files it holds, or None (maybe a collection)."""
    if DebateFolder(folder).trajectories.is_file():
        evaluation = folder.parent.name == EVAL_DIR and iteration_of(folder.name) is not None
        return "evaluation" if evaluation else "debate"
    run = RunFolder(folder)
    if run.metrics.is_file() or (run.config.is_file() and run.evaluations.is_dir()):
        return "training"
    summary = read_json(DebateFolder(folder).summary)
    if isinstance(summary, dict) and isinstance(summary.get("rows"), list):
        return "attack"
    return None


def sub_runs(folder: Path, depth: int = COLLECTION_DEPTH) -> list[Path]:
    """Sub-folders of ``folder`` that are runs (not looking inside a run), sorted by name."""
    found: list[Path] = []
    for child in sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")):
        if run_kind(child) is not None:
            found.append(child)
        elif depth > 1:
            found.extend(sub_runs(child, depth - 1))
    return found


def load_training(folder: Path, label: str, lam: float, rollouts: bool = True) -> Run:
    """A training run: its metrics, config, calibration, every evaluation's debates and (with
    ``rollouts``) its warm-up and training debates."""
    files = RunFolder(folder)
    run = Run(
        label,
        folder,
        "training",
        metrics=read_jsonl_records(files.metrics),
        config=read_json(files.config),
        calibration=read_json(files.calibration),
    )
    for _, evaluation in files.evaluated():
        if evaluation.trajectories.is_file():
            run.sets.append(load_set(evaluation.trajectories, _relative(evaluation.root, folder), lam))
    run.primary = max(len(run.sets) - 1, 0)
    for _, attacked in iteration_folders(files.attack_evaluations):
        rows = (DebateFolder(p) for p in sorted(attacked.iterdir()))
        for row in (r for r in rows if r.trajectories.is_file()):
            run.sets.append(load_set(row.trajectories, _relative(row.root, folder), lam))
    for file in (files.warmup, files.train) if rollouts else ():
        if file.is_file() and file.stat().st_size > 0:
            run.sets.append(load_set(file, _relative(file.with_suffix(""), folder), lam))
    return run


def load_attack(folder: Path, label: str, lam: float) -> Run:
    """An ``udpo eval`` attack run: the summary's rows, and each row folder's debates."""
    summary = read_json(DebateFolder(folder).summary) or {}
    names = [str(r.get("name")) for r in summary.get("rows", []) if isinstance(r, dict)]
    others = sorted(
        p.name for p in folder.iterdir() if DebateFolder(p).trajectories.is_file() and p.name not in names
    )
    rows = [(n, DebateFolder(folder / n)) for n in [*names, *others]]
    sets = [load_set(row.trajectories, n, lam) for n, row in rows if row.trajectories.is_file()]
    return Run(label, folder, "attack", sets=sets, attack=summary)


def load_set(file: Path, name: str, lam: float = 0.5) -> DebateSet:
    """A trajectory file's debates (validated; errors name the file and line) with their uncertainties."""
    from udpo.env.answer_forms import agent_form_shares
    from udpo.env.trajectory import iter_records
    from udpo.rewards import debate_metrics, wrong_consensus

    records = list(iter_records(file))
    if not records:
        raise NotARunError(f"{file}: no debates in this file (it is empty)")
    metrics = debate_metrics(
        [r["answers"] for r in records], lam=lam, keys=[str(r["question_id"]) for r in records]
    )
    uncertainties = zip(metrics.u_intra, metrics.u_inter, metrics.u_sys, strict=True)
    common = common_meta(r.get("meta") or {} for r in records)
    debates = [compact_debate(r, u, common) for r, u in zip(records, uncertainties, strict=True)]
    cells = [a for r in records for row in r["answers"] for a in row]
    stats: dict[str, float | int | None] = {
        "n": len(records),
        "accuracy": sum(r["correct"] for r in records) / len(records),
        "u_intra": finite(float(metrics.u_intra.mean())),
        "u_inter": finite(float(metrics.u_inter.mean())),
        "u_sys": finite(float(metrics.u_sys.mean())),
        "unparsed_rate": sum(a is None for a in cells) / len(cells),
    }
    guard = [wrong_consensus(r["answers"], bool(r["correct"])) for r in records]
    stats["wrong_majority"] = sum(g.majority for g in guard) / len(guard)
    stats["wrong_unanimous"] = sum(g.unanimous for g in guard) / len(guard)
    forms = agent_form_shares(records)
    return DebateSet(name=name, path=file, debates=debates, stats=stats, common_meta=common, forms=forms)


def compact_debate(record: dict[str, Any], u: Iterable[float], common: dict[str, Any]) -> dict[str, Any]:
    """One debate in the page's short keys.

    id, q (question), g (gold), p (prediction), c (correct): shown as given, answers as display
    strings (``None`` stays null: unparsed). a: the answers matrix, agents x rounds. s: one string per
    agent, a letter per round: ``g`` the gold answer, ``w`` another answer, ``n`` unparsed; upper case
    when the turn was cut at the token limit. u: [U_intra, U_inter, U_sys]. x: each turn's text
    (agents x rounds, null where no turn was recorded). m: compromised agents. d: turn details
    (``"i,t"`` -> JSON text) where a protocol recorded any. r: who each turn of round >= 1 read
    (``"i,t"`` -> [[agent, round], ...]), only in a debate where some turn did not read every other
    agent's previous answer (sparse and chosen topologies, stopped agents, attacks on what is read).
    meta: the entries not shared by the set.
    """
    gold = record["gold"]
    answers = record["answers"]
    turns = record.get("turns") or []
    meta = record.get("meta") or {}

    def turn(i: int, t: int) -> dict[str, Any] | None:
        return turns[i][t] if i < len(turns) and t < len(turns[i]) else None

    states = []
    for i, row in enumerate(answers):
        letters = []
        for t, a in enumerate(row):
            letter = "n" if a is None else "g" if gold is not None and a == gold else "w"
            cut = (turn(i, t) or {}).get("finish_reason") == "length"
            letters.append(letter.upper() if cut else letter)
        states.append("".join(letters))
    out: dict[str, Any] = {
        "id": str(record["question_id"]),
        "q": str(record.get("question") or ""),
        "g": display(gold),
        "p": display(record["prediction"]),
        "c": bool(record["correct"]),
        "a": [[display(a) for a in row] for row in answers],
        "s": states,
        "u": [rounded(x) for x in u],
    }
    if turns:
        out["x"] = [[_text(turn(i, t)) for t in range(len(row))] for i, row in enumerate(answers)]
    details = {
        f"{i},{t}": json.dumps(tr["details"], ensure_ascii=False, default=str)
        for i in range(len(answers))
        for t in range(len(answers[i]))
        if (tr := turn(i, t)) and tr.get("details")
    }
    if details:
        out["d"] = details
    reads = {
        (i, t): pairs
        for i in range(len(answers))
        for t in range(1, len(answers[i]))
        if (pairs := _reads(turn(i, t))) is not None
    }
    everyone = {(i, t): sorted((j, t - 1) for j in range(len(answers)) if j != i) for i, t in reads}
    if any(sorted(map(tuple, pairs)) != everyone[key] for key, pairs in reads.items()):
        out["r"] = {f"{i},{t}": pairs for (i, t), pairs in reads.items()}
    compromised = meta.get("compromised")
    if isinstance(compromised, list) and compromised:
        out["m"] = [int(i) for i in compromised if isinstance(i, int)]
    own = {k: v for k, v in meta.items() if k not in common and k != "compromised" and is_scalar(v)}
    if own:
        out["meta"] = own
    return out


def _reads(turn: dict[str, Any] | None) -> list[list[int]] | None:
    """A turn's ``reads`` ([agent, round] pairs), or None when it has none in that form."""
    pairs = None if turn is None else turn.get("reads")
    ok = isinstance(pairs, list) and all(
        isinstance(p, list) and len(p) == 2 and all(type(x) is int for x in p) for p in pairs
    )
    return pairs if ok else None


def _text(turn: dict[str, Any] | None) -> str | None:
    return None if turn is None else str(turn.get("text") or "")


def common_meta(metas: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The scalar ``meta`` entries (and the compromised agents) with one value in every debate."""
    common: dict[str, Any] | None = None
    for meta in metas:
        here = {k: v for k, v in meta.items() if is_scalar(v) or k == "compromised"}
        common = here if common is None else {k: v for k, v in common.items() if k in here and here[k] == v}
    return common or {}


def is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, str | int | float | bool)


def display(answer: Any) -> str | None:
    """An answer as the page shows it: strings as they are, other values as JSON, None as null."""
    if answer is None or isinstance(answer, str):
        return answer
    return json.dumps(answer, ensure_ascii=False, default=str)


def finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def rounded(x: float) -> float | None:
    x = float(x)
    return round(x, 4) if math.isfinite(x) else None


def read_json(path: Path) -> Any:
    """A JSON file's content, or None when it is missing or not JSON (reports show what they can)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def read_jsonl_records(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSON Lines file (a missing file and unreadable lines give nothing)."""
    if not path.is_file():
        return []
    out = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                out.append(record)
    return out


def _relative(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix()
