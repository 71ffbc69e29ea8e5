"""The committed records under docs/lab/results name no machine's absolute paths: a record written on one
machine keeps its paths relative to the checkout (``env/backends/hf.py``, ``runs/...``), so it reads the
same in any clone. Every file is read, gzipped ones decompressed; binary files (figures) are left out.
Pure file reads."""

from __future__ import annotations

import gzip
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "lab" / "results"
#: the start of a path inside one machine: its home folders, its checkouts, its scratch space
MACHINE_PATH = re.compile(r"(?<![\w.~<>-])/(?:root|work|home|Users|tmp)/")


def text_of(path: Path) -> str | None:
    """A record file's text (gzip undone), None for a binary file."""
    raw = path.read_bytes()
    if path.suffix == ".gz":
        raw = gzip.decompress(raw)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def test_no_committed_record_names_an_absolute_path_of_its_machine():
    found = []
    files = [p for p in sorted(RESULTS.rglob("*")) if p.is_file()]
    assert len(files) > 50, f"only {len(files)} files under {RESULTS}: the records moved?"
    for path in files:
        text = text_of(path)
        for n, line in enumerate((text or "").splitlines(), 1):
            if MACHINE_PATH.search(line):
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:160]}")
    assert not found, (
        "records with a machine's absolute path (write it relative to the checkout):\n"
        + "\n".join(found[:20])
    )


def test_the_check_finds_what_it_should():
    assert MACHINE_PATH.search("Recompiling function _forward in /work/main/env/backends/static_decode.py")
    assert MACHINE_PATH.search('"model": "/tmp/gc/model"') and MACHINE_PATH.search("log /root/out/summary.md")
    assert not MACHINE_PATH.search("env/backends/static_decode.py:123, <check>/model, runs/tmp/x, a/home/b")
