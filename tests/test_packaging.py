"""env/ and rewards/ are udpo.env and udpo.rewards through the committed links udpo/env -> ../env and
udpo/rewards -> ../rewards: the built wheel holds their real files under udpo/ (never env/ or rewards/
at the top), and an editable install imports them from the checkout."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
import setuptools

ROOT = Path(__file__).resolve().parents[1]
LINKS = {"udpo/env": "../env", "udpo/rewards": "../rewards"}
#: this process's environment without the checkout on the path (pip would take the checkout's
#: udpo.egg-info for an installed udpo)
OUTSIDE = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
#: what the installed package runs, in a fresh venv: both subpackages and the command
PROBE = (
    "import importlib.util, udpo.rewards, udpo.env, udpo.env.backends.hf, udpo.cli;"
    "assert importlib.util.find_spec('rewards') is None, 'top-level rewards installed';"
    "assert importlib.util.find_spec('env') is None, 'top-level env installed';"
    "print(udpo.rewards.__file__); print(udpo.env.__file__)"
)


def test_the_links_are_committed_as_symbolic_links():
    """Mode 120000 in git's index (a link, not a copy), pointing at the folders beside udpo/."""
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-s", *LINKS], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    modes = {line.split("\t")[1]: line.split()[0] for line in listed}
    assert modes == dict.fromkeys(LINKS, "120000"), (
        f"udpo/env and udpo/rewards must be committed links: {modes}"
    )
    for link, target in LINKS.items():
        assert os.readlink(ROOT / link) == target, (
            f"{link} points at {os.readlink(ROOT / link)}, not {target}"
        )


def venv_python(where: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
    return where / "bin" / "python"


def add_dependencies(py: Path) -> None:
    """Let the venv read this environment's site-packages after its own (torch and the rest), once the
    project is installed: before, pip would take this environment's udpo for the one to install."""
    site = subprocess.run(
        [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # read after the project's own .pth (the names sort after "__editable__")
    Path(site, "zz_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")


def run_installed(py: Path, cwd: Path) -> list[str]:
    """The probe's printed paths, and ``udpo debate --help`` run by the venv's own script."""
    clean = {"PATH": "/usr/bin:/bin"}
    out = subprocess.run([py, "-c", PROBE], cwd=cwd, env=clean, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    cli = subprocess.run(
        [py.parent / "udpo", "debate", "--help"], cwd=cwd, env=clean, capture_output=True, text=True
    )
    assert cli.returncode == 0 and "--n-agents" in cli.stdout, cli.stderr
    return out.stdout.split()


@pytest.mark.slow
def test_wheel_holds_the_real_files_and_runs_in_a_fresh_venv(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path)]
        + [str(ROOT)],
        check=True,
    )
    wheel = next(tmp_path.glob("udpo-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        tops = {n.split("/")[0] for n in names if not n.startswith("udpo-")}
        assert tops == {"udpo"}, f"unexpected top-level entries in the wheel: {tops}"
        for folder in ("env", "rewards"):
            for source in (ROOT / folder).rglob("*.py"):
                inside = f"udpo/{source.relative_to(ROOT).as_posix()}"
                assert inside in names, f"{inside} is missing from the wheel"
                assert archive.read(inside) == source.read_bytes(), f"{inside} is not {source}'s text"

    venv = tmp_path / "venv"
    py = venv_python(venv)
    subprocess.run(
        [py, "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
        cwd=tmp_path,
        env=OUTSIDE,
        check=True,
    )
    add_dependencies(py)
    paths = run_installed(py, tmp_path)
    assert all(p.startswith(str(venv)) and os.path.realpath(p) == p for p in paths), paths


@pytest.mark.slow
def test_an_editable_install_imports_env_and_rewards_from_the_checkout(tmp_path):
    py = venv_python(tmp_path / "venv")
    # the build backend alone from this environment (no index): setuptools, through a folder of one link
    backend = tmp_path / "backend"
    backend.mkdir()
    (backend / "setuptools").symlink_to(Path(setuptools.__file__).parent)
    subprocess.run(
        [
            py,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-e",
            str(ROOT),
        ],
        cwd=tmp_path,
        env={**OUTSIDE, "PYTHONPATH": str(backend)},
        check=True,
    )
    add_dependencies(py)
    paths = run_installed(py, tmp_path)
    assert paths == [
        str(ROOT / "udpo" / "rewards" / "__init__.py"),
        str(ROOT / "udpo" / "env" / "__init__.py"),
    ]
