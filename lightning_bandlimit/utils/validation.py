"""Argument checks shared by the package, with torch-like errors.

A value of the wrong type raises :class:`TypeError`, a value out of range :class:`ValueError`;
both messages name the argument, say what was expected and show what was given.
``bool`` is never accepted where a number is expected.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from typing import Any, TypeVar

__all__ = ["check_bool", "check_choice", "check_compression", "check_int", "check_real", "check_selection"]

T = TypeVar("T")


def _range(minimum: float | None, maximum: float | None, min_open: bool, max_open: bool) -> str:
    if minimum is not None and maximum is not None:
        return f"in {'(' if min_open else '['}{minimum}, {maximum}{')' if max_open else ']'}"
    if minimum is not None:
        return f"{'>' if min_open else '>='} {minimum}"
    if maximum is not None:
        return f"{'<' if max_open else '<='} {maximum}"
    return ""


def _in_range(
    value: float, minimum: float | None, maximum: float | None, min_open: bool, max_open: bool
) -> bool:
    if minimum is not None and (value <= minimum if min_open else value < minimum):
        return False
    return maximum is None or (value < maximum if max_open else value <= maximum)


def check_int(name: str, value: Any, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """``value`` if it is an ``int`` (not a ``bool``) within ``[minimum, maximum]``.

    Args:
        name: the argument's name, for the message.
        value: the value given.
        minimum: the smallest value allowed (none if ``None``).
        maximum: the largest value allowed (none if ``None``).

    Raises:
        TypeError: if ``value`` is not an int, or is a bool.
        ValueError: if it is out of range.

    Example:
        >>> check_int("devices", 2, minimum=1)
        2
        >>> check_int("devices", 0, minimum=1)
        Traceback (most recent call last):
        ...
        ValueError: devices must be >= 1, got 0
        >>> check_int("devices", 1.5, minimum=1)
        Traceback (most recent call last):
        ...
        TypeError: devices must be an int >= 1, got 1.5 (float)
    """
    bounds = _range(minimum, maximum, False, False)
    if isinstance(value, bool) or not isinstance(value, int):
        expected = f"an int {bounds}".rstrip()
        raise TypeError(f"{name} must be {expected}, got {value!r} ({type(value).__name__})")
    if not _in_range(value, minimum, maximum, False, False):
        raise ValueError(f"{name} must be {bounds}, got {value}")
    return value


def check_real(
    name: str,
    value: Any,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    min_open: bool = False,
    max_open: bool = False,
) -> float:
    """``float(value)`` if it is a finite real number (int or float, not bool) in range.

    Args:
        name: the argument's name, for the message.
        value: the value given.
        minimum: the lower bound (none if ``None``); excluded if ``min_open``.
        maximum: the upper bound (none if ``None``); excluded if ``max_open``.
        min_open: whether ``minimum`` itself is excluded.
        max_open: whether ``maximum`` itself is excluded.

    Raises:
        TypeError: if ``value`` is not an int or float, or is a bool.
        ValueError: if it is NaN, infinite or out of range.

    Example:
        >>> check_real("compression", 0.5, minimum=0, maximum=1, max_open=True)
        0.5
        >>> check_real("compression", 1.5, minimum=0, maximum=1, max_open=True)
        Traceback (most recent call last):
        ...
        ValueError: compression must be in [0, 1), got 1.5
    """
    bounds = _range(minimum, maximum, min_open, max_open)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        expected = f"a real number {bounds}".rstrip()
        raise TypeError(f"{name} must be {expected}, got {value!r} ({type(value).__name__})")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value}")
    if not _in_range(value, minimum, maximum, min_open, max_open):
        raise ValueError(f"{name} must be {bounds}, got {value}")
    return float(value)


def check_compression(value: Any, name: str = "compression") -> float:
    """``float(value)`` if it is a compression rate: a real number in ``[0, 1)``.

    The one check of every compression-like argument (``compression``, ``min_compression``,
    ``max_compression``, ...): each public function, constructor and setter that takes one calls
    it, so a bad value is refused the same way everywhere.

    Args:
        value: the value given.
        name: the argument's name, for the message.

    Raises:
        TypeError: if ``value`` is not an int or float, or is a bool (e.g. ``"0.5"``, ``True``).
        ValueError: if it is NaN, infinite or outside ``[0, 1)``.

    Example:
        >>> check_compression(0.5)
        0.5
        >>> check_compression(1.5, "max_compression")
        Traceback (most recent call last):
        ...
        ValueError: max_compression must be in [0, 1), got 1.5
    """
    return check_real(name, value, minimum=0, maximum=1, max_open=True)


def check_bool(name: str, value: Any) -> bool:
    """``value`` if it is a ``bool``.

    Raises:
        TypeError: for anything else (``0``, ``"yes"``, ``None``).

    Example:
        >>> check_bool("memory_lean", 1)
        Traceback (most recent call last):
        ...
        TypeError: memory_lean must be a bool, got 1 (int)
    """
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {value!r} ({type(value).__name__})")
    return value


def check_choice(name: str, value: T, choices: Collection[T]) -> T:
    """``value`` if it is one of ``choices``.

    Args:
        name: the argument's name, for the message.
        value: the value given.
        choices: the values allowed (the message lists them in their order).

    Raises:
        ValueError: if ``value`` is not one of them.

    Example:
        >>> check_choice("norm", "L3", ("Linf", "L2"))
        Traceback (most recent call last):
        ...
        ValueError: norm must be one of ['Linf', 'L2'], got 'L3'
    """
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")
    return value


def check_selection(name: str, values: Sequence[str], choices: Sequence[str]) -> tuple[str, ...]:
    """``values``, a non-empty selection of ``choices``, in the order of ``choices``.

    Raises:
        TypeError: if ``values`` is a string or not a sequence.
        ValueError: if it is empty or names something not among ``choices``.

    Example:
        >>> check_selection("levers", ["compression", "checkpoint"], ("checkpoint", "compression"))
        ('checkpoint', 'compression')
    """
    if isinstance(values, str) or not isinstance(values, Sequence):
        raise TypeError(f"{name} must be a sequence of names from {list(choices)}, got {values!r}")
    if not values or any(v not in choices for v in values):
        raise ValueError(f"{name} must be a non-empty selection of {list(choices)}, got {list(values)}")
    return tuple(c for c in choices if c in values)
