"""The test suite's own rules, checked while it runs (a pytest plugin; ``tests/conftest.py`` loads it).

**Tiers.** A test that loads the real model (SmolLM2-135M-Instruct), starts an inference engine, starts
another process (a Python interpreter: a command, a multi-process job, a nested pytest; or a browser), or
trains for many iterations is marked ``slow``; the fast tier (``-m "not slow"``) loads no real weights and
starts no process. Three guards hold the line:

- the fixtures that hand out the real model (:data:`REAL_MODEL_FIXTURES`) refuse an unmarked test before
  anything is set up;
- an unmarked test runs with ``UDPO_CACHE`` pointing at a weightless copy of the default model's folder
  (its config and tokenizer, and a ``model.safetensors`` whose header names the rule), so loading the
  default model fails, in the test's own process and in every subprocess it starts;
- an unmarked test that starts a Python interpreter or a browser (:data:`GUARDED_PROGRAMS`) through
  ``subprocess`` fails at that call, with :data:`PROCESS_WORD` in the error (other programs, such as the
  ``ldconfig`` that ``ctypes.util.find_library`` runs, are left alone).

**Order.** Files with more slow tests run first: under ``-n 2 --dist loadfile`` (with pyproject's
``--no-loadscope-reorder``) the long files start early and the short ones fill in around them, instead
of one long file running alone at the end.

**Budget.** Each test file's time (setup, call and teardown of its tests, summed as one worker runs them)
must stay within ``--file-budget`` seconds (default :data:`FILE_BUDGET_S`; 0 turns the check off). The
summary lists the slowest files; a file over budget fails the run with its name.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest

#: fixtures that hand a test the real model's weights (directly or as a loaded engine)
REAL_MODEL_FIXTURES = frozenset({"model_path", "hf_backend", "lora_adapters", "vllm_backend", "vllm_server"})
#: what a failed load of the weightless copy says (a safetensors dtype that cannot exist)
GUARD_WORD = "UNMARKED_TEST_LOADED_THE_REAL_MODEL_MARK_IT_SLOW"
#: what an unmarked test that starts a guarded program is told
PROCESS_WORD = "UNMARKED_TEST_STARTED_A_PROCESS_MARK_IT_SLOW"
#: programs an unmarked test may not start: interpreters, the project's commands, launchers and browsers
GUARDED_PROGRAMS = ("python", "udpo", "train_udpo", "torchrun", "accelerate", "deepspeed", "chrom", "vllm")
#: seconds one test file may take by default
FILE_BUDGET_S = 480.0
#: the cache the session started with: where the real model lives (read before any test changes it)
REAL_CACHE = os.environ.get("UDPO_CACHE")

_file_seconds: dict[str, float] = defaultdict(float)
_over_budget: list[tuple[str, float]] = []
_started = time.monotonic()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--file-budget",
        type=float,
        default=FILE_BUDGET_S,
        help=f"seconds one test file may take before the run fails (default {FILE_BUDGET_S:g}; 0: no limit)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "slow: loads the real model, starts an engine or another process, or trains at length"
    )


def is_slow(item: pytest.Item) -> bool:
    return item.get_closest_marker("slow") is not None


def test_file(nodeid: str) -> str:
    return nodeid.split("::")[0]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Files with more slow tests first; the order within a file, and among equals, is kept."""
    slow = Counter(test_file(item.nodeid) for item in items if is_slow(item))
    items.sort(key=lambda item: -slow[test_file(item.nodeid)])


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Refuse an unmarked test that asks for the real model, before its fixtures are set up."""
    wanted = sorted(REAL_MODEL_FIXTURES.intersection(getattr(item, "fixturenames", ())))
    if wanted and not is_slow(item):
        pytest.fail(
            f"{item.nodeid} uses {', '.join(wanted)} (the real model) but is not marked slow: mark it "
            "@pytest.mark.slow, or build a tiny model from the tokenizer (fixture tokenizer_path)",
            pytrace=False,
        )


def write_weightless_copy(real: Path, out: Path) -> Path:
    """``out``: ``real``'s files less its weights, plus a ``model.safetensors`` that no loader can read and
    whose error names the rule (:data:`GUARD_WORD`)."""
    out.mkdir(parents=True, exist_ok=True)
    for f in real.iterdir():
        if f.is_file() and f.suffix != ".safetensors":
            shutil.copy2(f, out / f.name)
    header = json.dumps({"guard": {"dtype": GUARD_WORD, "shape": [1], "data_offsets": [0, 1]}}).encode()
    (out / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0")
    return out


@pytest.fixture(scope="session")
def weightless_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ``UDPO_CACHE`` whose default model has a config and a tokenizer but no readable weights."""
    from udpo.env.models import DEFAULT_MODEL, cache_dir, resolve_model

    cache = tmp_path_factory.mktemp("weightless_cache")
    saved = os.environ.get("UDPO_CACHE")
    if REAL_CACHE is None:
        os.environ.pop("UDPO_CACHE", None)
    else:
        os.environ["UDPO_CACHE"] = REAL_CACHE
    try:
        real = Path(resolve_model(DEFAULT_MODEL))
        assert real.is_relative_to(cache_dir()), real
    finally:
        if saved is None:
            os.environ.pop("UDPO_CACHE", None)
        else:
            os.environ["UDPO_CACHE"] = saved
    write_weightless_copy(real, cache / "models" / DEFAULT_MODEL)
    return cache


def guarded_program(args) -> str | None:
    """The program ``subprocess.Popen(args)`` would start, when an unmarked test may not start it."""
    first = args if isinstance(args, str | bytes | os.PathLike) else (list(args) or [""])[0]
    first = os.fsdecode(first)
    if isinstance(args, str):  # a shell line or a bare program name: its first word
        first = (first.split() or [""])[0]
    name = Path(first).name.lower()
    if first == sys.executable or name.startswith(GUARDED_PROGRAMS):
        return name
    return None


def _refusing_popen_init(popen_init, nodeid: str):
    def init(self, args, *rest, **kwargs):
        name = guarded_program(args)
        if name is not None:
            raise RuntimeError(
                f"{PROCESS_WORD}: {nodeid} starts {name!r} but is not marked slow: mark it "
                "@pytest.mark.slow, or call the code in this process"
            )
        popen_init(self, args, *rest, **kwargs)

    return init


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """An unmarked test, its fixtures of every scope included, may not start a guarded program."""
    if is_slow(item):
        yield
        return
    popen_init = subprocess.Popen.__init__
    subprocess.Popen.__init__ = _refusing_popen_init(popen_init, item.nodeid)  # type: ignore[method-assign]
    try:
        yield
    finally:
        subprocess.Popen.__init__ = popen_init  # type: ignore[method-assign]


@pytest.fixture(autouse=True)
def _no_real_weights_unless_slow(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Unmarked tests (and any process they start anyway) see the weightless cache."""
    if not is_slow(request.node):
        monkeypatch.setenv("UDPO_CACHE", str(request.getfixturevalue("weightless_cache")))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    if report.failed and not is_slow(item):
        if GUARD_WORD in str(report.longrepr):
            report.sections.append(
                ("real-model guard", f"{item.nodeid} is not marked slow but loaded the real model's weights")
            )
        if PROCESS_WORD in str(report.longrepr):
            report.sections.append(
                ("process guard", f"{item.nodeid} is not marked slow but started a process")
            )


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _file_seconds[test_file(report.nodeid)] += report.duration


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    budget = session.config.getoption("file_budget")
    if _is_worker(session.config) or not budget:
        return
    _over_budget[:] = sorted(((f, s) for f, s in _file_seconds.items() if s > budget), key=lambda x: -x[1])
    if _over_budget and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if _is_worker(config) or not _file_seconds:
        return
    budget = config.getoption("file_budget")
    tr = terminalreporter
    tr.write_sep("=", f"slowest test files (budget {budget:g} s a file)" if budget else "slowest test files")
    for name, seconds in sorted(_file_seconds.items(), key=lambda x: -x[1])[:15]:
        tr.write_line(f"{seconds:8.1f} s  {name}")
    tr.write_line(
        f"{sum(_file_seconds.values()):8.1f} s  in {len(_file_seconds)} files, summed over workers; "
        f"{time.monotonic() - _started:.0f} s of wall time"
    )
    for name, seconds in _over_budget:
        tr.write_line(f"FAILED test file budget: {name} took {seconds:.1f} s, over {budget:g} s", red=True)
