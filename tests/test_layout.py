"""The package layout (issue 25): the top level holds the public entry points only, and every module that
moved still imports under its old name, as the same module object, with a FutureWarning; recipes
naming an old ``module:function`` keep loading."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from udpo._compat import MOVED, new_name

ROOT = Path(__file__).resolve().parents[1]


def test_top_level_holds_the_entry_points_and_packages():
    modules = sorted(p.stem for p in (ROOT / "udpo").glob("*.py"))
    packages = sorted(p.name for p in (ROOT / "udpo").iterdir() if (p / "__init__.py").is_file())
    assert modules == ["__init__", "_compat", "api", "pretrained", "threads"]
    assert packages == ["algorithms", "analysis", "cli", "config", "training"]


@pytest.mark.parametrize("old", sorted(MOVED))
def test_old_module_names_still_import(old):
    code = (
        "import importlib, warnings\n"
        "with warnings.catch_warnings(record=True) as seen:\n"
        "    warnings.simplefilter('always')\n"
        f"    old = importlib.import_module({old!r})\n"
        f"new = importlib.import_module({MOVED[old]!r})\n"
        "assert old is new, (old, new)\n"
        "assert old.__spec__.name == new.__name__\n"
        "assert any('moved to' in str(w.message) and w.category is FutureWarning for w in seen)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def test_submodules_of_moved_packages_are_the_same_objects():
    assert new_name("udpo.report.load") == "udpo.analysis.report.load" and new_name("udpo.config") is None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # asserted in a fresh process above
        old = importlib.import_module("udpo.commands.common")
    assert old is importlib.import_module("udpo.cli.common")


def test_a_recipe_naming_an_old_reward_function_still_loads():
    from udpo.algorithms.reward_functions import concise, load_reward_functions

    with pytest.warns(FutureWarning, match="udpo.reward_functions moved to udpo.algorithms.reward_functions"):
        (term,) = load_reward_functions(["udpo.reward_functions:concise"])
    assert term.fn is concise and term.name == "udpo.reward_functions:concise"
