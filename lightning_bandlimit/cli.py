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

import os
import re
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
from lightning_bandlimit.recipe_files import (
    RECIPES_DIR,
    RecipeConfigFile,
    recipe_path,
    recipes,
    resolve_config_args,
)

__all__ = [
    "RECIPES_DIR",
    "BandLimitCLI",
    "CommandLineError",
    "debugging",
    "exit_with_error",
    "main",
    "one_line_error",
    "recipe_path",
    "recipes",
    "resolve_config_args",
]

PROG = "lightning-bandlimit"

# Raised by the user's classes' own argument checks (and by Lightning's Trainer for a bad setting).
_BAD_VALUE_ERRORS = (ValueError, TypeError, OSError, MisconfigurationException)


class CommandLineError(ValueError):
    """A bad value on a command line; the message is one line, the root cause (:func:`one_line_error`)."""


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
        lightning_bandlimit.cli.CommandLineError: compression must be in [0, 1), got 1.5
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


# jsonargparse's report of a value that fits none of a Union's types lists every alternative;
# these lines say nothing about the value the user gave.
_NOISE = re.compile(
    r"^-?\s*("
    r"Does not validate against any of the Union subtypes"
    r"|Subtypes: .*|Errors:|Given value type: .*|Given value: .*"
    r"|Expected a <class 'NoneType'>.*"
    r"|Not a valid subclass of .*|Subclass types expect one of:|a class path \(str\)|a dict .*"
    r"|Expected a path but .* either not accessible or invalid"
    r")$"
)
_PARSER_KEY = re.compile(r'^Parser key "([^"]+)":')


def one_line_error(error: BaseException) -> str:
    """The root cause of a command-line error, on one line.

    Follows ``__cause__`` / ``__context__`` to the innermost exception, keeps the lines of its
    message that describe the given value (jsonargparse lists every type a value did not fit),
    and prefixes the option name when jsonargparse named it.

    Args:
        error: the exception raised while parsing the arguments or building the classes.

    Example:
        >>> try:
        ...     try:
        ...         raise ValueError("compression must be in [0, 1), got 1.5")
        ...     except ValueError as inner:
        ...         raise ValueError("Does not validate against any of the Union subtypes") from inner
        ... except ValueError as outer:
        ...     one_line_error(outer)
        'compression must be in [0, 1), got 1.5'
    """
    chain = [error]
    while (cause := _cause(chain[-1])) is not None and cause not in chain:
        chain.append(cause)
    lines = [line.strip() for line in str(chain[-1]).splitlines() if line.strip()]
    kept = [line.removeprefix("- ") for line in lines if not _NOISE.match(line)] or lines
    message = "; ".join(kept) or type(chain[-1]).__name__
    for link in chain:
        key = _PARSER_KEY.match(str(link))
        if key and not _PARSER_KEY.match(message):
            return f"--{key.group(1)}: {message}"
    return message


def _cause(error: BaseException) -> BaseException | None:
    if error.__cause__ is not None:
        return error.__cause__
    return None if error.__suppress_context__ else error.__context__


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
    try:
        # args=None lets LightningCLI read sys.argv itself (no warning about both being given).
        BandLimitCLI(args=None if args is None else argv, usage_errors=True)
    except (CommandLineError, FileNotFoundError) as error:  # FileNotFoundError: during the run
        if debugging():
            raise
        message = str(error) if isinstance(error, CommandLineError) else one_line_error(error)
        raise exit_with_error(PROG, message) from None


def debugging() -> bool:
    """Whether ``JSONARGPARSE_DEBUG=true`` asks for tracebacks instead of one-line errors."""
    return os.environ.get("JSONARGPARSE_DEBUG", "").lower() == "true"


def exit_with_error(prog: str, message: str) -> SystemExit:
    """Print ``PROG: error: MESSAGE`` on stderr and return ``SystemExit(2)`` to raise.

    Example:
        >>> exit_with_error("lightning-bandlimit", "bad value").code
        2
    """
    print(f"{prog}: error: {message}", file=sys.stderr)
    return SystemExit(2)
