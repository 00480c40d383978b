"""The ``lightning-bandlimit`` command line: LightningCLI plus recipes shipped in the package.

``lightning-bandlimit fit|validate|test|predict ...`` is LightningCLI with any LightningModule
and LightningDataModule (by ``class_path`` or, for ours, by short name:
``--model ImageClassifier --data SyntheticImageDataModule``). ``--config`` takes a file or the
name of a packaged recipe; ``lightning-bandlimit recipes`` lists them.
``lightning-bandlimit robustness ...`` runs :mod:`lightning_bandlimit.recipes.robustness`.

A bad value on the command line (unparsable, rejected by a class's own checks while the
classes are built, or a missing file met during the run) ends in one line
``lightning-bandlimit: error: ...`` and exit status 2; any other error during the run keeps its
traceback. ``JSONARGPARSE_DEBUG=true`` shows the traceback of a bad value too.
"""

from __future__ import annotations

import sys
from argparse import ArgumentError
from typing import Any

import lightning.pytorch as pl
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

# Imported so that jsonargparse resolves their short names.
import lightning_bandlimit.callbacks  # noqa: F401
import lightning_bandlimit.data  # noqa: F401
import lightning_bandlimit.models  # noqa: F401
import lightning_bandlimit.strategies  # noqa: F401  (registers "elastic_ddp")
from lightning_bandlimit.health.exit import close_at_exit
from lightning_bandlimit.utils.command_line import (
    CommandLineError,
    debugging,
    exit_with_error,
    one_line_error,
)
from lightning_bandlimit.utils.recipe_files import RecipeConfigFile, recipes

__all__ = ["BandLimitCLI", "main"]

PROG = "lightning-bandlimit"

# Raised by the user's classes' own argument checks (and by Lightning's Trainer for a bad setting).
_BAD_VALUE_ERRORS = (ValueError, TypeError, OSError, MisconfigurationException)


class BandLimitCLI(LightningCLI):
    """LightningCLI for any LightningModule / LightningDataModule, saving the config per run.

    ``--config`` takes a file or a packaged recipe's name (:class:`RecipeConfigFile`).

    Args:
        args: command-line arguments (default ``sys.argv[1:]``).
        usage_errors: raise :class:`CommandLineError` for a bad value: one that does not parse
            (instead of jsonargparse's usage and exit) or that a class rejects while the classes
            are built (instead of its own exception, which becomes the ``__cause__``).
        **kwargs: passed to ``LightningCLI`` (e.g. ``run=False``).

    Raises:
        FileNotFoundError: for a ``--config`` that is neither a file nor a recipe name.
        CommandLineError: for a bad value, with ``usage_errors``.

    Example:
        >>> cli = BandLimitCLI(args=["--config", "quickstart", "--trainer.max_epochs", "1"], run=False)
        >>> type(cli.model).__name__, type(cli.datamodule).__name__
        ('ImageClassifier', 'SyntheticImageDataModule')
        >>> BandLimitCLI(
        ...     args=["--config", "quickstart", "--trainer.callbacks.compression", "1.5"],
        ...     run=False,
        ...     usage_errors=True,
        ... )
        Traceback (most recent call last):
        ...
        lightning_bandlimit.utils.command_line.CommandLineError: compression must be in [0, 1), got 1.5
    """

    def __init__(self, args: Any = None, *, usage_errors: bool = False, **kwargs: Any) -> None:
        self.usage_errors = usage_errors
        if usage_errors:
            kwargs["parser_kwargs"] = {"exit_on_error": False, **(kwargs.get("parser_kwargs") or {})}
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        super().__init__(args=args, **kwargs)

    def init_parser(self, **kwargs: Any) -> LightningArgumentParser:
        """LightningCLI's parser, with ``-c/--config`` resolving recipe names."""
        kwargs.setdefault("dump_header", [f"lightning.pytorch=={pl.__version__}"])
        parser = self.parser_class(**kwargs)
        parser.add_argument(
            "-c",
            "--config",
            action=RecipeConfigFile,
            help="Path to a configuration file in json or yaml format, or a packaged recipe's name "
            f"({', '.join(recipes())}).",
        )
        return parser

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        """LightningCLI's parsing; with ``usage_errors``, a bad value raises :class:`CommandLineError`."""
        try:
            super().parse_arguments(parser, args)
        except (ArgumentError, FileNotFoundError) as error:
            if not self.usage_errors:
                raise
            raise CommandLineError(one_line_error(error)) from error

    def instantiate_classes(self) -> None:
        """LightningCLI's; with ``usage_errors``, a class's rejection raises :class:`CommandLineError`."""
        try:
            super().instantiate_classes()
        except _BAD_VALUE_ERRORS as error:
            if not self.usage_errors:
                raise
            raise CommandLineError(one_line_error(error)) from error


def main(args: list[str] | None = None) -> None:
    """Entry point of ``lightning-bandlimit`` and ``python -m lightning_bandlimit``.

    Args:
        args: command-line arguments (default ``sys.argv[1:]``).

    Raises:
        SystemExit: status 2 with one line on stderr for a bad value (see the module's
            docstring).
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
    close_at_exit()  # whatever strategy the config names: a group left to the exit can abort it
    try:
        # args=None lets LightningCLI read sys.argv itself (no warning about both being given).
        BandLimitCLI(args=None if args is None else argv, usage_errors=True)
    except (CommandLineError, FileNotFoundError) as error:  # FileNotFoundError: during the run
        if debugging():
            raise
        message = str(error) if isinstance(error, CommandLineError) else one_line_error(error)
        raise exit_with_error(PROG, message) from None
