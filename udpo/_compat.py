"""Modules that moved when udpo/ became packages (issue 25): the old names still import, with a
FutureWarning, so scripts and recipes that name them (``reward_functions: [udpo.reward_functions:concise]``)
keep working. Each old name resolves to the very module object of its new home. The warning is a
FutureWarning: Python shows those to end users by default (a DeprecationWarning only in __main__)."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings

#: old module name -> new module name
MOVED = {
    "udpo.trainer": "udpo.training.trainer",
    "udpo.checkpoint": "udpo.training.checkpoint_store",
    "udpo.policy": "udpo.training.policy",
    "udpo.replay": "udpo.training.replay",
    "udpo.reward_functions": "udpo.algorithms.reward_functions",
    "udpo.run_lock": "udpo.training.run_lock",
    "udpo.tracking": "udpo.training.tracking",
    "udpo.team": "udpo.training.team",
    "udpo.export": "udpo.training.export",
    "udpo.distributed": "udpo.training.distributed",
    "udpo.evaluate": "udpo.env.summary",
    "udpo.runs": "udpo.env.runs",
    "udpo.compare": "udpo.analysis.compare",
    "udpo.diagnose": "udpo.analysis.diagnose",
    "udpo.diagnose_plots": "udpo.analysis.diagnose_plots",
    "udpo.attack_eval": "udpo.analysis.attack_eval",
    "udpo.detection": "udpo.analysis.detection",
    "udpo.uncertainty_eval": "udpo.analysis.uncertainty_eval",
    "udpo.results": "udpo.analysis.results",
    "udpo.report": "udpo.analysis.report",
    "udpo.commands": "udpo.cli",
}


def new_name(name: str) -> str | None:
    """The current name of a module that moved (``udpo.report.load`` -> ``udpo.analysis.report.load``)."""
    for old, new in MOVED.items():
        if name == old or name.startswith(old + "."):
            return new + name[len(old) :]
    return None


class MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old module name and hands back the moved module itself (not a copy)."""

    def __init__(self) -> None:
        self._own_specs: dict[str, importlib.machinery.ModuleSpec] = {}  # old name -> the module's own spec

    def find_spec(self, fullname, path=None, target=None):
        if new_name(fullname) is None:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        new = new_name(spec.name)
        warnings.warn(f"{spec.name} moved to {new}; import it from there", FutureWarning, stacklevel=3)
        module = importlib.import_module(new)
        self._own_specs[spec.name] = module.__spec__  # importlib now sets the old name's: restored below
        return module

    def exec_module(self, module) -> None:
        module.__spec__ = self._own_specs.pop(
            module.__spec__.name
        )  # keyed by the old name, so nesting is safe


def install() -> None:
    """Put the finder first on ``sys.meta_path``, once."""
    if not any(isinstance(f, MovedModules) for f in sys.meta_path):
        sys.meta_path.insert(0, MovedModules())  # before the path finders: a moved package's submodules too
