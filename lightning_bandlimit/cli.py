"""The ``lightning-bandlimit`` command line: LightningCLI plus recipes shipped in the package.

``lightning-bandlimit fit|validate|test|predict ...`` is LightningCLI with any LightningModule
and LightningDataModule (by ``class_path`` or, for ours, by short name:
``--model ImageClassifier --data SyntheticImageDataModule``). ``--config`` takes a file or the
name of a packaged recipe; ``lightning-bandlimit recipes`` lists them.
``lightning-bandlimit robustness ...`` runs :mod:`lightning_bandlimit.recipes.robustness`.
"""

from __future__ import annotations

import sys

from lightning.pytorch.cli import LightningCLI

# Imported so that jsonargparse resolves their short names.
import lightning_bandlimit.callbacks  # noqa: F401
import lightning_bandlimit.data  # noqa: F401
import lightning_bandlimit.models  # noqa: F401
import lightning_bandlimit.strategies  # noqa: F401  (registers "elastic_ddp")
from lightning_bandlimit.recipe_files import RECIPES_DIR, recipe_path, recipes, resolve_config_args

__all__ = ["RECIPES_DIR", "BandLimitCLI", "main", "recipe_path", "recipes", "resolve_config_args"]


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
