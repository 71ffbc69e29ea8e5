"""Who may import whom (docs/architecture.md, "Who may import whom"): every import of every module under
udpo/ (env/ and rewards/ through its links udpo/env and udpo/rewards) is read with ``ast``, at any
nesting level (inside functions and ``if TYPE_CHECKING:`` blocks too), relative imports resolved to their
absolute names, and checked against :data:`RULES`.

:data:`RULES` is the single source of the boundaries: docs/architecture.md mirrors it row for row (a test
below checks that). Rules are prefix-based, so moving modules means editing a prefix here; a prefix that
no longer names a module fails :func:`test_every_rule_prefix_names_a_real_module` instead of silently
emptying its rule.

Dynamic imports are seen only where a dotted module name is written out as a string (the task and backend
registries, ``udpo.__init__``'s lazy exports); an f-string (the CLI's command table) is not, nor a bare
top-level name (``"udpo"`` is also a cache folder's name).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

import pytest
from package_tree import ROOT, python_files

#: model and training frameworks
FRAMEWORKS = ("torch", "transformers", "peft", "accelerate", "deepspeed", "vllm")


@dataclass(frozen=True)
class Rule:
    """Modules under ``modules`` (but not under ``exempt``) import nothing under ``forbidden`` unless it is
    also under ``allowed``. Prefixes match whole dotted components: ``udpo.env`` covers ``udpo.env`` and
    ``udpo.env.debate``, not ``udpo.envelope``. ``runtime_only``: imports under ``if TYPE_CHECKING:``
    (annotations) are not counted."""

    modules: tuple[str, ...]
    forbidden: tuple[str, ...]
    why: str
    allowed: tuple[str, ...] = ()
    exempt: tuple[str, ...] = ()
    runtime_only: bool = False


#: the boundaries of docs/architecture.md, "Who may import whom" (that table mirrors this one)
RULES: dict[str, Rule] = {
    "rewards-pure": Rule(
        modules=("udpo.rewards",),
        forbidden=("udpo", *FRAMEWORKS, "matplotlib"),
        allowed=("udpo.rewards",),
        why="udpo.rewards is NumPy (and SciPy) in, numbers out: nothing else of the project, no framework",
    ),
    "env-no-training": Rule(
        modules=("udpo.env",),
        forbidden=("udpo", "accelerate", "deepspeed"),
        allowed=("udpo.env", "udpo.rewards"),
        why="udpo.env (tasks, prompts, backends, protocols, attacks) uses only udpo.rewards of the rest of "
        "the project: never the trainer, algorithms, policy, config or CLI",
    ),
    "run-folder-plain": Rule(
        modules=("udpo.env.run_folder",),
        forbidden=("udpo", *FRAMEWORKS, "numpy"),
        why="every tool names a run folder's files through udpo.env.run_folder: path arithmetic on the "
        "standard library alone, so nothing that reads a run folder pays for more",
    ),
    "engines-in-backends": Rule(
        modules=("udpo",),
        exempt=("udpo.env.backends",),
        forbidden=("vllm", "httpx"),
        why="a backend is the only place that talks to an inference engine (vLLM in process, or a server)",
    ),
    "algorithms-no-loop": Rule(
        modules=("udpo.algorithms",),
        forbidden=("udpo.training", "udpo.analysis", "udpo.api"),
        why="an algorithm is advantages from a batch and one agent's loss from its log-probs; the loop, the "
        "policy and checkpoints call it, not the other way",
    ),
    "parts-no-loop": Rule(
        modules=("udpo.training",),
        forbidden=("udpo.training.trainer",),
        runtime_only=True,
        why="the training loop calls its parts (data, rollouts, calibration, update, checkpointing, "
        "callbacks); a part may name the Trainer type in annotations only",
    ),
    "training-no-analysis": Rule(
        modules=("udpo.training", "udpo.algorithms", "udpo.config"),
        forbidden=("udpo.analysis", "udpo.api"),
        why="the analysis tools (diagnose, attack evaluation, report) read training's runs; training does "
        "not depend on them",
    ),
    "training-no-study": Rule(
        modules=("udpo",),
        exempt=("udpo.study", "udpo.cli"),
        forbidden=("udpo.study",),
        why="the study layer (udpo.study: plans, runner, records, tables, sample size) runs training and "
        "reads it with the analysis tools; training, the algorithms, the config, the environment, the "
        "rewards and the analysis tools never import it, only the CLI does",
    ),
    "library-no-cli": Rule(
        modules=("udpo",),
        exempt=("udpo.cli",),
        forbidden=("udpo.cli", "train_udpo"),
        why="the CLI and train_udpo.py parse arguments and call the library; the library never calls them",
    ),
}

#: existing imports that break a rule the architecture intends, tolerated until the code changes:
#: (rule, importing module, imported prefix) -> why. Each entry must still match an import (a test checks).
EXCEPTIONS: dict[tuple[str, str, str], str] = {
    ("training-no-analysis", "udpo.training.callbacks", "udpo.analysis"): "the attack evaluation a "
    "config's attack_eval asks for is one of the run's eval callbacks (udpo.analysis.attack_eval, imported "
    "when asked)",
}


def under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


FILES = python_files()
MODULES = frozenset(FILES)


@dataclass(frozen=True)
class Import:
    line: int
    name: str  # absolute dotted name of what is imported
    type_checking: bool = False  # inside ``if TYPE_CHECKING:``
    by_name: bool = False  # a string naming a module (importlib)

    def describe(self) -> str:
        how = " (by name)" if self.by_name else " (under TYPE_CHECKING)" if self.type_checking else ""
        return f"{self.name}{how}"


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _names_a_module(value: object, known: frozenset[str]) -> bool:
    """A string holding a dotted module name (as importlib is given one)."""
    return isinstance(value, str) and "." in value and value in known


def imports_of(source: str, module: str, is_package: bool, known: frozenset[str] = MODULES) -> list[Import]:
    """Every import in ``source`` (the text of ``module``), at any depth, with absolute names. ``from X
    import n`` gives ``X.n`` when that is a module in ``known``, else ``X``; relative imports count from
    the module's package (``module`` itself for an ``__init__``)."""
    package = module if is_package else module.rpartition(".")[0]
    found: list[Import] = []

    def resolve(node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        parts = package.split(".")
        if node.level - 1 >= len(parts):
            raise ValueError(f"{module}:{node.lineno}: relative import beyond the top-level package")
        base = ".".join(parts[: len(parts) - (node.level - 1)])
        return f"{base}.{node.module}" if node.module else base

    def visit(node: ast.AST, type_checking: bool) -> None:
        if isinstance(node, ast.Import):
            found.extend(Import(node.lineno, alias.name, type_checking) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = resolve(node)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.append(Import(node.lineno, full if full in known else base, type_checking))
        elif isinstance(node, ast.Constant) and _names_a_module(node.value, known):
            found.append(Import(node.lineno, node.value, type_checking, by_name=True))
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, True)
            for child in node.orelse:
                visit(child, type_checking)
            return
        for child in ast.iter_child_nodes(node):
            visit(child, type_checking)

    visit(ast.parse(source), False)
    return found


IMPORTS: dict[str, list[Import]] = {
    module: imports_of(path.read_text(encoding="utf-8"), module, path.name == "__init__.py")
    for module, path in FILES.items()
}


def applies(rule: Rule, module: str) -> bool:
    return any(under(module, p) for p in rule.modules) and not any(under(module, p) for p in rule.exempt)


def breaks(rule: Rule, imp: Import) -> str | None:
    """The forbidden prefix ``imp`` falls under, or None."""
    if rule.runtime_only and imp.type_checking:
        return None
    if any(under(imp.name, p) for p in rule.allowed):
        return None
    return next((p for p in rule.forbidden if under(imp.name, p)), None)


def violations(rule_id: str) -> list[tuple[str, Import, str]]:
    rule = RULES[rule_id]
    out = []
    for module, imports in IMPORTS.items():
        if applies(rule, module):
            out.extend((module, imp, p) for imp in imports if (p := breaks(rule, imp)) is not None)
    return out


# --- the rules ------------------------------------------------------------------------------------


@pytest.mark.parametrize("rule_id", sorted(RULES))
def test_import_boundaries(rule_id):
    rule = RULES[rule_id]
    offending = [
        f"  {FILES[module].relative_to(ROOT)}:{imp.line}: {module} imports {imp.describe()}"
        for module, imp, prefix in violations(rule_id)
        if (rule_id, module, prefix) not in EXCEPTIONS
    ]
    assert not offending, (
        f"rule {rule_id!r} ({', '.join(rule.modules)} must not import {', '.join(rule.forbidden)}"
        + (f" except {', '.join(rule.allowed)}" if rule.allowed else "")
        + f"): {rule.why}.\n"
        + "\n".join(offending)
        + "\nMove the code, or change the rule and docs/architecture.md together."
    )


def test_every_exception_is_still_needed():
    for (rule_id, module, prefix), why in EXCEPTIONS.items():
        assert rule_id in RULES, f"exception for unknown rule {rule_id!r} ({why})"
        hits = [(m, p) for m, _, p in violations(rule_id) if (m, p) == (module, prefix)]
        assert hits, f"exception ({rule_id}, {module}, {prefix}) matches no import any more: remove it"


#: pairs of modules that import each other, tolerated until the code changes -> why
MUTUAL_IMPORTS: dict[tuple[str, str], str] = {}


def mutual_imports() -> set[tuple[str, str]]:
    """Pairs of modules (neither the package of the other) that import each other at run time, at any
    depth: a function-level import hides such a cycle from the reader, not from the interpreter."""
    edges = {m: {i.name for i in imps if not i.type_checking} & MODULES for m, imps in IMPORTS.items()}
    return {
        (a, b)
        for a in edges
        for b in edges[a]
        if a < b and a in edges[b] and not (under(a, b) or under(b, a))
    }


def test_no_two_modules_import_each_other():
    found = mutual_imports()
    assert found <= set(MUTUAL_IMPORTS), (
        f"these modules import each other: {sorted(found - set(MUTUAL_IMPORTS))}; move what both need into "
        f"the module it belongs to"
    )
    assert set(MUTUAL_IMPORTS) <= found, f"no longer mutual, remove: {sorted(set(MUTUAL_IMPORTS) - found)}"


def test_every_rule_prefix_names_a_real_module():
    """A renamed or moved package must not leave a rule that checks nothing."""

    def project(prefix: str) -> bool:
        return under(prefix, "udpo") or prefix == "train_udpo"

    for rule_id, rule in RULES.items():
        prefixes = [*rule.modules, *rule.exempt, *rule.allowed, *(p for p in rule.forbidden if project(p))]
        for prefix in prefixes:
            if prefix == "train_udpo":
                assert (ROOT / "train_udpo.py").is_file(), f"rule {rule_id!r}: train_udpo.py is gone"
                continue
            assert any(under(m, prefix) for m in MODULES), (
                f"rule {rule_id!r} names {prefix!r}, which matches no module under udpo/"
            )
    for rule_id, module, prefix in EXCEPTIONS:
        assert module in MODULES, f"exception ({rule_id}, {module}, {prefix}): no module {module!r}"


def test_the_architecture_page_mirrors_the_rules():
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"^\| `([a-z-]+)` \|", text, flags=re.MULTILINE))
    assert listed == set(RULES), (
        f"docs/architecture.md lists rules {sorted(listed)}, the test has {sorted(RULES)}: keep them equal"
    )


# --- the reader itself ------------------------------------------------------------------------------


def test_imports_are_found_at_any_depth_and_resolved():
    known = frozenset(
        {"udpo", "udpo.env", "udpo.env.tasks", "udpo.env.tasks.base", "udpo.env.backends", "udpo.trainer"}
    )
    source = """
import numpy as np
from . import base
from .base import Task
from ..backends import make_backend
from .. import backends
from ... import trainer
from typing import TYPE_CHECKING
if TYPE_CHECKING:
    from udpo.trainer import Trainer
else:
    import json
def f():
    class C:
        def g(self):
            import udpo.env.tasks.base as b
    return "udpo.trainer", "udpo.trainer is not a module name"
"""
    got = [
        (i.line, i.name, i.type_checking, i.by_name)
        for i in imports_of(source, "udpo.env.tasks.x", False, known)
    ]
    assert got == [
        (2, "numpy", False, False),
        (3, "udpo.env.tasks.base", False, False),  # a module of the package
        (4, "udpo.env.tasks.base", False, False),
        (5, "udpo.env.backends", False, False),  # make_backend is a name in the package, not a module
        (6, "udpo.env.backends", False, False),
        (7, "udpo.trainer", False, False),
        (8, "typing", False, False),
        (10, "udpo.trainer", True, False),
        (12, "json", False, False),
        (16, "udpo.env.tasks.base", False, False),
        (17, "udpo.trainer", False, True),
    ]
    # in a package's __init__ the package itself is the base of a relative import
    assert [i.name for i in imports_of("from .base import Task", "udpo.env.tasks", True, known)] == [
        "udpo.env.tasks.base"
    ]
    with pytest.raises(ValueError, match="beyond the top-level package"):
        imports_of("from .... import x", "udpo.env.tasks.x", False, known)


def test_the_rules_catch_what_they_should():
    fake = Import(1, "udpo.trainer")
    assert breaks(RULES["env-no-training"], fake) == "udpo"
    assert breaks(RULES["env-no-training"], Import(1, "udpo.rewards.vote")) is None
    assert breaks(RULES["rewards-pure"], Import(1, "torch.nn")) == "torch"
    assert breaks(RULES["rewards-pure"], Import(1, "udpo.env.trajectory")) == "udpo"
    loop = Import(1, "udpo.training.trainer")
    assert breaks(RULES["parts-no-loop"], Import(1, "udpo.training.trainer", type_checking=True)) is None
    assert breaks(RULES["parts-no-loop"], loop) == "udpo.training.trainer"
    assert breaks(RULES["algorithms-no-loop"], Import(1, "udpo.training.policy")) == "udpo.training"
    assert breaks(RULES["training-no-analysis"], Import(1, "udpo.analysis.diagnose")) == "udpo.analysis"
    assert breaks(RULES["training-no-study"], Import(1, "udpo.study.tables")) == "udpo.study"
    assert breaks(RULES["training-no-study"], Import(1, "udpo.studying")) is None
    assert applies(RULES["training-no-study"], "udpo.training.trainer")
    assert applies(RULES["training-no-study"], "udpo.rewards.statistics")
    assert applies(RULES["training-no-study"], "udpo.analysis.results")
    assert not applies(RULES["training-no-study"], "udpo.cli.study")
    assert ("udpo.analysis.results", "udpo.study.tables") not in mutual_imports()
    assert not applies(RULES["library-no-cli"], "udpo.cli.train")
    assert applies(RULES["library-no-cli"], "udpo.env.debate")
    assert not applies(RULES["engines-in-backends"], "udpo.env.backends.vllm")
    assert FILES["udpo.env.tasks"].resolve() == ROOT / "env" / "tasks" / "__init__.py"
    assert FILES["udpo.rewards.vote"].resolve() == ROOT / "rewards" / "vote.py"
