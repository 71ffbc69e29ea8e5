"""The one resolver of ``package.module:attr`` names: every task, reward function and eval callback that a
recipe, a command-line flag or the API names by import path is found here, and checked before anything
uses it.

Naming a module imports it, and importing runs its top level: that is the trust a recipe is given, as
with Hydra's ``_target_``. What a name can never do is have udpo call an arbitrary function: the object
found must be of the kind its field asks for (a Task subclass for ``task``, a function or a class whose
instances are called for ``reward_functions`` and ``eval_callbacks``), and nothing from the standard
library is taken. The standard library is refused twice: by the module named, before it is imported
(``os:system``, ``subprocess:call``, ``builtins:exec``; importing ``antigravity`` opens a browser), and
by the module the object was defined in (``os.system`` is ``posix.system``; ``mine:call`` may be
``subprocess.call`` imported into ``mine``). A refusal is one :class:`SpecError` line naming the field.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Callable
from typing import Any

#: the kind of object a field needs: None when ``found`` is one, else what it is instead
#: (a phrase that follows "is", e.g. "a int, not a function")
Check = Callable[[Any], str | None]


class SpecError(ValueError):
    """A ``module:attr`` name that is malformed, cannot be imported or names the wrong kind of object; the
    message starts with the field that holds it (``task: ...``, ``reward_functions: ...``)."""


def split_spec(field: str, spec: str) -> tuple[str, str]:
    """(module, attr) of ``spec``, or a SpecError when it is not ``package.module:attr``."""
    module, colon, attr = spec.partition(":") if isinstance(spec, str) else ("", "", "")
    if not colon or not module or not attr or ":" in attr:
        raise SpecError(f"{field}: entry {spec!r:.200} must look like 'package.module:name'")
    return module, attr


def in_stdlib(module: str | None) -> bool:
    """Whether ``module`` (a dotted name) is part of Python's standard library; None counts as such, since
    an object without a module cannot be shown to come from outside it."""
    return module is None or module.partition(".")[0] in sys.stdlib_module_names


def resolve(field: str, spec: str, check: Check) -> Any:
    """The object ``spec`` (``package.module:attr``) names, once ``check`` accepts it and it was defined
    outside the standard library. Imports the module; calls nothing it found. Raises SpecError."""
    module, attr = split_spec(field, spec)
    if in_stdlib(module):
        raise SpecError(
            f"{field}: {spec!r} names the standard library module {module!r}, which holds no task, reward "
            f"function or callback; refused without importing it"
        )
    try:
        found = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError, TypeError, ValueError) as e:
        raise SpecError(f"{field}: cannot import {spec!r}: {e}") from None
    problem = check(found)
    if problem is not None:
        raise SpecError(f"{field}: {spec!r} is {problem}; refused without calling it")
    defined_in = getattr(found, "__module__", None)
    if in_stdlib(defined_in):
        raise SpecError(
            f"{field}: {spec!r} is {describe(found)} defined in the standard library ({defined_in}), "
            f"where no task, reward function or callback lives; refused without calling it"
        )
    return found


def describe(found: Any) -> str:
    """``a builtin_function_or_method``, ``a class``, ``a int``: what was found, for error lines."""
    return "a class" if isinstance(found, type) else f"a {type(found).__name__}"


def _called_instances(cls: type) -> bool:
    """Whether instances of ``cls`` can be called (a class of its MRO defines ``__call__``)."""
    return any("__call__" in vars(k) for k in cls.__mro__)


def not_a_user_callable(found: Any) -> str | None:
    """The check of ``reward_functions`` and ``eval_callbacks``: a Python function, or a class whose
    instances are called (built without arguments by :func:`load_callable`)."""
    if inspect.isfunction(found):
        return None
    if isinstance(found, type):
        return (
            None if _called_instances(found) else "a class without __call__: its instances cannot be called"
        )
    return f"{describe(found)}, not a function or a class whose instances are called"


def load_callable(field: str, spec: str) -> Callable:
    """The callable ``spec`` names for ``field`` (a reward function or an eval callback): a function as
    it is; a class, once :func:`resolve` accepted it, built without arguments (its instance is called)."""
    found = resolve(field, spec, not_a_user_callable)
    return found() if isinstance(found, type) else found
