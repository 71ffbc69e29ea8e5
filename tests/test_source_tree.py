"""One source tree per process (udpo.cli.source_tree): a second checkout run with PYTHONPATH pointing at it,
while an editable install maps udpo.env and udpo.rewards to the installed checkout, is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from udpo.cli import main, source_tree


def fake_dirs(monkeypatch, dirs: dict[str, Path]) -> None:
    monkeypatch.setattr(source_tree, "package_dir", lambda name: dirs[name])


def test_this_checkout_is_one_tree():
    source_tree.check_one_source_tree()  # the repository's own layout: env/ and rewards/ beside udpo/
    home = source_tree.package_dir("udpo")
    assert home is not None and source_tree.package_dir("udpo.env") == home.parent / "env"


@pytest.mark.parametrize(
    "env, rewards",
    [
        ("/a/env", "/a/rewards"),  # this repository's layout, editable install
        ("/a/udpo/env", "/a/udpo/rewards"),  # an installed wheel, or links inside udpo/
    ],
)
def test_layouts_of_one_tree_pass(monkeypatch, env, rewards):
    fake_dirs(monkeypatch, {"udpo": Path("/a/udpo"), "udpo.env": Path(env), "udpo.rewards": Path(rewards)})
    source_tree.check_one_source_tree()


def test_a_pinned_checkout_with_the_installed_env_is_refused(monkeypatch, capsys):
    dirs = {
        "udpo": Path("/pinned/udpo"),
        "udpo.env": Path("/main/env"),
        "udpo.rewards": Path("/pinned/rewards"),
    }
    fake_dirs(monkeypatch, dirs)
    with pytest.raises(
        RuntimeError, match=r"udpo\.env is imported from /main/env but udpo from /pinned/udpo"
    ):
        source_tree.check_one_source_tree()
    assert main(["study", "x.yaml"]) == 2  # the command answers with the error before anything runs
    assert "two checkouts mixed" in capsys.readouterr().err
