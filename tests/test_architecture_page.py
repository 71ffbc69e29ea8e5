"""docs/architecture.md names every module: each module and subpackage under udpo/ (env/ and rewards/
through its links udpo/env and udpo/rewards) is named, in backticks, in its package's row of the page's
"Packages and modules" table, and every package has a row there. Pure file reads."""

from __future__ import annotations

import re

from package_tree import ROOT, python_files

PAGE = ROOT / "docs" / "architecture.md"
#: a row of the table: | `package` (`folder/` ...) | modules |
ROW = re.compile(r"^\| `(udpo[\w.]*)` \(`[^|]*\) \| (.*) \|$", flags=re.MULTILINE)


def packages() -> dict[str, set[str]]:
    """package -> the names of its modules and subpackages (``__init__`` left out)."""
    names = python_files()
    found: dict[str, set[str]] = {m: set() for m, path in names.items() if path.name == "__init__.py"}
    for module in names:
        parent, _, child = module.rpartition(".")
        if parent in found:
            found[parent].add(child)
    return found


def rows(text: str) -> dict[str, set[str]]:
    """package -> every word written in backticks in its row of the "Packages and modules" table."""
    section = text.split("## Packages and modules", 1)[1].split("\n## ", 1)[0]
    return {
        package: {
            word for span in re.findall(r"`([^`]+)`", cell) for word in re.split(r"[^\w]+", span) if word
        }
        for package, cell in ROW.findall(section)
    }


def test_every_package_has_a_row_and_every_module_is_named_in_it():
    listed, real = rows(PAGE.read_text(encoding="utf-8")), packages()
    assert set(listed) == set(real), (
        f"docs/architecture.md, Packages and modules: rows for {sorted(set(listed) - set(real))} name no "
        f"package; no row for {sorted(set(real) - set(listed))}"
    )
    missing = {
        package: sorted(names - listed[package]) for package, names in real.items() if names - listed[package]
    }
    assert not missing, f"docs/architecture.md does not name these modules in their package's row: {missing}"


def test_the_reader_sees_what_it_should():
    text = (
        "## Packages and modules\n\n| package | modules |\n|---|---|\n"
        "| `udpo.x` (`udpo/x/`) | `alpha` (a thing); `beta/` and `udpo.x.gamma` |\n"
        "| `udpo.y` (`y/`) | none named |\n\n## Next\n\n| `udpo.z` (`z/`) | `zeta` |\n"
    )
    assert rows(text) == {"udpo.x": {"alpha", "beta", "udpo", "x", "gamma"}, "udpo.y": set()}
    real = packages()
    assert {"trainer", "autosize"} <= real["udpo.training"] and "report" in real["udpo.analysis"]
    assert {"env", "rewards"} <= real["udpo"] and "backends" in real["udpo.env"]
