"""The probe protocol: a :class:`MemoryReading`, the :class:`ProbeUnavailable` error, and the
:class:`MemoryProbe` base class every probe implements.

Example:
    >>> reading = MemoryReading(total=8_000, free=2_500, source="scripted")
    >>> reading.used, reading.free_fraction
    (5500, 0.3125)
"""

from __future__ import annotations

import abc
import math
import operator
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from typing_extensions import Self

from lightning_bandlimit.utils.validation import check_int

__all__ = [
    "InvalidReading",
    "MemoryProbe",
    "MemoryReading",
    "ProbeUnavailable",
    "as_bytes",
    "check_process_memory",
    "check_reading",
    "describe_error",
]


def as_bytes(name: str, value: Any, *, minimum: int | None = None) -> int:
    """:func:`~lightning_bandlimit.utils.validation.check_int` for a number of bytes, also
    accepting integer scalars that are not ``int`` (NumPy's, 0-d integer tensors)."""
    if not isinstance(value, (int, float)) and hasattr(type(value), "__index__"):
        value = operator.index(value)
    return check_int(name, value, minimum=minimum)


def describe_error(err: BaseException) -> str:
    """``"TypeName: message"`` of an error, for a :class:`ProbeUnavailable` message."""
    try:
        text = str(err)
    except Exception:  # noqa: BLE001 -- pynvml's __str__ may call into a broken library
        text = ""
    name = type(err).__name__
    return f"{name}: {text}" if text else name


@dataclass(frozen=True)
class MemoryReading:
    """One measurement of a device's memory, in bytes.

    Attributes:
        total: bytes the job could use at most (device total; on the host the smaller of
            ``MemTotal`` and the cgroup limit).
        free: bytes free for this job now, after what *every* process on the device uses
            (on the host the smaller of ``MemAvailable`` and the cgroup's headroom).
        source: which probe measured it: ``"nvml"``, ``"cuda"``, ``"host"``, ``"budget"`` or
            ``"scripted"``.
        own: bytes of ``total - free`` that this job itself uses, when the probe can tell them
            apart from other processes' (:class:`~lightning_bandlimit.memory.SharedBudgetProbe`
            does); ``None`` otherwise.
        own_base: of ``own``, the bytes the job held at the start of the step whose peak
            ``own`` is: what it holds between steps (parameters, optimizer state, data caches),
            when the probe measures it (``None`` otherwise). ``own - own_base`` is the step's
            increment, which the job's own drift (a cache filling, an allocator growing) does
            not move: the ladder learns its settings from it.

    Raises:
        TypeError: if ``total``, ``free``, ``own`` or ``own_base`` is not an integer.
        ValueError: unless ``0 <= free <= total``, ``own >= 0`` and ``0 <= own_base <= own``
            (``own_base`` only with ``own``).

    Example:
        >>> reading = MemoryReading(total=1000, free=250, source="scripted")
        >>> reading.used, reading.free_fraction
        (750, 0.25)
        >>> MemoryReading(total=1000, free=1001, source="scripted")
        Traceback (most recent call last):
            ...
        ValueError: MemoryReading needs 0 <= free <= total, got free=1001, total=1000
    """

    total: int
    free: int
    source: str
    own: int | None = None
    own_base: int | None = None

    def __post_init__(self) -> None:
        total = as_bytes("MemoryReading.total", self.total)
        free = as_bytes("MemoryReading.free", self.free)
        if total < 0 or not 0 <= free <= total:
            raise ValueError(f"MemoryReading needs 0 <= free <= total, got free={free}, total={total}")
        object.__setattr__(self, "total", total)
        object.__setattr__(self, "free", free)
        if self.own is not None:
            object.__setattr__(self, "own", as_bytes("MemoryReading.own", self.own, minimum=0))
        if self.own_base is not None:
            base = as_bytes("MemoryReading.own_base", self.own_base, minimum=0)
            if self.own is None or base > self.own:
                raise ValueError(
                    f"MemoryReading needs own_base <= own (the step's start within its peak), got "
                    f"own_base={base}, own={self.own}"
                )
            object.__setattr__(self, "own_base", base)

    @property
    def used(self) -> int:
        """Bytes in use by anyone (``total - free``)."""
        return self.total - self.free

    @property
    def free_fraction(self) -> float:
        """``free / total`` in ``[0, 1]`` (``0.0`` for an empty device)."""
        return self.free / self.total if self.total else 0.0


class ProbeUnavailable(RuntimeError):
    """A probe cannot measure memory (here, or any more); the message says why.

    Example:
        >>> issubclass(ProbeUnavailable, RuntimeError)
        True
    """


class InvalidReading(ProbeUnavailable):
    """A probe's reading a decision cannot use (:func:`check_reading`): taken as the probe being
    unavailable for that check.

    Attributes:
        problem: what is wrong, without the values (``"free is more than total"``): the same
            problem on later readings is the same cause.
    """

    def __init__(self, problem: str, detail: str) -> None:
        super().__init__(f"invalid reading: {problem} ({detail})")
        self.problem = problem


def _bytes_problem(name: str, value: Any) -> str | None:
    if isinstance(value, float) and not math.isfinite(value):
        return f"{name} is not finite"
    if isinstance(value, bool) or not isinstance(value, int):
        return f"{name} is not an integer"
    return f"{name} is negative" if value < 0 else None


def check_reading(reading: Any) -> MemoryReading:
    """``reading`` if a decision can use it: a :class:`MemoryReading` of integer bytes with
    ``total > 0``, ``0 <= free <= total``, ``own`` ``None`` or ``>= 0`` and ``own_base`` ``None``
    or within ``[0, own]``. A probe may return
    anything (a custom one, or a reading built past :class:`MemoryReading`'s own checks).

    Raises:
        InvalidReading: otherwise.

    Example:
        >>> check_reading(MemoryReading(total=1000, free=250, source="scripted")).free
        250
        >>> check_reading(MemoryReading(total=0, free=0, source="scripted"))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
            ...
        lightning_bandlimit.memory.protocol.InvalidReading: invalid reading: total is not > 0 ...
    """
    if not isinstance(reading, MemoryReading):
        raise InvalidReading("not a MemoryReading", f"got a {type(reading).__name__}")
    total, free, own, base = (getattr(reading, n, None) for n in ("total", "free", "own", "own_base"))
    detail = f"total={total!r}, free={free!r}" + ("" if own is None else f", own={own!r}")
    detail += "" if base is None else f", own_base={base!r}"
    checks = [("total", total), ("free", free)] + ([] if own is None else [("own", own)])
    checks += [] if base is None else [("own_base", base)]
    for name, value in checks:
        if (problem := _bytes_problem(name, value)) is not None:
            raise InvalidReading(problem, detail)
    if total <= 0:
        raise InvalidReading("total is not > 0", detail)
    if free > total:
        raise InvalidReading("free is more than total", detail)
    if base is not None and (own is None or base > own):
        raise InvalidReading("own_base is more than own", detail)
    return reading


def check_process_memory(found: Any) -> dict[int, int] | None:
    """``found`` if it is what :meth:`MemoryProbe.process_memory` promises: ``None``, or a dict
    of integer process ids to integer bytes ``>= 0``.

    Raises:
        InvalidReading: otherwise.

    Example:
        >>> check_process_memory({12: 4096})
        {12: 4096}
        >>> check_process_memory({12: float("nan")})
        Traceback (most recent call last):
            ...
        lightning_bandlimit.memory.protocol.InvalidReading: invalid reading: memory is not finite (process 12)
    """
    if found is None:
        return None
    if not isinstance(found, dict):
        raise InvalidReading("process memory is not a dict", f"got a {type(found).__name__}")
    for pid, memory in found.items():
        if isinstance(pid, bool) or not isinstance(pid, int):
            raise InvalidReading("process id is not an integer", f"got {type(pid).__name__}")
        if (problem := _bytes_problem("memory", memory)) is not None:
            raise InvalidReading(problem, f"process {pid}")
    return found


class MemoryProbe(abc.ABC):
    """Reads the free memory of one device. A context manager: leaving it calls :meth:`close`.

    Subclasses set the class attribute ``source`` and implement :meth:`read`, which raises
    :class:`ProbeUnavailable` (never anything else) when memory cannot be measured; callers take
    any other error, or a reading :func:`check_reading` refuses, as unavailable too. A probe
    whose readings carry the job's own memory (:attr:`MemoryReading.own`) sets
    ``measures_own = True``, so a caller need not measure the job itself.

    Example:
        >>> from lightning_bandlimit.memory import ScriptedProbe
        >>> with ScriptedProbe([10], total=10) as probe:
        ...     probe.read().free
        10
        >>> probe.closed
        True
    """

    source: str = ""
    measures_own: bool = False
    _closed: bool = False

    @abc.abstractmethod
    def read(self) -> MemoryReading:
        """Measure now.

        Returns:
            The current :class:`MemoryReading`.

        Raises:
            ProbeUnavailable: if memory cannot be measured (or the probe is closed).
        """

    def process_memory(self) -> dict[int, int] | None:
        """The memory each process holds on the device, as the device counts it (bytes by
        process id), or ``None`` when this probe cannot tell (the default).

        Raises:
            ProbeUnavailable: if the probe can tell but the reading fails.
        """
        return None

    def close(self) -> None:
        """Release what the probe holds. Idempotent; later reads raise :class:`ProbeUnavailable`."""
        self._closed = True

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def _ensure_open(self) -> None:
        if self._closed:
            raise ProbeUnavailable(f"{type(self).__name__} is closed")

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
