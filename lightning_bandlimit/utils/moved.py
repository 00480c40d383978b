"""Import paths of earlier releases for modules that moved: ``import old.path`` gives the module
at its new path (the same module object), with a :class:`DeprecationWarning` naming it."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from collections.abc import Mapping, Sequence
from types import ModuleType

__all__ = ["MovedModules", "install_moved_modules"]


class MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """A finder that resolves each old dotted name of ``moves`` to its new module.

    Args:
        moves: old module name -> new module name (both absolute).

    Example:
        >>> import sys
        >>> finder = MovedModules({"json_old_name_for_a_doctest": "json"})
        >>> sys.meta_path.append(finder)
        >>> import warnings
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore")
        ...     import json_old_name_for_a_doctest
        >>> import json; json_old_name_for_a_doctest is json
        True
        >>> sys.meta_path.remove(finder); del sys.modules["json_old_name_for_a_doctest"]
    """

    def __init__(self, moves: Mapping[str, str]) -> None:
        self.moves = dict(moves)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.moves:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = self.moves[spec.name]
        warnings.warn(
            f"{spec.name} moved to {new}; import it from there (the old path will go in a later release)",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the module was imported at its new path."""


def install_moved_modules(moves: Mapping[str, str]) -> MovedModules:
    """Add a :class:`MovedModules` for ``moves`` to ``sys.meta_path`` (once per set of moves)."""
    for finder in sys.meta_path:
        if isinstance(finder, MovedModules) and finder.moves == dict(moves):
            return finder
    finder = MovedModules(moves)
    sys.meta_path.append(finder)
    return finder
