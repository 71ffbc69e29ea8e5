"""What a hostile recipe names beside the standard library itself (tests/test_recipe_imports.py). Nothing
here is a task, a reward function or a callback, and whatever would run leaves ``MARKER`` in the working
directory. Importing the module runs nothing."""

from __future__ import annotations

from os import system  # defined in posix: a name that reaches the standard library through this module
from pathlib import Path
from subprocess import call  # a Python function of the standard library, reached the same way

__all__ = ["WritesMarker", "call", "system"]


class WritesMarker:
    """Not a Task, and its instances cannot be called: building one writes ``MARKER``."""

    def __init__(self, *args, **kwargs) -> None:
        Path("MARKER").write_text("recipe-code-ran")
