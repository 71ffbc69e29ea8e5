"""The pages cite files that exist (issue 40): every repository path in backticks, code blocks or a
Markdown link of README.md, docs/**/*.md (the lab, docs/lab/, included) and the recipes' comments names a
file or folder of this checkout, a link's #anchor names a heading of the page it points to, and no page
names an absolute path of one machine. The guides and the lab stay apart (issue 52): the pages at the top
of docs/ are the guides, which speak of the product and not of how it is developed; results, measurements,
plans, pre-registrations and logs live under docs/lab/, every page of which its index lists. Pure file
reads."""

from __future__ import annotations

import functools
import itertools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOP = ("udpo", "env", "tests", "scripts", "benchmarks", "recipes", "docs", "examples", "rewards")
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
RECIPES = sorted((ROOT / "recipes").rglob("*.yaml"))
#: where a study plan commits its records (its ``results_dir``): cited before the study has run
RESULTS_DIRS = sorted(
    {m for r in RECIPES for m in re.findall(r"^results_dir:\s*(\S+)", r.read_text(), flags=re.M)}
)

#: a repository-relative path: a known top-level folder, then path characters (braces for {a,b} lists)
PATH = re.compile(r"(?<![\w./~-])((?:" + "|".join(TOP) + r")/[\w.{},/<>*-]*)")
#: an absolute path inside one machine's checkout or home folder
MACHINE = re.compile(r"(?<![\w.~-])/(?:work|home|Users|root)/[\w.-]+")
LINK = re.compile(r"\]\(([^()\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")
#: placeholders and patterns: what a command writes or a reader fills in, not a file to find
PLACEHOLDER = re.compile(r"[<>*]|\.\.\.|YYYY|NNN")


def exists(path: str) -> bool:
    """``path`` is in the checkout, or inside a study's results folder (written when the study runs)."""
    path = path.rstrip("/")
    return (ROOT / path).exists() or any(path == d or path.startswith(d + "/") for d in RESULTS_DIRS)


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _code_text(text: str) -> list[str]:
    """Inline code spans and fenced blocks of a Markdown page (where a cited path is written)."""
    spans, block, inside = [], [], False
    for line in text.splitlines():
        if FENCE.match(line):
            if inside:
                spans.append("\n".join(block))
                block = []
            inside = not inside
            continue
        if inside:
            block.append(line)
        else:
            spans.extend(re.findall(r"`([^`]+)`", line))
    return spans


def _expand(path: str) -> list[str]:
    """``a/{x,y}_{1,2}.yaml`` as the four paths it lists (no braces: itself)."""
    parts = re.split(r"\{([^{}]*)\}", path)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(c) for c in itertools.product(*choices)]


def _clean(token: str) -> str:
    token = token.split("::")[0]  # a pytest node id: its file
    token = re.sub(r"(\.\w+):[\w.]+$", r"\1", token)  # file.py:function
    token = re.sub(r"#.*$", "", token)
    return token.rstrip(".,;:)'\"")


def cited_paths(text: str) -> set[str]:
    """Repository paths a page cites in code spans and blocks."""
    found = set()
    for span in _code_text(text):
        for match in PATH.finditer(span):
            token = _clean(match.group(1))
            if token and not PLACEHOLDER.search(token):
                found.update(_expand(token))
    return found


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@functools.cache
def anchors(page: Path) -> set[str]:
    found, inside = set(), False
    for line in page.read_text().splitlines():
        if FENCE.match(line):
            inside = not inside
        elif not inside and line.startswith("#"):
            found.add(slug(line.lstrip("#")))
    return found


def broken_links(page: Path) -> list[str]:
    """Markdown link targets of ``page`` (relative to it) that name no file, or no heading there."""
    broken, text = [], page.read_text()
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("mailto"):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists() or (anchor and dest.suffix == ".md" and anchor not in anchors(dest)):
            broken.append(target)
    return broken


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_cited_paths_exist(page):
    text = page.read_text()
    missing = sorted(p for p in cited_paths(text) if not exists(p))
    assert not missing, f"{_rel(page)} cites paths that do not exist: {missing}"
    assert not broken_links(page), f"{_rel(page)} links to nothing: {broken_links(page)}"


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_no_machine_paths(page):
    found = sorted(set(MACHINE.findall(page.read_text())))
    assert not found, f"{_rel(page)} names paths of one machine: {found} (cite paths in the repository)"


def test_recipe_comments_cite_existing_paths():
    missing = {}
    for recipe in RECIPES:
        comments = "\n".join(line.split("#", 1)[1] for line in recipe.read_text().splitlines() if "#" in line)
        for match in PATH.finditer(comments):
            token = _clean(match.group(1))
            if token and not PLACEHOLDER.search(token):
                gone = [p for p in _expand(token) if not exists(p)]
                if gone:
                    missing.setdefault(_rel(recipe), []).extend(gone)
        assert not MACHINE.search(comments), f"{_rel(recipe)} names a path of one machine"
    assert not missing, f"recipe comments cite paths that do not exist: {missing}"


LAB = ROOT / "docs" / "lab"
#: the guides: the pages a user follows, at the top of docs/ (results, measurements, plans and logs: docs/lab/)
GUIDES = {
    "README.md",
    "algorithms.md",
    "architecture.md",
    "attacks.md",
    "backends.md",
    "cli.md",
    "error_detection.md",
    "inputs.md",
    "library.md",
    "metrics.md",
    "protocols.md",
    "ray.md",
    "report.md",
    "spec.md",
    "study.md",
    "tasks.md",
    "testing.md",
    "training.md",
    "uncertainty.md",
    "waiting.md",
}
#: how a page speaks of the project's development instead of the product: issue bookkeeping, which
#: machine the developers were lent or had when, the session a figure was taken in
DEVELOPMENT = re.compile(
    r"\bissues? \d+|\blent\b|\bthis session\b|\bdevelopment machine\b|\bon this machine\b|"
    r"\bthe project's (?:\d-core|CPU|GPU|machine|session)|\bat hand when\b",
    flags=re.IGNORECASE,
)


def test_the_guides_are_the_pages_at_the_top_of_docs():
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert pages == GUIDES, (
        f"docs/ holds {sorted(pages - GUIDES)} beyond the guides and lacks {sorted(GUIDES - pages)}: a "
        "result, measurement, plan or log goes under docs/lab/; a new guide goes into GUIDES"
    )


@pytest.mark.parametrize("page", [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))], ids=_rel)
def test_the_guides_speak_of_the_product_not_its_development(page):
    found = sorted({m.group(0) for m in DEVELOPMENT.finditer(page.read_text())})
    assert not found, (
        f"{_rel(page)} speaks of how the project is developed ({found}): say how things work, and cite "
        "docs/lab/ for what was measured, where and when"
    )


def test_every_guide_is_listed_in_the_docs_index():
    index = ROOT / "docs" / "README.md"
    linked = {
        (index.parent / target.partition("#")[0]).resolve() for target in LINK.findall(index.read_text())
    }
    unlisted = sorted(
        name for name in GUIDES - {"README.md"} if (index.parent / name).resolve() not in linked
    )
    assert not unlisted, f"docs/README.md does not list {unlisted}: add each to its group"


def test_every_lab_page_is_listed_in_the_lab_index():
    index = LAB / "README.md"
    linked = {(LAB / target.partition("#")[0]).resolve() for target in LINK.findall(index.read_text())}
    unlisted = sorted(_rel(p) for p in LAB.rglob("*.md") if p != index and p.resolve() not in linked)
    unlisted = [p for p in unlisted if not p.startswith("docs/lab/results/")]  # a study's own tables
    assert not unlisted, f"{_rel(index)} does not list {unlisted}: add each to its table"


def test_the_checker_sees_what_it_should():
    text = "run `python benchmarks/x.py --out runs/y`, see `udpo/env/debate.py` and `tests/t.py::test_a`\n"
    text += "```bash\nbash scripts/{a,b}.sh\n```\nand `docs/<name>.md`, `tests/test_*.py`\n"
    assert cited_paths(text) == {
        "benchmarks/x.py",
        "udpo/env/debate.py",
        "tests/t.py",
        "scripts/a.sh",
        "scripts/b.sh",
    }
    assert MACHINE.findall("in /work/main/udpo and ~/x and /tmp/y and /home/me") == ["/work/main", "/home/me"]
    assert "docs/lab/results/proof" in RESULTS_DIRS and exists("docs/lab/results/proof/runs/")
    assert all(RESULTS_DIRS) and all(
        d.startswith("docs/lab/results/") for d in RESULTS_DIRS if d.startswith("docs/")
    )
    said = "run on the machine lent in issue 42, on this machine, during this session, on the development machine"
    assert len(DEVELOPMENT.findall(said)) == 5
    assert not DEVELOPMENT.findall("a session of pytest; the project's own format; see issue-24's anchor")
    assert slug("Checkpoints and resuming") == "checkpoints-and-resuming"
    assert slug("CPU throughput: bf16 and the sampling loop") == "cpu-throughput-bf16-and-the-sampling-loop"
    assert slug("Optimizer defaults (appendix A.1)") == "optimizer-defaults-appendix-a1"
