"""The one reader of JSON Lines files (task data and trajectory files alike), the one atomic writer
of JSON, text and binary files (:func:`write_json`, :func:`write_text_atomic`, :func:`write_bytes_atomic`),
and the one-line form of a read error that messages quote (:func:`brief`).

One JSON object per line, UTF-8 (a byte-order mark is accepted), blank lines skipped. Every error
names the file and the line: invalid UTF-8, invalid JSON, nesting too deep for the decoder, a value
that is not an object. An append-only file (trajectories) may end in a line that a killed writer
cut short: :func:`iter_jsonl` with ``append_only=True`` drops such a last line (it does not decode,
and nothing follows it) with a warning, and :func:`repair_tail` cuts it off before appending, so the
reader and the writer always agree on which lines a file holds. A last line that decodes but lacks
its newline is a whole record: it is read, and ``repair_tail`` gives it its newline.

A file written by :func:`write_json` is replaced whole: a reader, or the disk after a crash, finds the
old content or the new, never part of either.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

_BOM = b"\xef\xbb\xbf"


def brief(error: BaseException, limit: int = 200) -> str:
    """``Type: message`` of an error on one line, at most ``limit`` characters of message."""
    return f"{type(error).__name__}: {' '.join(str(error).split())[:limit]}"


def decode_line(line: bytes) -> dict[str, Any]:
    """The JSON object on one line, or ValueError saying what is wrong with it."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"not UTF-8 text ({e.reason} at byte {e.start})") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"not valid JSON ({e.msg} at column {e.colno})") from None
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object, got {type(value).__name__}")
    return value


def iter_jsonl(
    path: str | os.PathLike, error: type[Exception] = ValueError, append_only: bool = False
) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` for each non-blank line of ``path``; a bad line raises ``error``
    with ``path:line: what is wrong``. ``append_only``: drop a last line cut short (see the module
    docstring) instead of raising."""
    with open(path, "rb") as fh:
        yield from iter_jsonl_lines(fh, str(path), error, append_only)


def iter_jsonl_lines(
    lines: Iterable[bytes], where: str, error: type[Exception] = ValueError, append_only: bool = False
) -> Iterator[tuple[int, dict[str, Any]]]:
    """:func:`iter_jsonl` of lines of bytes read elsewhere (an archive member); errors name ``where``."""
    for lineno, line in enumerate(lines, start=1):
        if lineno == 1 and line.startswith(_BOM):
            line = line[len(_BOM) :]
        if not line.strip():
            continue
        try:
            record = decode_line(line)
        except ValueError as e:
            if append_only and not line.endswith(b"\n"):
                warnings.warn(
                    f"{where}:{lineno}: dropped a last line cut short by an interrupted write ({e})",
                    stacklevel=3,
                )
                return
            raise error(f"{where}:{lineno}: {e}") from None
        yield lineno, record


def repair_tail(path: str | os.PathLike) -> None:
    """Make ``path`` end with a whole line before appending: a last line without its newline gets one
    when it decodes (a whole record) and is cut off when it does not (a write cut short)."""
    path = Path(path)
    if not path.exists() or path.stat().st_size == 0:
        return
    with open(path, "rb+") as fh:
        fh.seek(-1, os.SEEK_END)
        if fh.read(1) == b"\n":
            return
        start = _last_line_start(fh)
        fh.seek(start)
        tail = fh.read()
        try:
            decode_line(tail[len(_BOM) :] if start == 0 and tail.startswith(_BOM) else tail)
        except ValueError:
            fh.truncate(start)
        else:
            fh.write(b"\n")
        fh.flush()
        os.fsync(fh.fileno())


def _last_line_start(fh, block: int = 1 << 16) -> int:
    """Offset just after the last newline of an open binary file (0 when it has none)."""
    end = fh.seek(0, os.SEEK_END)
    while end > 0:
        start = max(0, end - block)
        fh.seek(start)
        newline = fh.read(end - start).rfind(b"\n")
        if newline >= 0:
            return start + newline + 1
        end = start
    return 0


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically: a temporary file in the same folder (named for this
    process, so two processes never share one) is written, flushed and fsynced, then renamed over
    ``path`` (``os.replace``), so the new content is on disk before the name points at it. The folder is
    created when missing; a failed write leaves ``path`` as it was and no temporary file behind. (The
    rename itself is made durable by fsyncing the folder, which callers that need it do:
    ``udpo.training.checkpoint_store`` after its ``latest`` pointer.)"""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Replace ``path`` with ``text`` (UTF-8) atomically (:func:`write_bytes_atomic`)."""
    write_bytes_atomic(path, text.encode("utf-8"))


def write_json(path: str | os.PathLike, data: Any) -> None:
    """Write ``data`` as indented JSON (non-ASCII kept as is, a final newline) with
    :func:`write_text_atomic`: readers never see half a file."""
    write_text_atomic(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")
