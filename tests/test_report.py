"""``udpo report``: pages of real run folders, checked in headless Chromium (selenium).

Run folders are written by udpo itself: a short debate of a tiny random model that answers numbers, a
short training run of the tiny random model (``tiny_model``: the real code path at a fraction of the
cost), an attack evaluation through the scripted backend, and trajectory files written with
``TrajectoryWriter`` for the injection, comparison and 10,000-debate checks. Without Chromium the
browser tests are skipped, or fail when ``CI`` is set.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from udpo.analysis.report import NotARunError, load_run, write_report
from udpo.analysis.report.page import script_json
from udpo.analysis.report.svg import line_plot, nice_ticks
from udpo.cli import main
from udpo.env.trajectory import Trajectory, TrajectoryWriter, Turn, iter_records
from udpo.rewards import majority_vote

REPO = Path(__file__).resolve().parents[1]
INJECTION = (
    '</script><script>window.__pwned = 1</script><img src="x" onerror="window.__pwned = 2"><b>bold</b>'
)
LOAD_LIMIT_S = 3.0  # issue 15: 10,000 debates open in under 3 seconds


# --- run folders -------------------------------------------------------------------------------
def debate(qid: str, gold, answers: list[list], texts: list[list[str]] | None = None, **meta) -> Trajectory:
    """A debate record as udpo writes it: the vote of the last round decides ``correct``."""
    prediction = majority_vote([row[-1] for row in answers], qid)
    turns = [
        [
            Turn(
                agent=i,
                round=t,
                messages=[],
                text=texts[i][t] if texts else f"agent {i} says {a}",
                answer=a,
                finish_reason="length" if a is None else "stop",
            )
            for t, a in enumerate(row)
        ]
        for i, row in enumerate(answers)
    ]
    return Trajectory(
        question_id=qid,
        question=f"Question {qid}: what is the answer?",
        gold=gold,
        answers=answers,
        prediction=prediction,
        correct=prediction is not None and prediction == gold,
        turns=turns,
        meta={"task": "synthetic", **meta},
    )


def write_run(folder: Path, debates: list[Trajectory]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    with TrajectoryWriter(folder / "trajectories.jsonl") as w:
        w.write(debates)
    return folder


#: three debates with a known grid: q0 right (agent 1 unparsed in round 0), q1 wrong, q2 right
KNOWN = [
    debate("q0", "4", [["4", "4", "4"], [None, "5", "4"]]),
    debate("q1", "10", [["7", "8", "8"], ["10", "8", "8"]]),
    debate("q2", "3", [["3", "3", "3"], ["3", "3", "3"]]),
]


@pytest.fixture(scope="session")
def known_run(tmp_path_factory) -> Path:
    return write_run(tmp_path_factory.mktemp("known") / "known", KNOWN)


@pytest.fixture(scope="module")
def digit_model(tokenizer_path, tmp_path_factory) -> str:
    """A tiny random model that favours digits (tests/tiny_models.py): answers that parse and differ."""
    from tiny_models import DIGITS, build_tiny_llama

    folder = tmp_path_factory.mktemp("digit_model")
    return build_tiny_llama(folder, tokenizer_path, initializer_range=0.3, favour=DIGITS)


@pytest.fixture(scope="module")
def real_debate(tmp_path_factory, digit_model) -> Path:
    """``udpo debate`` on a tiny model that answers numbers: 2 arithmetic questions, 2 agents, 2 rounds,
    32 tokens."""
    out = tmp_path_factory.mktemp("debate") / "arithmetic"
    cmd = ["debate", "--model", digit_model, "--task", "arithmetic", "--n-agents", "2", "--rounds", "2"]
    assert main([*cmd, "--limit", "2", "--max-tokens", "32", "--no-progress", "--output-dir", str(out)]) == 0
    return out


@pytest.fixture(scope="session")
def real_training(tmp_path_factory, tiny_model) -> Path:
    """``udpo train`` on the tiny model (tests/train_helpers.py's settings): warm-up calibration,
    2 iterations, evaluations before and after."""
    sys.path.insert(0, str(Path(__file__).parent))
    from train_helpers import write_recipe

    root = tmp_path_factory.mktemp("training")
    recipe = write_recipe(
        root / "recipe.yaml", tiny_model, output_dir=str(root / "run"), max_iterations=2, warmup_fraction=0.5
    )
    assert main(["train", "--config", str(recipe)]) == 0
    return root / "run"


def sly_script(request, n: int) -> str:
    """Scripted team: honest agents answer the arithmetic question right, an AutoTransform'ed agent
    (the attacker's system prompt) one more."""
    system = request.messages[0]["content"] if request.messages[0]["role"] == "system" else ""
    if "red-team" in system:
        return "You are a sly solver who always adds one to the true answer."
    question = next(m["content"] for m in request.messages if m["role"] == "user")
    value = int(eval(re.search(r"What is (.+?)\?", question).group(1).replace("/", "//")))
    return f"So the answer is \\boxed{{{value + 1 if 'sly' in system else value}}}."


@pytest.fixture(scope="session")
def attack_run(tmp_path_factory) -> Path:
    """An attack evaluation folder as ``udpo eval`` writes it (scripted backend: no model)."""
    from udpo.analysis.attack_eval import compromised_sets, evaluate_attacks
    from udpo.env.attacks import AttackConfig
    from udpo.env.backends.scripted import ScriptedBackend
    from udpo.env.debate import DebateConfig
    from udpo.env.tasks import get_task

    root = tmp_path_factory.mktemp("attack")
    task = get_task("arithmetic")
    evaluate_attacks(
        task,
        ScriptedBackend(sly_script),
        task.load(split="test", limit=3),
        DebateConfig(n_agents=3, rounds=1),
        AttackConfig(name="autotransform", cache_dir=str(root / "cache")),
        compromised_sets(3, [1]),
        base_model="team-base",
        out_dir=root / "out",
        progress=False,
    )
    return root / "out"


@pytest.fixture(scope="session")
def big_run(tmp_path_factory) -> Path:
    """10,000 debates (3 agents x 3 rounds, a sentence of text per turn)."""
    debates = []
    for k in range(10_000):
        gold = str(k % 7)
        answers = [[str((k + i * t) % 7) if (k + i + t) % 11 else None for t in range(3)] for i in range(3)]
        texts = [
            [
                f"Agent {i} in round {t} of debate {k} reasons a while and answers {a}."
                for t, a in enumerate(r)
            ]
            for i, r in enumerate(answers)
        ]
        debates.append(debate(f"big-{k}", gold, answers, texts))
    return write_run(tmp_path_factory.mktemp("big") / "big", debates)


# --- the browser -------------------------------------------------------------------------------
def find_chromium() -> tuple[str, str] | None:
    browser = next((p for n in ("chromium", "chromium-browser") if (p := shutil.which(n))), None)
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


@pytest.fixture(scope="session")
def browser():
    """Headless Chromium through selenium; skipped without it (a failure when CI is set)."""
    found = find_chromium()
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        found = None
    if found is None:
        why = "headless Chromium tests need chromium, chromedriver and selenium (apt-get install chromium chromium-driver)"
        if os.environ.get("CI"):
            pytest.fail(f"CI is set but {why}")
        pytest.skip(why)
    options = webdriver.ChromeOptions()
    options.binary_location = found[0]
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,1000"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(found[1]), options=options)
    yield driver
    driver.quit()


def open_page(driver, page: Path) -> list[dict]:
    """Load a report; returns the browser's console entries at warning level or worse."""
    driver.get_log("browser")  # forget earlier pages' messages
    driver.get(page.resolve().as_uri())
    wait(driver, lambda d: d.execute_script("return document.body.getAttribute('data-ready')") == "1")
    return [e for e in driver.get_log("browser") if e["level"] in ("WARNING", "SEVERE")]


def wait(driver, condition, timeout: float = 10.0):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout).until(condition)


def open_debate(driver, qid: str, within: str = "#debates"):
    """Click a debate open; returns its element once its grid is there."""
    from selenium.webdriver.common.by import By

    item = driver.find_element(By.CSS_SELECTOR, f'{within} details.debate[data-qid="{qid}"]')
    item.find_element(By.TAG_NAME, "summary").click()
    wait(driver, lambda d: item.find_elements(By.CSS_SELECTOR, "table.grid"))
    return item


def grid_cells(item) -> dict[tuple[int, int], tuple[str, str]]:
    """(agent, round) -> (cell text, cell class) of the first grid in an opened debate."""
    from selenium.webdriver.common.by import By

    table = item.find_element(By.CSS_SELECTOR, "table.grid")
    return {
        (int(c.get_attribute("data-agent")), int(c.get_attribute("data-round"))): (
            c.text,
            c.get_attribute("class"),
        )
        for c in table.find_elements(By.CSS_SELECTOR, "td.cell")
    }


def shown_ids(driver, within: str = "#debates") -> list[str]:
    from selenium.webdriver.common.by import By

    return [
        e.get_attribute("data-qid") for e in driver.find_elements(By.CSS_SELECTOR, f"{within} details.debate")
    ]


def click(driver, element_id: str) -> None:
    from selenium.webdriver.common.by import By

    driver.find_element(By.ID, element_id).click()


def report(tmp_path: Path, *runs: Path, name: str = "report.html") -> Path:
    out = tmp_path / name
    assert main(["report", *map(str, runs), "--out", str(out)]) == 0
    return out


# --- tests -------------------------------------------------------------------------------------
@pytest.mark.slow
def test_known_grid_filters_sorting_and_search(browser, known_run, tmp_path):
    page = report(tmp_path, known_run)
    assert open_page(browser, page) == []
    assert shown_ids(browser) == ["q0", "q1", "q2"]
    cells = grid_cells(open_debate(browser, "q0"))
    assert {k: v[0] for k, v in cells.items()} == {
        (0, 0): "4",
        (0, 1): "4",
        (0, 2): "4",
        (1, 0): "None",
        (1, 1): "5",
        (1, 2): "4",
    }
    assert "gold" in cells[0, 0][1] and "none" in cells[1, 0][1] and "wrong" in cells[1, 1][1]
    # a turn's text on demand
    from selenium.webdriver.common.by import By

    item = browser.find_element(By.CSS_SELECTOR, 'details.debate[data-qid="q0"]')
    item.find_element(By.CSS_SELECTOR, 'td[data-agent="1"][data-round="1"]').click()
    assert item.find_element(By.CSS_SELECTOR, "pre.text").text == "agent 1 says 5"

    click(browser, "filter-wrong")
    assert shown_ids(browser) == ["q1"]
    click(browser, "filter-correct")
    assert shown_ids(browser) == ["q0", "q2"]
    click(browser, "filter-all")
    Select = __import__("selenium.webdriver.support.ui", fromlist=["Select"]).Select
    Select(browser.find_element(By.ID, "sort")).select_by_value("u_sys")
    assert shown_ids(browser)[-1] == "q2"  # unanimous from the start: no uncertainty
    assert shown_ids(browser)[0] in ("q0", "q1")
    browser.find_element(By.ID, "search").send_keys("Q1:")
    wait(browser, lambda d: shown_ids(d) == ["q1"])
    assert browser.find_element(By.ID, "count").text.startswith("1 of 3 debates")


@pytest.mark.slow
def test_injected_html_in_model_text_stays_text(browser, tmp_path):
    hostile = debate(
        "<script>x</script>",
        "1",
        [["1", INJECTION], ["1", "1"]],
        texts=[[INJECTION, INJECTION], ["fine", "<i>also fine</i>"]],
    )
    hostile.question = INJECTION
    run = write_run(tmp_path / "hostile", [hostile])
    page = report(tmp_path, run)
    html = page.read_text(encoding="utf-8")
    assert "window.__pwned" in html  # it is in the page, but only as escaped JSON
    assert "<script>window.__pwned" not in html and "<img" not in html
    assert open_page(browser, page) == []
    from selenium.webdriver.common.by import By

    item = open_debate(browser, "<script>x</script>")
    item.find_element(By.CSS_SELECTOR, 'td[data-agent="0"][data-round="1"]').click()
    assert item.find_element(By.CSS_SELECTOR, "pre.text").get_attribute("textContent") == INJECTION
    assert item.find_element(By.CSS_SELECTOR, ".question").get_attribute("textContent") == INJECTION
    assert grid_cells(item)[0, 1][0] == INJECTION
    assert browser.execute_script("return window.__pwned") is None
    assert browser.find_elements(By.CSS_SELECTOR, "#browse img, #browse b, #browse i") == []


@pytest.mark.slow
def test_who_read_whom_is_shown_where_a_turn_did_not_read_every_peer(browser, tmp_path):
    from selenium.webdriver.common.by import By

    from udpo.analysis.report.load import compact_debate

    everyone = debate("all", "1", [["1", "1"], ["2", "1"], ["1", "1"]])
    sparse = debate("ring", "1", [["1", "1"], ["2", "1"], ["1", "1"]])
    for t in (everyone, sparse):
        for i in range(3):
            t.turns[i][1].reads = [[j, 0] for j in range(3) if j != i]
    sparse.turns[0][1].reads = [[1, 0]]  # agent 0 read only agent 1
    sparse.turns[2][1].reads = []
    records = [
        json.loads(line)
        for line in write_run(tmp_path / "reads", [everyone, sparse])
        .joinpath("trajectories.jsonl")
        .read_text()
        .splitlines()
    ]
    assert "r" not in compact_debate(records[0], [0, 0, 0], {})  # Standard MAD: nothing to say
    assert compact_debate(records[1], [0, 0, 0], {})["r"] == {
        "0,1": [[1, 0]],
        "1,1": [[0, 0], [2, 0]],
        "2,1": [],
    }
    broken = json.loads(json.dumps(records[1]))
    broken["turns"][0][1]["reads"] = "agent 1"  # not pairs: left out, not an error
    assert "0,1" not in compact_debate(broken, [0, 0, 0], {})["r"]

    assert open_page(browser, report(tmp_path, tmp_path / "reads")) == []
    item = open_debate(browser, "ring")
    item.find_element(By.CSS_SELECTOR, 'td[data-agent="0"][data-round="1"]').click()
    assert item.find_element(By.CSS_SELECTOR, "p.reads").text == "read: agent 1 (round 0)"
    item.find_element(By.CSS_SELECTOR, 'td[data-agent="2"][data-round="1"]').click()
    assert item.find_element(By.CSS_SELECTOR, "p.reads").text == "read: nobody"
    item = open_debate(browser, "all")
    item.find_element(By.CSS_SELECTOR, 'td[data-agent="0"][data-round="1"]').click()
    assert item.find_element(By.CSS_SELECTOR, "pre.text").text == "agent 0 says 1"
    assert item.find_elements(By.CSS_SELECTOR, "p.reads") == []


@pytest.mark.slow
def test_two_runs_side_by_side_changed_outcomes_first(browser, tmp_path):
    before = [
        debate(f"q{k}", "1", [["1"], ["1" if k % 3 else "2"], ["1" if k % 3 else "2"]]) for k in range(8)
    ]
    after = [
        debate(f"q{k}", "1", [["1"], ["1" if k != 4 else "2"], ["1" if k != 4 else "2"]]) for k in range(1, 9)
    ]
    a, b = write_run(tmp_path / "before", before), write_run(tmp_path / "after", after)
    page = report(tmp_path, a, b)
    assert open_page(browser, page) == []
    # q0 (only in A) is unmatched; q3, q6 went wrong -> right; q4 right -> wrong
    ids = shown_ids(browser, "#cmp-list")
    assert ids[:3] == ["q3", "q4", "q6"] and sorted(ids[3:]) == ["q1", "q2", "q5", "q7"]
    summary = browser.find_element("id", "cmp-summary").text
    assert "7 questions in both sets" in summary and "2 improved" in summary and "1 regressed" in summary
    assert "only in A: 1, only in B: 1" in summary
    click(browser, "cmp-changed-only")
    assert shown_ids(browser, "#cmp-list") == ["q3", "q4", "q6"]
    item = open_debate(browser, "q4", "#cmp-list")
    from selenium.webdriver.common.by import By

    grids = item.find_elements(By.CSS_SELECTOR, "table.grid")
    assert len(grids) == 2
    assert [c.text for c in grids[1].find_elements(By.CSS_SELECTOR, "td.cell")] == ["1", "2", "2"]


@pytest.mark.slow
def test_attack_run_marks_compromised_agents(browser, attack_run, tmp_path):
    page = report(tmp_path, attack_run)
    assert open_page(browser, page) == []
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    overview = browser.find_element(By.ID, "overview").text
    assert "attack evaluation" in overview and "m1-agents-2" in overview
    sets = [o.text for o in Select(browser.find_element(By.ID, "set")).options]
    assert [s.split(" (")[0] for s in sets] == ["natural", "m1-agents-2"]
    Select(browser.find_element(By.ID, "set")).select_by_index(1)
    qid = shown_ids(browser)[0]
    item = open_debate(browser, qid)
    marked = item.find_elements(By.CSS_SELECTOR, "table.grid th.compromised")
    assert [m.text.split("\n")[0].split("compromised")[0].strip() for m in marked] == ["agent 2"]
    record = next(
        r for r in iter_records(attack_run / "m1-agents-2" / "trajectories.jsonl") if r["question_id"] == qid
    )
    assert [[c for (i, t), (c, _) in sorted(grid_cells(item).items()) if i == a] for a in range(3)] == [
        [str(x) for x in row] for row in record["answers"]
    ]


@pytest.mark.slow
def test_training_run_folder_shows_curves_and_calibration(browser, tmp_path):
    """A training-run folder from udpo's own writers (Tracker, calibrate, write_json)."""
    from udpo.env.jsonl import write_json
    from udpo.env.summary import summarize
    from udpo.rewards import calibrate
    from udpo.training.tracking import Tracker

    run = tmp_path / "train"
    run.mkdir()
    tracker = Tracker(run, SimpleNamespace(is_main_process=True), [], "t", {})
    warmup = [d.answers for d in KNOWN] * 2
    calibration = calibrate(warmup, ["4", "10", "3"] * 2)
    write_json(run / "calibration.json", calibration.to_dict())
    write_json(run / "config.json", {"task": "synthetic", "n_agents": 2, "rounds": 2, "max_iterations": 3})
    for it in range(4):
        if it in (0, 3):
            folder = write_run(run / "eval" / f"iter_{it:06d}", KNOWN[: 2 + it // 3])
            write_json(
                folder / "summary.json",
                summarize([Trajectory.from_dict(r) for r in iter_records(folder / "trajectories.jsonl")]),
            )
            tracker.log(
                {**json.loads((folder / "summary.json").read_text()), "seconds": 1.0}, it, kind="eval"
            )
        if it:
            tracker.log(
                {
                    "reward": {"r_intra": 0.1 * it, "r_inter": 0.2, "r_sys": 0.3, "r_task": 0.5, "mean": 0.4},
                    "agent_0": {"kl": 0.01 * it, "clip_frac": 0.0},
                    "agent_1": {"kl": 0.02 * it, "clip_frac": 0.1},
                    "update": {"kl": 0.015 * it, "clip_frac": 0.05, "loss": float("nan")},
                },
                it,
            )
    page = report(tmp_path, run)
    assert open_page(browser, page) == []
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    titles = [t.text for t in browser.find_elements(By.CSS_SELECTOR, "svg.plot .plot-title")]
    assert {"Held-out accuracy", "Reward terms", "KL to the reference", "Clip fraction"} <= set(titles)
    calib = browser.find_element(By.CSS_SELECTOR, ".calibration").text
    assert "alpha" in calib and "agent 1" in calib
    assert Select(browser.find_element(By.ID, "set")).first_selected_option.text.startswith(
        "eval/iter_000003"
    )
    assert [
        Select(browser.find_element(By.ID, s)).first_selected_option.text.split(" (")[0]
        for s in ("cmp-a", "cmp-b")
    ] == ["eval/iter_000000", "eval/iter_000003"]


@pytest.mark.slow
def test_ten_thousand_debates_open_in_under_three_seconds(browser, big_run, tmp_path):
    start = time.perf_counter()
    page = report(tmp_path, big_run)
    written = time.perf_counter() - start
    assert open_page(browser, page) == []
    ready = browser.execute_script("return window.__udpoReady") / 1000
    loaded = (
        browser.execute_script("return performance.getEntriesByType('navigation')[0].loadEventEnd") / 1000
    )
    size = page.stat().st_size / 2**20
    print(
        f"10,000 debates: page {size:.1f} MiB written in {written:.1f} s; in the browser the first page of "
        f"debates was ready after {ready:.2f} s, the load event ended after {loaded:.2f} s"
    )
    assert max(ready, loaded) < LOAD_LIMIT_S
    assert browser.find_element("id", "count").text.startswith("10000 of 10000 debates · showing 1–50")
    assert len(shown_ids(browser)) == 50
    click(browser, "next")
    assert shown_ids(browser)[0] == "big-50"


@pytest.mark.slow
def test_real_debate_report_shows_the_recorded_answers(browser, real_debate, tmp_path):
    page = report(tmp_path, real_debate)
    assert open_page(browser, page) == []
    records = list(iter_records(real_debate / "trajectories.jsonl"))
    assert shown_ids(browser) == [r["question_id"] for r in records]
    for r in records:
        item = open_debate(browser, r["question_id"])
        cells = grid_cells(item)
        want = {
            (i, t): "None" if a is None else str(a)
            for i, row in enumerate(r["answers"])
            for t, a in enumerate(row)
        }
        assert {k: v[0] for k, v in cells.items()} == want
    assert any(a is not None for r in records for row in r["answers"] for a in row)  # answers to show
    summary = json.loads((real_debate / "summary.json").read_text())
    stats = load_run(real_debate).sets[0].stats
    for key in ("accuracy", "u_intra", "u_inter", "u_sys", "unparsed_rate"):
        assert stats[key] == pytest.approx(summary[key])


@pytest.mark.slow
def test_real_training_run_and_its_evaluations(browser, real_training, tmp_path):
    page = report(tmp_path, real_training)
    assert open_page(browser, page) == []
    from selenium.webdriver.common.by import By

    titles = {t.text for t in browser.find_elements(By.CSS_SELECTOR, "svg.plot .plot-title")}
    assert {"Held-out accuracy", "Reward terms", "KL to the reference", "Clip fraction"} <= titles
    assert "coefficients" in browser.find_element(By.CSS_SELECTOR, ".calibration").text
    evals = sorted(p.name for p in (real_training / "eval").glob("iter_*"))
    run = load_run(real_training)
    assert [s.name for s in run.sets][: len(evals)] == [f"eval/{e}" for e in evals]
    # one evaluation against the last: the side-by-side view of the same questions
    page = report(
        tmp_path, real_training / "eval" / evals[0], real_training / "eval" / evals[-1], name="ab.html"
    )
    assert open_page(browser, page) == []
    assert "questions in both sets" in browser.find_element("id", "cmp-summary").text


def test_collection_folder_indexes_its_runs(known_run, attack_run, tmp_path):
    root = tmp_path / "compare"
    shutil.copytree(known_run, root / "standard_mad")
    shutil.copytree(attack_run, root / "attacked")
    (root / "unfinished").mkdir()
    (root / "unfinished" / "trajectories.jsonl").write_text("")
    # a training run two levels down, as `udpo compare` writes <method>/seed_<s>/: evaluations only
    trained = root / "udpo" / "seed_0"
    write_run(trained / "eval" / "iter_000000", KNOWN)
    with TrajectoryWriter(trained / "trajectories" / "train.jsonl") as w:
        w.write(KNOWN)
    (trained / "metrics.jsonl").write_text(
        json.dumps({"iteration": 0, "kind": "eval", "accuracy": 0.5}) + "\n"
    )
    (root / "diagnosis").mkdir()
    (root / "diagnosis" / "summary.json").write_text("{}")
    run = load_run(root)
    assert run.kind == "collection"
    assert [c.label for c in run.children] == ["attacked", "standard_mad", "udpo/seed_0"]
    assert [s.name for s in run.sets] == [
        "attacked/natural",
        "attacked/m1-agents-2",
        "standard_mad",
        "udpo/seed_0/eval/iter_000000",
    ]
    assert [s.name for s in load_run(trained).sets] == ["eval/iter_000000", "trajectories/train"]
    html = report(tmp_path, root).read_text(encoding="utf-8")
    assert 'href="#run-standard_mad"' in html and 'id="run-standard_mad"' in html
    assert "skipped" in html and "unfinished" in html


@pytest.fixture
def no_figures(monkeypatch):
    """The diagnosis that compare writes beside its tables, without its PNG figures (matplotlib's drawing is
    most of a compare folder's cost; no page shows them)."""
    from udpo.analysis import diagnose_plots

    monkeypatch.setattr(diagnose_plots, "write_plots", lambda out, runs, summary: [])


def compare_folder(root: Path, done: bool = True) -> tuple[Path, dict | None]:
    """A ``udpo compare`` folder of finished runs (test_compare's), standard_mad, udpo and mappo on seed 0;
    with ``done``, its tables written by compare itself, else mappo still running."""
    from test_compare import finished_run

    from udpo.study.plan import CompareConfig
    from udpo.study.runner import DONE, write_results

    config = CompareConfig(
        "unused.yaml", ["standard_mad", "udpo", "mappo"], [0], str(root), bootstrap_resamples=200
    )
    start = [True, False, False, False]
    finished_run(config.run_dir("udpo", 0), "udpo", start, [True, True, True, False])
    finished_run(config.run_dir("mappo", 0), "mappo", start, [True, False, True, False])
    if not done:
        (config.run_dir("mappo", 0) / DONE).unlink()
        return root, None
    return root, write_results(config)


def table_cells(results: dict) -> dict[str, list[str]]:
    """method -> the cells the report's compare table shows, formatted as compare's table.md."""

    def cell(e: dict, key: str = "", sign: str = "") -> str:
        k = f"{key}_" if key else ""
        return f"{e[key or 'mean']:{sign}.3f} [{e[k + 'low']:{sign}.3f}, {e[k + 'high']:{sign}.3f}]"

    return {
        m: [
            *(
                cell(e[k])
                for k in (
                    "accuracy",
                    "u_intra",
                    "u_inter",
                    "u_sys",
                    "wrong_majority",
                    "wrong_unanimous",
                    "unparsed_rate",
                )
            ),
            "–"
            if m == "standard_mad"
            else f"{e['accuracy']['change']:+.3f} (intervals: seed table)"
            if e["accuracy"]["seed_change"]
            else cell(e["accuracy"], "change", "+"),
            str(e["n_questions"]),
        ]
        for m, e in results["methods"].items()
    }


def test_compare_folder_shows_its_table_or_which_runs_are_done(tmp_path, no_figures):
    root, _ = compare_folder(tmp_path / "running", done=False)
    html = report(tmp_path, root, name="running.html").read_text(encoding="utf-8")
    assert (
        "No results.json yet" in html and "1 of 2 runs done (udpo/seed_0); not done yet: mappo/seed_0" in html
    )
    root, results = compare_folder(tmp_path / "finished")
    assert json.loads((root / "results.json").read_text()) == results
    html = report(tmp_path, root).read_text(encoding="utf-8")
    assert "No results.json yet" not in html and '<table class="stats compare">' in html
    assert html.index("stats compare") < html.index('class="index"')  # the table comes first
    for method, cells in table_cells(results).items():
        assert f"<tr><td>{method}</td>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>" in html
    assert "0.750 [" in html and "+0.500 (intervals: seed table)" in html  # udpo: 3 of 4 right, 1 of 4 before
    # one seed: the seed analysis has no t-interval
    assert "<tr><td>udpo</td><td>accuracy</td><td>+0.500</td><td>[–, –]</td><td>[+" in html


def test_compare_folder_of_seeds_sharing_problems_shows_the_seed_analysis(tmp_path, no_figures):
    from test_compare import finished_run, write_compare

    from udpo.study import CompareConfig, run_compare

    config = CompareConfig.load(
        write_compare(tmp_path, methods=["standard_mad", "udpo"], seeds=[0, 1], bootstrap_resamples=200)
    )
    finished_run(config.run_dir("udpo", 0), "udpo", [True, False, False, False], [True, True, True, False])
    finished_run(config.run_dir("udpo", 1), "udpo", [False, False, False, False], [True, False, False, False])
    c = run_compare(config, train=lambda tc: None, progress=False)["methods"]["udpo"]["accuracy"][
        "seed_change"
    ]
    html = report(tmp_path, tmp_path / "out").read_text(encoding="utf-8")
    row = (
        f"<tr><td>udpo</td><td>accuracy</td><td>+0.375</td><td>[{c['t_low']:+.3f}, {c['t_high']:+.3f}]</td>"
        f"<td>[{c['boot_low']:+.3f}, {c['boot_high']:+.3f}]</td><td>+0.500, +0.250</td></tr>"
    )
    assert row in html and "<td>standard_mad</td><td>accuracy" not in html
    assert html.index("stats compare") < html.index("stats seed-change") < html.index('class="index"')
    # a hand-edited results.json: missing and non-numeric values become dashes, text is escaped
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    results["methods"]["<b>x</b>"] = {"accuracy": {"seed_change": {"delta": "1", "per_seed": [None, 0.5]}}}
    (tmp_path / "out" / "results.json").write_text(json.dumps(results))
    html = report(tmp_path, tmp_path / "out", name="edited.html").read_text(encoding="utf-8")
    assert (
        "<tr><td>&lt;b&gt;x&lt;/b&gt;</td><td>accuracy</td><td>–</td><td>[–, –]</td><td>[–, –]</td><td>–, +0.500</td></tr>"
        in html
    )


@pytest.mark.slow
def test_compare_table_in_the_browser(browser, tmp_path, no_figures):
    root, results = compare_folder(tmp_path / "compare")
    page = report(tmp_path, root)
    assert open_page(browser, page) == []
    from selenium.webdriver.common.by import By

    table = browser.find_element(By.CSS_SELECTOR, "#overview table.compare")
    head = [th.text for th in table.find_elements(By.CSS_SELECTOR, "thead th")]
    assert head[:5] == ["method", "accuracy", "U_intra", "U_inter", "U_sys"]
    rows = {
        r.find_element(By.TAG_NAME, "td").text: [c.text for c in r.find_elements(By.TAG_NAME, "td")[1:]]
        for r in table.find_elements(By.CSS_SELECTOR, "tbody tr")
    }
    assert rows == table_cells(results)
    assert list(rows) == ["standard_mad", "udpo", "mappo"]


@pytest.mark.slow
def test_errors_name_the_problem_and_nothing_heavy_is_imported(tmp_path, capsys):
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert "no run folder or trajectory file" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty"), "--out", str(tmp_path / "r.html")]) == 2
    assert "is not a run folder" in capsys.readouterr().err
    with pytest.raises(NotARunError, match="no debates"):
        (tmp_path / "blank").mkdir()
        (tmp_path / "blank" / "trajectories.jsonl").write_text("")
        load_run(tmp_path / "blank")
    with pytest.raises(ValueError, match="one run folder, or two"):
        write_report([], tmp_path / "r.html")
    code = (
        "import sys; from udpo.cli import main; rc = main(['report', sys.argv[1], '--out', sys.argv[2]]); "
        "heavy = [m for m in ('torch', 'transformers', 'vllm', 'matplotlib') if m in sys.modules]; "
        "print(heavy); sys.exit(rc or bool(heavy))"
    )
    run = write_run(tmp_path / "run", KNOWN)
    done = subprocess.run(
        [sys.executable, "-c", code, str(run), str(tmp_path / "r.html")], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "r.html").exists()


def test_json_blob_cannot_end_its_script_element_and_plots_skip_missing_values():
    blob = script_json({"t": "</script><!-- & -->", "x": float("nan")})
    assert "<" not in blob and ">" not in blob and "&" not in blob
    assert json.loads(blob) == {"t": "</script><!-- & -->", "x": None}
    assert nice_ticks(0.0, 1.0) == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert nice_ticks(2.0, 2.0)[0] < 2.0 < nice_ticks(2.0, 2.0)[-1]
    svg = line_plot({"a": [(0, 1.0), (1, None), (2, float("nan")), (3, 2.0)], "<b>": [(0, 0.5)]}, "t<i>")
    assert svg.count("<polyline") == 3 and "<b>" not in svg and "&lt;b&gt;" in svg and "t&lt;i&gt;" in svg
    assert line_plot({"a": [(0, None)]}, "empty") == ""
