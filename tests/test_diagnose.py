"""``udpo diagnose`` on synthetic trajectory files and on a ``udpo debate`` run of a tiny model: numbers,
tables, plots and bad input."""

from __future__ import annotations

import csv
import json
import random
import warnings
from pathlib import Path

import numpy as np
import pytest

from udpo.analysis import diagnose_plots
from udpo.analysis.diagnose import choose_baseline, per_question, summarize
from udpo.analysis.diagnose_run import default_label, injection_pattern, load_run
from udpo.cli import main
from udpo.rewards import diverse_agent_entropy, majority_vote, uncertainty
from udpo.rewards.statistics import auroc, failure_vs_success, pearson, selective_prediction, stratified_gains


def write_run(path: Path, seed: int, skill: float, n_questions: int = 60, repeats: int = 1) -> Path:
    """A run of N = 3, T = 2 debates: agents answer right with a chance that falls with the question's
    difficulty (shared by all runs) and grows over rounds; a run's ``skill`` shifts that chance."""
    rng, difficulty = random.Random(seed), random.Random(99)
    lines = []
    for q in range(n_questions):
        hard = difficulty.random()
        for _ in range(repeats):
            answers = []
            for _agent in range(3):
                row = []
                for t in range(3):
                    r = rng.random()
                    p = min(0.98, max(0.05, skill - hard + 0.15 * t))
                    row.append("A" if r < p else (None if r > 0.97 else rng.choice("BC")))
                answers.append(row)
            pred = majority_vote([a[-1] for a in answers], f"q{q}")
            lines.append(
                {
                    "question_id": f"q{q}",
                    "question": f"question {q}",
                    "gold": "A",
                    "answers": answers,
                    "prediction": pred,
                    "correct": pred == "A",
                    "turns": [],
                    "meta": {"task": "synthetic"},
                }
            )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    write_run(root / "udpo" / "trajectories.jsonl", seed=2, skill=1.0)
    write_run(root / "mad" / "trajectories.jsonl", seed=1, skill=0.75)
    out = root / "diagnosis"
    assert main(["diagnose", str(root / "udpo"), str(root / "mad"), "--out", str(out)]) == 0
    return root, out, json.loads((out / "summary.json").read_text())


def test_summary_numbers_match_the_formulas(two_runs):
    root, _, summary = two_runs
    assert set(summary["runs"]) == {"udpo", "mad"}
    for label in ("udpo", "mad"):
        records = read_jsonl(root / label / "trajectories.jsonl")
        correct = np.array([r["correct"] for r in records])
        u = {
            m: np.array([getattr(uncertainty(r["answers"], key=r["question_id"]), m) for r in records])
            for m in ("u_intra", "u_inter", "u_sys")
        }
        u["dae"] = np.array(
            [diverse_agent_entropy(r["answers"], key=r["question_id"]).normalized for r in records]
        )
        s = summary["runs"][label]
        assert s["n_debates"] == len(records) == 60
        assert s["accuracy"] == pytest.approx(correct.mean())
        assert s["groups"] == [
            {"task": "synthetic", "n_agents": 3, "n_rounds": 2, "n_debates": 60, "accuracy": s["accuracy"]}
            | {m: s[m] for m in u}
        ]
        for m, values in u.items():
            assert s[m] == pytest.approx(values.mean())
            expected = failure_vs_success(values, correct)
            assert s["failure_vs_success"][m]["p_value"] == pytest.approx(expected.p_value)
            assert s["failure_vs_success"][m]["cohens_d"] == pytest.approx(expected.cohens_d)
            r, p = pearson(values, correct.astype(float))
            assert s["correlation_with_correct"][m] == pytest.approx({"r": r, "p_value": p})
            assert s["auroc"][m] == pytest.approx(auroc(values, ~correct))
            curve = selective_prediction(values, correct)
            assert [c["n_kept"] for c in s["selective_prediction"][m]] == [c["n_kept"] for c in curve]
            assert [c["accuracy"] for c in s["selective_prediction"][m]] == pytest.approx(
                [c["accuracy"] for c in curve]
            )
        assert s["correlation_matrix"]["variables"] == ["u_intra", "u_inter", "u_sys", "dae", "correct"]
        # the synthetic runs are built so that uncertainty predicts failure
        assert s["failure_vs_success"]["u_sys"]["cohens_d"] > 0
        assert s["correlation_with_correct"]["u_sys"]["r"] < 0


def test_stratified_gains_use_the_mad_run_as_baseline(two_runs):
    root, _, summary = two_runs
    assert summary["baseline"] == "mad"  # recognised by its label although given second
    gains = summary["stratified_gains"]
    assert set(gains) == {"udpo"}
    mad = read_jsonl(root / "mad" / "trajectories.jsonl")
    udpo = {r["question_id"]: r for r in read_jsonl(root / "udpo" / "trajectories.jsonl")}
    expected = stratified_gains(
        [uncertainty(r["answers"], key=r["question_id"]).u_sys for r in mad],
        [float(r["correct"]) for r in mad],
        [float(udpo[r["question_id"]]["correct"]) for r in mad],
    )
    assert gains["udpo"]["n_shared_questions"] == 60
    got = gains["udpo"]["bins"]
    assert [b["bin"] for b in got] == ["[0, 0.2)", "[0.2, 0.4)", "[0.4, 0.6)", "[0.6, 0.8)", "[0.8, 1]"]
    for g, e in zip(got, expected, strict=True):
        assert g["n_questions"] == e["n_questions"]
        if e["n_questions"]:
            assert g["gain"] == pytest.approx(e["gain"])
        else:
            assert g["gain"] is None  # NaN is written as null


def test_tables_and_plots_are_written(two_runs):
    _, out, summary = two_runs
    with open(out / "debates.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 120 and {r["run"] for r in rows} == {"udpo", "mad"}
    assert set(rows[0]) >= {"question_id", "correct", "u_intra", "u_inter", "u_sys", "loo_instability", "dae"}
    for name in (
        "runs",
        "groups",
        "failure_vs_success",
        "correlations",
        "selective_prediction",
        "stratified_gains",
    ):
        with open(out / f"{name}.csv") as fh:
            assert len(list(csv.reader(fh))) > 1, name
    with open(out / "selective_prediction.csv") as fh:
        assert len(list(csv.DictReader(fh))) == 2 * 4 * 10  # runs x metrics x coverages
    pngs = ["distributions_mad", "distributions_udpo", "correlation_mad", "correlation_udpo"]
    for name in [*pngs, "selective_prediction", "stratified_gains"]:
        data = (out / f"{name}.png").read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, name
    assert sorted(summary["files"]) == sorted(str(p) for p in out.iterdir())


def test_figures_are_labelled_and_legends_name_every_series(tmp_path):
    runs = [
        load_run(write_run(tmp_path / f"{label}.jsonl", seed=seed, skill=skill, n_questions=20))
        for label, seed, skill in (("mad", 1, 0.7), ("udpo", 2, 1.0), ("mappo", 3, 0.9))
    ]
    summary = summarize(runs)
    figures = dict(diagnose_plots.figures(runs, summary))
    stems = ["distributions_mad", "correlation_mad", "distributions_udpo", "correlation_udpo"]
    stems += ["distributions_mappo", "correlation_mappo", "selective_prediction", "stratified_gains"]
    assert sorted(figures) == sorted(stems)
    for stem, fig in figures.items():
        fig.draw_without_rendering()  # lay out, so legend and axes positions are final
        plots = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
        assert plots, stem
        legends = [leg for leg in [*fig.legends, *(ax.get_legend() for ax in plots)] if leg is not None]
        legend_texts = {t.get_text() for leg in legends for t in leg.get_texts()}
        for ax in plots:
            assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel(), (stem, ax.get_title())
            series = ax.get_legend_handles_labels()[1]  # labelled lines and bar groups
            if len(series) > 1:
                assert set(series) <= legend_texts, (stem, series, legend_texts)
        for leg in legends:  # no legend covers the data area of any panel
            box = leg.get_window_extent()
            assert not any(box.overlaps(ax.get_window_extent()) for ax in plots), stem
    selective = figures["selective_prediction"]
    assert [ax.get_title() for ax in selective.axes] == ["mad (n = 20)", "udpo (n = 20)", "mappo (n = 20)"]
    names = ["rank by U_intra", "rank by U_inter", "rank by U_sys", "rank by DAE", "all debates"]
    assert [t.get_text() for t in selective.legends[0].get_texts()] == names
    gains = figures["stratified_gains"].axes[0]
    assert [t.get_text() for t in gains.get_legend().get_texts()] == ["udpo", "mappo"]  # baseline: mad
    assert "'mad'" in gains.get_xlabel()
    heatmap = figures["correlation_udpo"].axes[0]
    ticks = [t.get_text() for t in heatmap.get_xticklabels()]
    assert ticks == ["U_intra", "U_inter", "U_sys", "DAE", "Correct"]
    assert figures["correlation_udpo"].axes[1].get_ylabel() == "Pearson r"
    panels = figures["distributions_mad"].axes
    assert [ax.get_xlabel().split()[0] for ax in panels] == ["U_intra", "U_inter", "U_sys", "DAE"]
    n_fail = int((~runs[0].correct).sum())
    assert f"failed debates (n = {n_fail})" in {
        t.get_text() for t in figures["distributions_mad"].legends[0].texts
    }


def test_diagnose_a_real_debate_run(tmp_path, tokenizer_path, capsys):
    """A run folder as ``udpo debate`` writes it, from a tiny random model that answers numbers."""
    from tiny_models import DIGITS, build_tiny_llama

    model = build_tiny_llama(tmp_path / "model", tokenizer_path, initializer_range=0.3, favour=DIGITS)
    run = tmp_path / "mad"
    debate = ["debate", "--model", model, "--task", "arithmetic", "--limit", "3", "--n-agents", "2"]
    debate += ["--rounds", "1", "--max-tokens", "24", "--debate-batch-size", "3", "--output-dir", str(run)]
    assert main(debate) == 0, capsys.readouterr().err
    expected = json.loads((run / "summary.json").read_text())
    out = tmp_path / "diagnosis"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(["diagnose", str(run), "--out", str(out)]) == 0
    # nothing numeric to warn about (SciPy's precision-loss warning on near-constant groups included)
    assert not [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]

    summary = json.loads((out / "summary.json").read_text())
    s = summary["runs"]["mad"]
    assert s["n_debates"] == expected["n_questions"] == 3
    assert s["accuracy"] == pytest.approx(expected["accuracy"])
    for metric in ("u_intra", "u_inter", "u_sys"):
        assert s[metric] == pytest.approx(expected[metric])
        curve = s["selective_prediction"][metric]
        assert [c["k"] for c in curve] == list(range(10, 101, 10))
        assert curve[-1]["accuracy"] == pytest.approx(expected["accuracy"])  # k = 100 keeps every debate
    assert [(g["task"], g["n_agents"], g["n_rounds"]) for g in s["groups"]] == [("arithmetic", 2, 1)]
    # the forms recorded in every turn, per agent, as the debate's own summary counted them
    assert s["forms"] == expected["forms"]
    assert [f["turns"] for f in s["forms"].values()] == [6, 6]
    csvs = [
        "forms",
        "debates",
        "runs",
        "groups",
        "failure_vs_success",
        "correlations",
        "selective_prediction",
        "woozle",
    ]
    pngs = ["distributions_mad", "correlation_mad", "selective_prediction"]
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["summary.json", *(f"{c}.csv" for c in csvs), *(f"{p}.png" for p in pngs)]
    )
    with open(out / "debates.csv") as fh:
        rows = list(csv.DictReader(fh))
    trajectories = read_jsonl(run / "trajectories.jsonl")
    assert [r["question_id"] for r in rows] == [t["question_id"] for t in trajectories]
    assert [int(r["correct"]) for r in rows] == [int(t["correct"]) for t in trajectories]


def test_console_command_on_a_jsonl_file(tmp_path, capsys):
    file = write_run(tmp_path / "mad_run.jsonl", seed=5, skill=0.8, n_questions=20)
    out = tmp_path / "out"
    rc = main(["diagnose", str(file), "--out", str(out), "--labels", "standard mad", "--no-plots"])
    printed = capsys.readouterr()
    assert rc == 0, printed.err
    assert "standard mad" in printed.out and "U_sys" in printed.out
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["runs"]) == ["standard mad"]
    assert "stratified_gains" not in summary  # one run: nothing to compare
    assert not list(out.glob("*.png"))


def test_several_debates_per_question_are_averaged(tmp_path):
    run = load_run(write_run(tmp_path / "r.jsonl", seed=3, skill=0.8, n_questions=5, repeats=3))
    per_q = per_question(run)
    assert len(run) == 15 and len(per_q) == 5
    assert per_q["q0"][1] == pytest.approx(run.correct[:3].mean())
    assert per_q["q0"][0] == pytest.approx(run.metrics.u_sys[:3].mean())


def test_labels_and_baseline_choice(tmp_path):
    assert default_label(tmp_path / "x" / "trajectories.jsonl") == "x"
    assert default_label(tmp_path / "run7.jsonl") == "run7"
    assert choose_baseline(["udpo", "Standard_MAD"], None) == "Standard_MAD"
    assert choose_baseline(["a", "b"], None) == "a"
    assert choose_baseline(["a", "b"], "b") == "b"


def _diagnose_error(capsys, args) -> str:
    assert main(["diagnose", *args]) == 2
    return capsys.readouterr().err


def test_bad_input_errors_name_the_problem(tmp_path, capsys):
    good = write_run(tmp_path / "good.jsonl", seed=1, skill=0.8, n_questions=5)
    out = str(tmp_path / "out")

    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    assert "empty.jsonl: no debates in this file (it is empty)" in _diagnose_error(
        capsys, [str(empty), "--out", out]
    )

    lines = good.read_text().splitlines()
    missing = json.loads(lines[1])
    del missing["answers"]
    broken = tmp_path / "broken.jsonl"
    broken.write_text("\n".join([lines[0], json.dumps(missing), *lines[2:]]) + "\n")
    assert "broken.jsonl:2: missing key(s) answers" in _diagnose_error(capsys, [str(broken), "--out", out])

    ragged = tmp_path / "ragged.jsonl"
    bad = json.loads(lines[0]) | {"answers": [["A", "B"], ["A"]]}
    ragged.write_text(json.dumps(bad) + "\n")
    assert "ragged.jsonl:1: 'answers' is ragged" in _diagnose_error(capsys, [str(ragged), "--out", out])

    # bad answers are located by line (1-based, blank lines counted), not by debate index
    nan = tmp_path / "nan.jsonl"
    with_nan = json.loads(lines[1])
    with_nan["answers"][1][2] = float("nan")  # json writes it as NaN, which Python's json reads back
    nan.write_text(lines[0] + "\n\n" + json.dumps(with_nan) + "\n")
    err = _diagnose_error(capsys, [str(nan), "--out", out])
    assert f"{nan}:3 (question_id 'q1'): answer of agent 1 at round 2 is NaN" in err
    unhashable = tmp_path / "unhashable.jsonl"
    with_list = json.loads(lines[2]) | {"answers": [["A", "B", "A"], ["A", ["B"], "A"]]}
    unhashable.write_text("\n".join([lines[0], lines[1], "", "  ", json.dumps(with_list)]) + "\n")
    err = _diagnose_error(capsys, [str(unhashable), "--out", out])
    assert f"{unhashable}:5 (question_id 'q2'): answer of agent 1 at round 1 is unhashable" in err

    assert "got 1 labels for 2 runs" in _diagnose_error(
        capsys, [str(good), str(good), "--out", out, "--labels", "x"]
    )
    assert "share the label" in _diagnose_error(capsys, [str(good), str(good), "--out", out])
    err = _diagnose_error(
        capsys, [str(good), str(good), "--out", out, "--labels", "a,b", "--baseline-run", "c"]
    )
    assert "--baseline-run 'c' is not a run label" in err
    assert "no run folder or trajectory file" in _diagnose_error(
        capsys, [str(tmp_path / "nope"), "--out", out]
    )
    assert "has no trajectories.jsonl" in _diagnose_error(capsys, [str(tmp_path), "--out", out])


@pytest.mark.slow
def test_degenerate_runs_give_nulls_not_crashes(tmp_path):
    # every debate right and unanimous (constant metrics, no failures), with two team shapes in one file
    record = {"question": "x", "gold": "A", "prediction": "A", "correct": True, "turns": [], "meta": {}}
    lines = [record | {"question_id": f"q{q}", "answers": [["A", "A"]] * (2 + q % 2)} for q in range(6)]
    file = tmp_path / "allright.jsonl"
    file.write_text("".join(json.dumps(line) + "\n" for line in lines))
    other = write_run(tmp_path / "other.jsonl", seed=4, skill=0.8, n_questions=6)
    out = tmp_path / "out"
    assert main(["diagnose", str(file), str(other), "--out", str(out), "--baseline-run", "allright"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    s = summary["runs"]["allright"]
    assert s["accuracy"] == 1.0 and s["u_sys"] == 0.0
    assert [(g["n_agents"], g["n_debates"]) for g in s["groups"]] == [(2, 3), (3, 3)]
    assert s["failure_vs_success"]["u_sys"] == {
        "n_fail": 0,
        "n_success": 6,
        "mean_fail": None,
        "mean_success": 0.0,
        "t_statistic": None,
        "p_value": None,
        "cohens_d": None,
    }
    assert s["correlation_with_correct"]["u_intra"] == {"r": None, "p_value": None}
    bins = summary["stratified_gains"]["other"]["bins"]
    assert bins[0]["n_questions"] == 6 and all(b["gain"] is None for b in bins[1:])
    assert (out / "distributions_allright.png").stat().st_size > 10_000


def test_injection_pattern_reads_protocol_stages_and_ignores_procedure_names():
    meta = {"protocol": {"stages": [{"name": "digra"}, {"name": "inject", "pattern": ["wrong", "correct"]}]}}
    assert injection_pattern(meta) == ("wrong", "correct")
    assert injection_pattern({"protocol": {"stages": [{"name": "digra"}]}}) is None
    assert injection_pattern({"protocol": "diverse_agent_entropy"}) is None  # a procedure's name
    assert injection_pattern({}) is None


def test_the_gains_figure_marks_an_empty_bin_once_and_writes_many_values_upright():
    def bins(gain):
        return [
            {"bin": "[0, 0.5)", "n_questions": 4, "gain": gain},
            {"bin": "[0.5, 1]", "n_questions": 0, "gain": None},
        ]

    for n_runs, rotation in ((2, 0), (5, 90)):
        gains = {f"run{k}": {"bins": bins(0.1 * k)} for k in range(n_runs)}
        ax = diagnose_plots.gains_figure({"baseline": "mad", "stratified_gains": gains}).axes[0]
        texts = [t.get_text() for t in ax.texts]
        assert texts.count("no questions") == 1 and "n/a" not in texts
        values = [t for t in ax.texts if t.get_text() != "no questions"]
        assert [t.get_text() for t in values] == [f"{10 * k:+d}" for k in range(n_runs)]
        assert {t.get_rotation() for t in values} == {rotation}
