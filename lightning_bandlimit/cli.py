"""The ``lightning-bandlimit`` command line: LightningCLI plus recipes shipped in the package.

``lightning-bandlimit fit|validate|test|predict ...`` is LightningCLI with any LightningModule
and LightningDataModule (by ``class_path`` or, for ours, by short name:
``--model ImageClassifier --data SyntheticImageDataModule``). ``--config`` takes a file or the
name of a packaged recipe; ``lightning-bandlimit recipes`` lists them.
``lightning-bandlimit robustness ...`` runs :mod:`lightning_bandlimit.recipes.robustness`.
"""

from __future__ import annotations

import sys
from pathlib import Path

from lightning.pytorch.cli import LightningCLI

# Imported so that jsonargparse resolves their short names.
import lightning_bandlimit.callbacks  # noqa: F401
import lightning_bandlimit.data  # noqa: F401
import lightning_bandlimit.models  # noqa: F401
import lightning_bandlimit.strategies  # noqa: F401  (registers "elastic_ddp")

__all__ = ["BandLimitCLI", "main", "recipe_path", "recipes", "resolve_config_args"]

RECIPES_DIR = Path(__file__).resolve().parent / "configs"


def recipes() -> dict[str, str]:
    """Packaged recipes: name -> one-line description (the file's first comment line).

    Example:
        >>> sorted(recipes())
        ['cifar10-resnet18', 'elastic', 'quickstart', 'robustness', 'robustness_study']
    """
    found = {}
    for path in sorted(RECIPES_DIR.glob("*.yaml")):
        first = path.read_text().splitlines()[0] if path.stat().st_size else ""
        found[path.stem] = first.lstrip("# ").strip()
    return found


def recipe_path(name_or_path: str) -> Path:
    """The config file for a recipe name, or the given path if it is an existing file.

    Args:
        name_or_path: a packaged recipe's name (``"quickstart"``) or a path to a YAML file.

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
        f"--config {name_or_path!r} is neither an existing file nor a recipe name; "
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


class BandLimitCLI(LightningCLI):
    """LightningCLI for any LightningModule / LightningDataModule, saving the config per run.

    Args:
        args: command-line arguments (default ``sys.argv[1:]``); recipe names are resolved.
        **kwargs: passed to ``LightningCLI`` (e.g. ``run=False``).

    Raises:
        FileNotFoundError: for a ``--config`` that is neither a file nor a recipe name.

    Example:
        >>> cli = BandLimitCLI(args=["--config", "quickstart", "--trainer.max_epochs", "1"], run=False)
        >>> type(cli.model).__name__, type(cli.datamodule).__name__
        ('ImageClassifier', 'SyntheticImageDataModule')
    """

    def __init__(self, args: list[str] | None = None, **kwargs: object) -> None:
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        if args is None:  # from the command line: resolve recipe names in place
            sys.argv[1:] = resolve_config_args(sys.argv[1:])
            super().__init__(**kwargs)  # type: ignore[arg-type]
        else:
            super().__init__(args=resolve_config_args(list(args)), **kwargs)  # type: ignore[arg-type]


def main(args: list[str] | None = None) -> None:
    """Entry point of ``lightning-bandlimit`` and ``python -m lightning_bandlimit``.

    Args:
        args: command-line arguments (default ``sys.argv[1:]``).
    """
    argv = sys.argv[1:] if args is None else list(args)
    if argv[:1] == ["robustness"]:
        from lightning_bandlimit.recipes.robustness import main as robustness

        robustness(argv[1:])
        return
    if argv[:1] == ["recipes"]:
        found = recipes()
        width = max(map(len, found))
        for name, description in found.items():
            print(f"{name:<{width}}  {description}")
        return
    try:
        BandLimitCLI(args=None if args is None else argv)
    except FileNotFoundError as error:
        if "recipe" not in str(error):
            raise
        print(f"lightning-bandlimit: error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
