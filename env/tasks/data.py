"""Where task data comes from and how its files are read.

A task's ``data_path`` may be:

- ``None``: the default data folder, ``$UDPO_DATA_DIR`` if set, else ``../shared/data`` beside the
  repository checkout (the layout of ``shared/data/README.md``);
- a file (read as is);
- a folder: either a data root holding ``<task folder>/<file>`` or the task folder itself;
- a Hugging Face Hub dataset name ``owner/name`` (optionally ``owner/name:config``), loaded with
  the optional ``datasets`` package (``pip install 'udpo[hub]'``) when a network is there.

Readers raise ``DataError`` naming the file and line at fault, so bad data never loads silently.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import json
import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

#: environment variable naming the data root (the shared/data layout)
DATA_DIR_ENV = "UDPO_DATA_DIR"
_REPO_ROOT = Path(__file__).resolve().parents[2]
_HUB_NAME_RE = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+(?::[\w.-]+)?")


class DataError(ValueError):
    """Task data could not be loaded; the message names the file (and line) or dataset at fault."""


@dataclass(frozen=True)
class HubDataset:
    """A dataset on the Hugging Face Hub: ``name`` (owner/name) and its ``config`` (or None)."""

    name: str
    config: str | None = None


def default_data_dir() -> Path:
    """``$UDPO_DATA_DIR``, else ``../shared/data`` beside the checkout; a clear error when neither exists."""
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        path = Path(env).expanduser()
        if not path.is_dir():
            raise FileNotFoundError(f"${DATA_DIR_ENV} is set to {env!r}, which is not a folder")
        return path
    path = _REPO_ROOT.parent / "shared" / "data"
    if path.is_dir():
        return path
    raise FileNotFoundError(
        f"no data folder found: {path} does not exist and ${DATA_DIR_ENV} is not set. Pass --data "
        "(a file, a folder in the shared/data layout, or a Hub name such as openai/gsm8k) or set "
        f"${DATA_DIR_ENV}."
    )


def resolve_source(
    data_path: str | os.PathLike | None,
    folder: str,
    filename: str,
    hub_configs: Mapping[str, str] | None = None,
) -> Path | HubDataset:
    """The file to read (or the Hub dataset) for ``data_path``; see the module docstring.

    folder/filename: where the task's file sits in the shared/data layout (``gsm8k``, ``test.jsonl``).
    hub_configs: default config per Hub name (``{"openai/gsm8k": "main"}``) when none is given.
    """
    if data_path is None:
        return _file_in(default_data_dir(), folder, filename)
    path = Path(data_path).expanduser()
    if path.is_file():
        return path
    if path.is_dir():
        return _file_in(path, folder, filename)
    if _HUB_NAME_RE.fullmatch(str(data_path)):
        name, _, config = str(data_path).partition(":")
        return HubDataset(name, config or (hub_configs or {}).get(name))
    raise FileNotFoundError(
        f"{data_path}: no such file or folder (and not a Hub name of the form owner/name)"
    )


def _file_in(root: Path, folder: str, filename: str) -> Path:
    for candidate in (root / folder / filename, root / filename):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"{root / folder / filename} not found (also looked for {root / filename}); "
        "pass --data with the file, its folder, or a Hub name"
    )


def load_hub(dataset: HubDataset, split: str) -> list[dict[str, Any]]:
    """Rows of ``split`` of a Hub dataset as plain dicts (needs ``datasets`` and a network or cache)."""
    try:
        import datasets
    except ImportError as e:
        raise DataError(
            f"loading {dataset.name!r} from the Hugging Face Hub needs the `datasets` package: "
            "pip install 'udpo[hub]', or pass a local file or folder instead"
        ) from e
    try:
        rows = datasets.load_dataset(dataset.name, dataset.config, split=split)
    except Exception as e:  # offline, unknown name, gated, bad config: all one message for the user
        raise DataError(
            f"could not load {dataset.name!r} (config {dataset.config}, split {split!r}) from the Hugging "
            f"Face Hub: {type(e).__name__}: {e}. It is not a local path either; without network access "
            "pass a local file or folder (e.g. the shared/data layout)"
        ) from e
    return [dict(row) for row in rows]


def iter_jsonl(path: str | os.PathLike) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` for each non-blank line of a JSON Lines file."""
    with _utf8(path) as f:
        yield from iter_jsonl_lines(f, str(path))


def iter_jsonl_lines(lines: Iterable[str], where: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` for each non-blank line of JSON Lines text (a file, or text read from
    an archive); errors name ``where`` and the line."""
    for line_no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{where}:{line_no}: not valid JSON ({e.msg} at column {e.colno})") from e
        if not isinstance(record, dict):
            raise DataError(f"{where}:{line_no}: expected a JSON object, got {type(record).__name__}")
        yield line_no, record


def iter_csv(path: str | os.PathLike, required: Sequence[str]) -> Iterator[tuple[int, dict[str, str]]]:
    """``(line number, row)`` for each row of a CSV file with a header holding ``required`` columns.

    The line number is where the row ends (quoted fields may span lines). A row with more or fewer
    fields than the header is an error.
    """
    with _utf8(path, newline="") as f:
        reader = csv.DictReader(f, restkey="\0extra", strict=True)
        try:
            header = reader.fieldnames or []
            missing = [c for c in required if c not in header]
            if missing:
                raise DataError(
                    f"{path}: missing column(s) {', '.join(missing)} (header: {', '.join(header)})"
                )
            for row in reader:
                extra = row.pop("\0extra", [])
                if extra or None in row.values():
                    n = len(header) + len(extra) - sum(v is None for v in row.values())
                    raise DataError(f"{path}:{reader.line_num}: {n} fields, the header has {len(header)}")
                yield reader.line_num, row
        except csv.Error as e:
            raise DataError(f"{path}:{reader.line_num}: malformed CSV ({e})") from e


@contextlib.contextmanager
def _utf8(path: str | os.PathLike, newline: str | None = None) -> Iterator[TextIO]:
    """The file opened as UTF-8 text; a decoding error becomes a DataError naming the file."""
    with open(path, encoding="utf-8", newline=newline) as f:
        try:
            yield f
        except UnicodeDecodeError as e:
            raise DataError(f"{path}: not UTF-8 text ({e.reason})") from e


def get_field(record: Mapping[str, Any], key: str, where: str, kind: type = str) -> Any:
    """``record[key]``, checked to be a ``kind``; the error names ``where`` (file:line) and the key."""
    if key not in record:
        raise DataError(f"{where}: missing key {key!r}")
    value = record[key]
    if not isinstance(value, kind):
        raise DataError(f"{where}: {key!r} should be {kind.__name__}, got {type(value).__name__}")
    return value


def half_of(key: str) -> str:
    """``"train"`` or ``"test"``: a fixed 50/50 partition by a hash of ``key`` (an id or question).

    It does not depend on the seed, the file order or the source (local file or Hub), so the two
    halves stay disjoint across runs.
    """
    digest = hashlib.sha256(key.encode("utf-8")).digest()
    return "test" if digest[0] % 2 == 0 else "train"


def take(items: list, limit: int | None) -> list:
    """The first ``limit`` items (all when None)."""
    if limit is None:
        return items
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    return items[:limit]
