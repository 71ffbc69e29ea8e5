"""ReaLMistake (Kamoi et al. 2024): does an LLM response contain an error? Gold ``error`` / ``no_error``.

Three subtasks (math word problem generation, fine-grained fact verification, answerability
classification), each with responses from two models (GPT-4-0613: 140 items per subtask, Llama 2
70B: 160), 900 items with a human binary label.

Sources, in the order tried:

- ``None``: ``realmistake/data.zip`` of the shared/data layout. The authors ship the data in a
  password-protected zip to keep it out of training crawls; it is read in memory with
  :mod:`zipfile` (password :data:`ZIP_PASSWORD`) and never extracted to disk.
- a ``.zip`` file, or a folder holding ``data.zip`` or ``realmistake/data.zip``;
- an extracted folder: ``<subtask>/<model file>.jsonl``, optionally under ``data/`` or
  ``realmistake/data/``; or one ``.jsonl`` file (its subtask and model are read from each line's
  ``metadata``);
- the Hub dataset ``ryokamoi/realmistake`` (gated: accept its terms first), one config per subtask
  and the splits ``gpt4`` / ``llama2``; ``ryokamoi/realmistake:<subtask>`` loads one subtask.

Each line holds ``input`` (the prompt the model got), ``llm_response``, the label (``error_label``,
or ``label`` as the authors' README spells it), ``error_categories``, ``human_explanation`` and
``metadata`` (``id``, ``task_name``, ``llm_response_model``).

Splits select items: ``test`` (all 900), a response model (``gpt4``, ``llama2``), a subtask
(``math_word_problem_generation``, ...) or both (``answerability_classification:gpt4``). Items of
the selected files are interleaved round-robin (first item of each file, then the second, ...), so
a small ``limit`` still covers every subtask and both models.
"""

from __future__ import annotations

import os
import re
import zipfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

from ..jsonl import iter_jsonl_lines
from .base import Answer, Question, Task
from .data import DataError, HubDataset, default_data_dir, get_field, given_path, load_hub, take
from .parsing import FORM_STATED, Reading

HUB_NAME = "ryokamoi/realmistake"
#: the zip password the authors publish with the data (also in docs/tasks.md, "realmistake")
ZIP_PASSWORD = "open-realmistake"
ERROR, NO_ERROR = "error", "no_error"
LABELS = (ERROR, NO_ERROR)
#: subtask folder (and Hub config) names, in table order
SUBTASKS = ("math_word_problem_generation", "finegrained_fact_verification", "answerability_classification")
#: short response-model name -> the file stem in the zip
MODEL_FILES = {"gpt4": "gpt-4-0613", "llama2": "Llama-2-70b-chat-hf"}
#: metadata task_name (as written in the files) -> subtask folder name
_SUBTASK_OF = {"math_problem_generation": "math_word_problem_generation", **{s: s for s in SUBTASKS}}

# "Verdict: no error", "**Final verdict:** error", "Answer = no_error" (last one wins)
_MARKED_RE = re.compile(
    r"(?i)\b(?:final\s+)?(?:verdict|answer|judg(?:e)?ment|decision|label|final)\b[*\s]*[:=][*\s]*"
    r"(no[\s_-]*errors?|error[\s_-]*free|errors?)\b"
)
# "the model response contains an error", "has no errors", "does not contain any error"
_PHRASE_RE = re.compile(
    r"(?i)\b(?:contains?|has|have|includes?)\s+(?:(no|not\s+any)\s+|an?\s+|one\s+or\s+more\s+|some\s+)?errors?\b"
    r"|\b(?:does|do)\s*(?:not|n't)\s+(?:contain|have|include)\s+(?:any\s+|an?\s+)?errors?\b"
    r"|\b(error[\s-]free)\b"
)


def parse_verdict(text: str) -> Answer:
    """``"error"``, ``"no_error"`` or None: the verdict stated in ``text``.

    1. A marked verdict ("Verdict: error", "Final answer: no error", "verdict = no_error"); the last
       one wins.
    2. Otherwise the last sentence-level claim: "contains an error" / "has errors" give ``error``;
       "contains no error", "does not contain any errors", "error-free" give ``no_error``.
    3. Nothing of that kind: None.
    """
    marked = _MARKED_RE.findall(text)
    if marked:
        return _label(marked[-1])
    claims = list(_PHRASE_RE.finditer(text))
    if not claims:
        return None
    last = claims[-1]
    negated = (
        last.group(1) is not None or last.group(2) is not None or re.search(r"(?i)n['o]t\b", last.group())
    )
    return NO_ERROR if negated else ERROR


def _label(word: str) -> str:
    return NO_ERROR if re.match(r"(?i)no|error[\s_-]*free", word) else ERROR


def verdict_text(label: Answer) -> str:
    """How a label reads in prose and in a verdict line: ``error``, ``no error`` or ``no verdict``."""
    return {ERROR: "error", NO_ERROR: "no error"}.get(label, "no verdict")  # type: ignore[arg-type]


class RealMistake(Task):
    """Binary error detection: the agent reads a model input and a model response and says whether
    the response contains an error. See the module docstring for sources and splits."""

    name = "realmistake"
    #: the two verdicts, the positive class (an error was found) first
    labels = (ERROR, NO_ERROR)
    splits = (
        "test",
        *MODEL_FILES,
        *SUBTASKS,
        *(f"{s}:{m}" for s in SUBTASKS for m in MODEL_FILES),
    )
    default_profile = (
        "You review answers written by language models. You read the instructions the model was given "
        "and its response, and you judge strictly whether the response breaks any requirement or makes "
        "any mistake."
    )

    def load(
        self,
        split: str = "test",
        data_path: str | os.PathLike | None = None,
        limit: int | None = None,
        seed: int = 0,
    ) -> list[Question]:
        self.check_split(split)
        subtask, _, model = split.partition(":")
        if subtask in MODEL_FILES:
            subtask, model = "test", subtask
        subtasks = SUBTASKS if subtask == "test" else (subtask,)
        models = tuple(MODEL_FILES) if not model else (model,)
        rows = list(_round_robin(_read_source(data_path, subtasks, models)))
        questions = [_question(where, row) for where, row in rows]
        seen: dict[str, str] = {}
        for (where, _), q in zip(rows, questions, strict=True):
            if q.id in seen:
                raise DataError(f"{where}: id {q.id!r} already used at {seen[q.id]}")
            seen[q.id] = where
        if not questions:
            raise DataError(
                f"{data_path or 'realmistake/data.zip'}: no ReaLMistake items for split {split!r}"
            )
        return take(questions, limit)

    def format_instruction(self, question: Question) -> str:
        return (
            "Explain briefly what you checked, then end your reply with exactly one line: "
            "'Verdict: error' if the response breaks any requirement or contains any mistake, "
            "otherwise 'Verdict: no error'."
        )

    def parse(self, text: str, question: Question) -> Answer:
        return parse_verdict(text)

    def read(self, text: str, question: Question) -> Reading:
        return Reading.of(parse_verdict(text), FORM_STATED)

    @staticmethod
    def label_text(label: Answer) -> str:
        """How a verdict reads in a prompt (see :func:`verdict_text`)."""
        return verdict_text(label)


def problem_text(model_input: str, response: str) -> str:
    """The item as agents read it: the model input and the model response, clearly delimited."""
    return (
        "A language model was given the input below and wrote the response below. Decide whether the "
        "response contains an error: any unmet instruction or requirement of the input, any wrong "
        "reasoning or calculation, or any claim the input does not support.\n\n"
        f"=== MODEL INPUT ===\n{model_input.strip()}\n=== END OF MODEL INPUT ===\n\n"
        f"=== MODEL RESPONSE ===\n{response.strip()}\n=== END OF MODEL RESPONSE ==="
    )


def _question(where: str, row: dict[str, Any]) -> Question:
    model_input = get_field(row, "input", where)
    response = get_field(row, "llm_response", where)
    key = "error_label" if "error_label" in row else "label"
    label = get_field(row, key, where).strip()
    if label not in LABELS:
        raise DataError(f"{where}: {key!r} should be 'error' or 'no_error', got {label!r}")
    meta = get_field(row, "metadata", where, dict)
    task_name = get_field(meta, "task_name", f"{where}: in 'metadata'")
    if task_name not in _SUBTASK_OF:
        raise DataError(f"{where}: unknown metadata task_name {task_name!r}")
    return Question(
        id=str(get_field(meta, "id", f"{where}: in 'metadata'")),
        text=problem_text(model_input, response),
        gold=label,
        meta={
            "subtask": _SUBTASK_OF[task_name],
            "response_model": _model_key(str(meta.get("llm_response_model", "unknown"))),
            "input": model_input,
            "response": response,
            "error_categories": list(row.get("error_categories") or []),
            "human_explanation": row.get("human_explanation", ""),
        },
    )


def _model_key(name: str) -> str:
    """``gpt4`` / ``llama2`` for the two response models (metadata spells them ``gpt-4-0613`` and
    ``meta-llama/Llama-2-70b-chat-hf``), the name itself for anything else."""
    stem = name.rsplit("/", 1)[-1]
    return next((k for k, v in MODEL_FILES.items() if v == stem), name)


def _round_robin(files: list[list[tuple[str, dict]]]) -> Iterator[tuple[str, dict]]:
    for k in range(max((len(f) for f in files), default=0)):
        for rows in files:
            if k < len(rows):
                yield rows[k]


# --- sources -------------------------------------------------------------------------------------


def _read_source(
    data_path: str | os.PathLike | None, subtasks: tuple[str, ...], models: tuple[str, ...]
) -> list[list[tuple[str, dict]]]:
    """One list of ``(where, row)`` per selected (subtask, model) file, in table order."""
    if data_path is None:
        return _from_zip(_zip_in(default_data_dir()), subtasks, models)
    path = given_path(data_path)
    if path.is_file():
        if path.suffix == ".zip":
            return _from_zip(path, subtasks, models)
        return _select_rows(_jsonl_rows(str(path), path.read_bytes()), subtasks, models)
    if path.is_dir():
        root = next((r for r in (path, path / "data", path / "realmistake" / "data") if _has_files(r)), None)
        if root is not None:
            return [_from_folder(root, s, m) for s in subtasks for m in models]
        return _from_zip(_zip_in(path), subtasks, models)
    name, sep, config = str(data_path).partition(":")
    if re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", name):
        if sep and config not in subtasks:
            raise DataError(f"{data_path}: config {config!r} is not among the selected subtasks {subtasks}")
        chosen = (config,) if sep else subtasks
        return [_from_hub(HubDataset(name, s), m) for s in chosen for m in models]
    raise FileNotFoundError(
        f"{data_path}: no such file or folder (and not a Hub name of the form owner/name)"
    )


def _zip_in(root: Path) -> Path:
    for candidate in (root / "realmistake" / "data.zip", root / "data.zip"):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"{root / 'realmistake' / 'data.zip'} not found (also looked for {root / 'data.zip'} and for "
        "extracted <subtask>/<model>.jsonl files); pass --data-path with the zip, its folder, or a Hub name"
    )


def _has_files(root: Path) -> bool:
    return any((root / s).is_dir() for s in SUBTASKS)


def _from_zip(path: Path, subtasks: tuple[str, ...], models: tuple[str, ...]) -> list[list[tuple[str, dict]]]:
    try:
        archive = zipfile.ZipFile(path)
    except zipfile.BadZipFile as e:
        raise DataError(f"{path}: not a zip file ({e})") from e
    with archive:
        names = {PurePosixPath(n).parts[-2:]: n for n in archive.namelist() if n.endswith(".jsonl")}
        out = []
        for s in subtasks:
            for m in models:
                member = names.get((s, f"{MODEL_FILES[m]}.jsonl"))
                if member is None:
                    raise DataError(f"{path}: no {s}/{MODEL_FILES[m]}.jsonl inside the zip")
                try:
                    data = archive.read(member, pwd=ZIP_PASSWORD.encode())
                except RuntimeError as e:  # zipfile's error for a wrong password
                    raise DataError(f"{path}: cannot read {member} with the published password ({e})") from e
                out.append(_jsonl_rows(f"{path}:{member}", data))
    return out


def _from_folder(root: Path, subtask: str, model: str) -> list[tuple[str, dict]]:
    file = root / subtask / f"{MODEL_FILES[model]}.jsonl"
    if not file.is_file():
        raise FileNotFoundError(f"{file} not found in the extracted ReaLMistake folder {root}")
    return _jsonl_rows(str(file), file.read_bytes())


def _from_hub(dataset: HubDataset, model: str) -> list[tuple[str, dict]]:
    rows = load_hub(dataset, model)
    return [(f"{dataset.name} [{dataset.config}/{model}] row {i}", r) for i, r in enumerate(rows)]


def _jsonl_rows(where: str, data: bytes) -> list[tuple[str, dict]]:
    lines = data.splitlines(keepends=True)
    return [(f"{where}:{n}", row) for n, row in iter_jsonl_lines(lines, where, error=DataError)]


def _select_rows(
    rows: list[tuple[str, dict]], subtasks: tuple[str, ...], models: tuple[str, ...]
) -> list[list[tuple[str, dict]]]:
    """A single JSONL file's rows grouped by (subtask, model) as its metadata says, selected ones only."""
    wanted = {(s, m) for s in subtasks for m in models}
    groups: dict[tuple[str, str], list[tuple[str, dict]]] = {}
    for where, row in rows:
        meta = get_field(row, "metadata", where, dict)
        key = (
            _SUBTASK_OF.get(meta.get("task_name", ""), ""),
            _model_key(str(meta.get("llm_response_model"))),
        )
        if key in wanted:
            groups.setdefault(key, []).append((where, row))
    return [groups.get((s, m), []) for s in subtasks for m in models]
