"""The recipes shipped in the package (``lightning_bandlimit/configs/*.yaml``) and ``--config``.

``--config`` takes a file or the name of a packaged recipe everywhere the package parses a
command line (``lightning-bandlimit fit|validate|test``, ``lightning-bandlimit robustness``):
a jsonargparse parser resolves it through :class:`RecipeConfigFile`, a plain argument list
through :func:`resolve_config_args`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jsonargparse import ActionConfigFile

__all__ = ["RECIPES_DIR", "RecipeConfigFile", "recipe_path", "recipes", "resolve_config_args"]

RECIPES_DIR = Path(__file__).resolve().parent.parent / "configs"


def recipes() -> dict[str, str]:
    """Packaged recipes: name -> one-line description (the file's first comment line).

    Example:
        >>> sorted(recipes())
        ['cifar10-resnet18', 'elastic', 'elastic_exact', 'quickstart', 'robustness', 'robustness_study']
    """
    found = {}
    for path in sorted(RECIPES_DIR.glob("*.yaml")):
        first = path.read_text().splitlines()[0] if path.stat().st_size else ""
        found[path.stem] = first.lstrip("# ").strip()
    return found


def recipe_path(name_or_path: str, option: str = "--config") -> Path:
    """The config file for a recipe name, or the given path if it is an existing file.

    Args:
        name_or_path: a packaged recipe's name (``"quickstart"``) or a path to a YAML file.
        option: the command-line option that gave it, for the message.

    Raises:
        FileNotFoundError: if it is neither an existing file nor a recipe name (the message
            lists the recipes).

    Example:
        >>> recipe_path("quickstart").name
        'quickstart.yaml'
    """
    path = Path(name_or_path)
    if path.is_file():
        return path
    packaged = RECIPES_DIR / f"{name_or_path}.yaml"
    if packaged.is_file():
        return packaged
    raise FileNotFoundError(
        f"{option} {name_or_path!r} is neither an existing file nor a recipe name; "
        f"recipes: {', '.join(recipes())}"
    )


def resolve_config_args(argv: list[str]) -> list[str]:
    """``argv`` with the value of every ``--config`` resolved by :func:`recipe_path`."""
    resolved = list(argv)
    for i, arg in enumerate(resolved):
        if arg == "--config" and i + 1 < len(resolved):
            resolved[i + 1] = str(recipe_path(resolved[i + 1]))
        elif arg.startswith("--config="):
            resolved[i] = f"--config={recipe_path(arg.split('=', 1)[1])}"
    return resolved


class RecipeConfigFile(ActionConfigFile):
    """jsonargparse's ``--config`` action, taking a packaged recipe's name as well as a file.

    Raises:
        FileNotFoundError: (when parsing) for a value that is neither a file nor a recipe name.

    Example:
        >>> from jsonargparse import ArgumentParser
        >>> parser = ArgumentParser(exit_on_error=False)
        >>> _ = parser.add_argument("--config", action=RecipeConfigFile)
        >>> parser.parse_args(["--config", "no-such-recipe"])
        Traceback (most recent call last):
        ...
        FileNotFoundError: --config 'no-such-recipe' is neither an existing file nor a recipe name; ...
    """

    def __call__(self, parser: Any, cfg: Any, values: Any, option_string: str | None = None) -> None:
        super().__call__(parser, cfg, str(recipe_path(values)), option_string)
