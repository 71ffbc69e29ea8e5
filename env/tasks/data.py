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
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from ..jsonl import iter_jsonl as read_jsonl

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
        f"no data folder found: {path} does not exist and ${DATA_DIR_ENV} is not set. Pass --data-path "
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
    path = given_path(data_path)
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


def given_path(data_path: str | os.PathLike) -> Path:
    """``data_path`` as a path (``~`` expanded); an empty or blank one is an error saying so, rather
    than being read as the working directory."""
    if not str(data_path).strip():
        raise FileNotFoundError(
            f"the data path given is empty ({str(data_path)!r}): name a file, a folder or a Hub name "
            "(--data-path, data_path), or give none to read the default data folder"
        )
    return Path(data_path).expanduser()


def _file_in(root: Path, folder: str, filename: str) -> Path:
    for candidate in (root / folder / filename, root / filename):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"{root / folder / filename} not found (also looked for {root / filename}); "
        "pass --data-path with the file, its folder, or a Hub name"
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
    """``(line number, object)`` for each non-blank line of a JSON Lines file (read by
    :func:`udpo.env.jsonl.iter_jsonl`); a file without any record is an error naming it."""
    empty = True
    for line_no, record in read_jsonl(path, error=DataError):
        empty = False
        yield line_no, record
    if empty:
        raise DataError(f"{path}: no records (the file is empty)")


def iter_csv(path: str | os.PathLike, required: Sequence[str]) -> Iterator[tuple[int, dict[str, str]]]:
    """``(line number, row)`` for each row of a CSV file with a header holding ``required`` columns.

    The line number is where the row starts (a quoted field may span lines), in the rows yielded and in
    every error: a row with more or fewer fields than the header, a quote inside a field that is not
    quoted as a whole (``a "b" c`` instead of ``"a ""b"" c"``: the file was cut or written by hand), a
    quote never closed, a field over the reader's size limit. UTF-8 with or without a byte-order mark;
    an empty file or a header without rows is an error naming the file.
    """
    with _utf8(path, newline="") as f:
        lines = _Recorder(f)
        reader = csv.DictReader(lines, restkey="\0extra", strict=True)
        try:
            header = reader.fieldnames
            if not header:
                raise DataError(f"{path}: empty file, expected a header with columns {', '.join(required)}")
            missing = [c for c in required if c not in header]
            if missing:
                raise DataError(
                    f"{path}: missing column(s) {', '.join(missing)} (header: {', '.join(header)})"
                )
            rows = 0
            lines.record = []
            for row in reader:
                _check_row(f"{path}:{lines.row_start()}", row, header, "".join(lines.record))
                rows += 1
                yield lines.row_start(), row
                lines.record = []
            if not rows:
                raise DataError(f"{path}: a header but no rows")
        except csv.Error as e:
            raise DataError(f"{path}:{lines.row_start()}: {_csv_problem(e)}") from e


def _csv_problem(error: csv.Error) -> str:
    """What a csv.Error means for the row it stopped at, in words."""
    if "unexpected end of data" in str(error):
        return "a quote opened in this row is never closed (the file ends inside the field)"
    if "field larger than field limit" in str(error):
        return f"a field longer than {csv.field_size_limit():,} characters"
    return f"malformed CSV ({error})"


def _check_row(where: str, row: dict, header: Sequence[str], raw: str) -> None:
    """Raise a DataError naming ``where`` when ``row`` (read from the text ``raw``) has another number
    of fields than ``header`` or a quote in a field that is not quoted as a whole."""
    extra = row.pop("\0extra", [])
    if extra or None in row.values():
        n = len(header) + len(extra) - sum(v is None for v in row.values())
        raise DataError(f"{where}: {n} fields, the header has {len(header)}")
    for value in row.values():
        if '"' in value and '"' + value.replace('"', '""') + '"' not in raw:
            raise DataError(
                f"{where}: stray quote in the field {value[:60]!r}: a field "
                f'holding " must be quoted as a whole, with each " doubled'
            )


class _Recorder:
    """Iterates over the lines of a text file, counting them and keeping the lines read since ``record``
    was reset (the raw text of the CSV row being read)."""

    def __init__(self, lines: Iterator[str]):
        self._lines = lines
        self.record: list[str] = []
        self.count = 0

    def __iter__(self) -> _Recorder:
        return self

    def __next__(self) -> str:
        line = next(self._lines)
        self.count += 1
        self.record.append(line)
        return line

    def row_start(self) -> int:
        """The line the row being read starts on: the first recorded line that is not blank (the
        reader skips blank lines between rows)."""
        blank = next((k for k, line in enumerate(self.record) if line.strip("\r\n")), len(self.record))
        return self.count - len(self.record) + 1 + blank


@contextlib.contextmanager
def _utf8(path: str | os.PathLike, newline: str | None = None) -> Iterator[TextIO]:
    """The file opened as UTF-8 text (a byte-order mark is skipped); a decoding error becomes a
    DataError naming the file."""
    with open(path, encoding="utf-8-sig", newline=newline) as f:
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


def get_text(record: Mapping[str, Any], key: str, where: str) -> str:
    """``record[key]`` as a non-empty string (surrounding spaces removed); errors name ``where`` and the key."""
    value = get_field(record, key, where).strip()
    if not value:
        raise DataError(f"{where}: {key!r} is empty")
    return value


def strings(values: list, where: str) -> list[str]:
    """``values`` when every one is a string, else a DataError naming ``where``."""
    for k, value in enumerate(values):
        if not isinstance(value, str):
            raise DataError(
                f"{where}: entries must be strings, got {type(value).__name__} {value!r:.60} at index {k}"
            )
    return values


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
