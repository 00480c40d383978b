"""The scripted probe: a replayed or synthetic memory trace, for tests and simulations.

Example:
    >>> with ScriptedProbe([6_000, 2_500], total=8_000) as probe:
    ...     first, second = probe.read(), probe.read()
    >>> first.free, second.used, second.free_fraction
    (6000, 5500, 0.3125)
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from lightning_bandlimit.memory.protocol import MemoryProbe, MemoryReading, as_bytes

__all__ = ["ScriptedProbe"]


def _check_free(value: Any, total: int, where: str) -> int:
    free = as_bytes(where, value, minimum=0)
    if free > total:
        raise ValueError(f"{where} is {free} bytes, more than total={total}")
    return free


def _parse_csv_int(text: str | None, where: str) -> int:
    cell = (text or "").strip()
    if not cell:
        raise ValueError(f"{where} is empty")
    try:
        return int(cell)
    except ValueError:
        pass
    try:
        number = float(cell)
    except ValueError:
        raise ValueError(f"{where} is not a number: {cell!r}") from None
    if not math.isfinite(number):
        raise ValueError(f"{where} is not finite: {cell!r}")
    return round(number)


class ScriptedProbe(MemoryProbe):
    """Replays a memory trace: the ``i``-th ``read()`` gets ``free[i]`` (the last value once the
    trace is over) or ``free(i)`` for a callable.

    Args:
        free: free bytes per read, or a function of the read's index (from 0) giving them.
        total: the device's total bytes, ``> 0``.

    Attributes:
        reads: how many readings were returned so far.

    Raises:
        ValueError: if ``total`` is not positive, the trace is empty, or a value is negative or
            above ``total`` (for a callable: when it is read).
        TypeError: if ``free`` is a string, or ``total`` or a value is not an integer.

    Example:
        >>> probe = ScriptedProbe([800, 500, 300], total=1000)
        >>> [probe.read().free for _ in range(4)]
        [800, 500, 300, 300]
        >>> probe.reads
        4
        >>> ScriptedProbe(lambda i: 1000 - 100 * i, total=1000).read().free_fraction
        1.0
    """

    source = "scripted"

    def __init__(self, free: Sequence[int] | Callable[[int], int], total: int) -> None:
        self.total = as_bytes("ScriptedProbe total", total, minimum=1)
        self.reads = 0
        self._fn: Callable[[int], int] | None = None
        self._trace: list[int] = []
        if callable(free):
            self._fn = free
        else:
            if isinstance(free, (str, bytes)):
                raise TypeError("ScriptedProbe free must be a sequence of ints or a callable, got a string")
            values = list(free)
            if not values:
                raise ValueError("ScriptedProbe needs a non-empty trace of free bytes")
            self._trace = [_check_free(v, total, f"free[{i}]") for i, v in enumerate(values)]

    @classmethod
    def from_csv(cls, path: str | Path, total: int | None = None) -> ScriptedProbe:
        """Replay a recorded trace: a CSV file whose header has a ``free`` column (bytes).

        Args:
            path: the CSV file. Other columns are ignored, except ``total``.
            total: the device's total bytes; by default the largest value of the file's
                ``total`` column.

        Returns:
            A :class:`ScriptedProbe` over the ``free`` column, in file order.

        Raises:
            ValueError: if the file has no ``free`` column, no rows, a bad value, or no total
                (neither a ``total`` argument nor column).
            OSError: if the file cannot be read.

        Example:
            >>> import tempfile, os
            >>> with tempfile.TemporaryDirectory() as tmp:
            ...     path = os.path.join(tmp, "trace.csv")
            ...     with open(path, "w") as f:
            ...         _ = f.write("step,free,total\\n0,900,1000\\n1,400,1000\\n")
            ...     probe = ScriptedProbe.from_csv(path)
            >>> [probe.read().free for _ in range(3)], probe.total
            ([900, 400, 400], 1000)
        """
        with open(path, newline="") as handle:
            reader = csv.reader(handle)
            header = next(reader, None)
            if header is None:
                raise ValueError(f"{path}: empty file, expected a header row with a 'free' column")
            names = [name.strip().lower() for name in header]
            if "free" not in names:
                raise ValueError(f"{path}: no 'free' column in header {header}")
            free_col = names.index("free")
            total_col = names.index("total") if "total" in names else None
            frees: list[int] = []
            totals: list[int] = []
            for line, row in enumerate(reader, start=2):
                if not any(cell.strip() for cell in row):
                    continue
                cells = row + [""] * (len(names) - len(row))
                frees.append(_parse_csv_int(cells[free_col], f"{path}:{line} free"))
                if total_col is not None:
                    totals.append(_parse_csv_int(cells[total_col], f"{path}:{line} total"))
        if not frees:
            raise ValueError(f"{path}: no rows after the header, the trace is empty")
        if total is None:
            if not totals:
                raise ValueError(f"{path}: no 'total' column; pass total= to from_csv")
            total = max(totals)
        return cls(frees, total=total)

    def read(self) -> MemoryReading:
        """The next value of the trace.

        Returns:
            A :class:`MemoryReading` with ``source="scripted"``.

        Raises:
            ProbeUnavailable: if the probe is closed.
            ValueError: if a callable trace gives a value below 0 or above ``total``.
            TypeError: if a callable trace gives a value that is not an integer.
        """
        self._ensure_open()
        index = self.reads
        if self._fn is not None:
            free = _check_free(self._fn(index), self.total, f"free({index})")
        else:
            free = self._trace[min(index, len(self._trace) - 1)]
        self.reads += 1
        return MemoryReading(total=self.total, free=free, source=self.source)

    def __repr__(self) -> str:
        kind = "callable" if self._fn is not None else f"{len(self._trace)} values"
        return f"ScriptedProbe({kind}, total={self.total}, reads={self.reads})"
