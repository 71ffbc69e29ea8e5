"""The run folder's one drawing (``udpo.env.run_folder``'s docstring) names every path ``RunFolder`` gives,
and iteration folders are told apart from anything else in the folder."""

from __future__ import annotations

from pathlib import Path

from udpo.env import run_folder
from udpo.env.run_folder import DebateFolder, RunFolder, iteration_folders, iteration_name, iteration_of

ROOT = Path("RUN_DIR")


def test_the_drawing_names_every_path_of_a_run_folder():
    folder = RunFolder(ROOT)
    paths = [
        folder.config,
        folder.calibration,
        folder.metrics,
        folder.warmup,
        folder.train,
        folder.evaluation(0).root,
        folder.attack_evaluations / iteration_name(10),
        folder.checkpoint(10),
        folder.checkpoint_staging(10),
        folder.checkpoint_replaced(10),
        folder.latest,
        folder.sync(0, 10),
        folder.lock,
    ]
    drawing = run_folder.__doc__ or ""
    for path in paths:
        assert path.relative_to(ROOT).as_posix() in drawing, path
    debates = folder.evaluation(0)
    assert debates.trajectories.name in drawing and debates.summary.name in drawing
    assert [ROOT / rel for rel in RunFolder.APPEND_ONLY] == [folder.train, folder.metrics]


def test_iteration_folders_are_named_iter_and_six_digits_or_more(tmp_path):
    assert iteration_name(7) == "iter_000007" and iteration_of("iter_000007") == 7
    assert iteration_of(iteration_name(1_234_567)) == 1_234_567
    for name in ("iter_7", "iter_000007.partial", ".staging-iter_000007", "latest"):
        assert iteration_of(name) is None, name
    for name in ("iter_000010", "iter_000002", ".staging-iter_000003", "iter_5"):
        (tmp_path / name).mkdir()
    (tmp_path / "iter_000004").write_text("a file, not a folder")
    assert iteration_folders(tmp_path) == [(2, tmp_path / "iter_000002"), (10, tmp_path / "iter_000010")]
    assert iteration_folders(tmp_path / "missing") == []
    evaluations = RunFolder(tmp_path)
    (tmp_path / "eval" / "iter_000003").mkdir(parents=True)
    assert evaluations.evaluated() == [(3, DebateFolder(tmp_path / "eval" / "iter_000003"))]
