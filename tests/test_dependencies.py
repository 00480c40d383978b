"""Every third-party module the package imports comes from a distribution pyproject.toml declares.

A module that arrives only as another package's dependency breaks when that package drops it.
"""

import ast
import re
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

import lightning_bandlimit

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

PACKAGE = Path(lightning_bandlimit.__file__).resolve().parent


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared() -> set[str]:
    project = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["project"]
    return {_normal(re.split(r"[\s<>=!~\[;]", spec, maxsplit=1)[0]) for spec in project["dependencies"]}


def _imported() -> dict[str, set[str]]:
    """Top-level third-party module -> the files importing it (any import, even inside a function)."""
    found: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in ("__future__", PACKAGE.name):
                    found.setdefault(top, set()).add(path.relative_to(PACKAGE.parent).as_posix())
    return found


def test_every_imported_third_party_module_is_declared() -> None:
    declared, providers = _declared(), packages_distributions()
    undeclared = {
        module: sorted(files)
        for module, files in _imported().items()
        if not any(_normal(dist) in declared for dist in providers.get(module, [module]))
    }
    assert not undeclared, f"imported but not declared in pyproject.toml's dependencies: {undeclared}"
