"""Command-line errors on one line: ``PROG: error: MESSAGE`` and exit status 2.

A command line of the package turns a bad value into :class:`CommandLineError` (or catches the
library's own exception) and ends with :func:`exit_with_error`; :func:`one_line_error` finds the
root cause of a chained exception (jsonargparse wraps a class's own message in reports that list
every type a value did not fit). ``JSONARGPARSE_DEBUG=true`` (:func:`debugging`) asks for the
traceback instead.
"""

from __future__ import annotations

import os
import re
import sys

__all__ = ["CommandLineError", "debugging", "exit_with_error", "one_line_error"]


class CommandLineError(ValueError):
    """A bad value on a command line; the message is one line, the root cause (:func:`one_line_error`)."""


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
