"""The built wheel installs rewards/ and env/ as udpo.rewards and udpo.env, never as top-level packages."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def test_wheel_layout_and_imports_in_a_fresh_venv(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
    )
    wheel = next(tmp_path.glob("udpo-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.startswith("udpo-")}
    assert tops == {"udpo"}, f"unexpected top-level entries in the wheel: {tops}"
    assert "udpo/rewards/__init__.py" in names and "udpo/env/__init__.py" in names
    assert "udpo/env/backends/hf.py" in names

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    subprocess.run([py, "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True)
    # dependencies come from this environment's site-packages, the project only from the wheel
    deps = sysconfig.get_paths()["purelib"]
    probe = (
        "import importlib.util, udpo.rewards, udpo.env, udpo.cli;"
        "assert importlib.util.find_spec('rewards') is None, 'top-level rewards installed';"
        "assert importlib.util.find_spec('env') is None, 'top-level env installed';"
        "print(udpo.rewards.__file__); print(udpo.env.__file__)"
    )
    out = subprocess.run(
        [py, "-c", probe],
        cwd=tmp_path,
        env={"PYTHONPATH": deps, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert all(str(venv) in line for line in out.stdout.split())
    cli = subprocess.run(
        [venv / "bin" / "udpo", "--help"], env={"PYTHONPATH": deps}, capture_output=True, text=True
    )
    assert cli.returncode == 0 and "debate" in cli.stdout, cli.stderr
