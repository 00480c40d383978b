"""What the ladder decides over: a :class:`Setting` of its levers, a :class:`Decision` to move to
one, and the :class:`FreeMemory` it decides from (any probe's reading)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

__all__ = ["Decision", "FreeMemory", "Setting", "measured_from_state", "measured_state"]


class FreeMemory(Protocol):
    """A reading of the device's memory, as the ladder needs it (a
    :class:`~lightning_bandlimit.memory.MemoryReading` is one): free and total bytes."""

    @property
    def free(self) -> int: ...

    @property
    def total(self) -> int: ...


@dataclass(frozen=True)
class Setting:
    """A point of the ladder: checkpointed stages (``rung``) and the compression."""

    rung: int
    compression: float


@dataclass(frozen=True)
class Decision(Setting):
    """One check's outcome: the setting to apply (its ``rung`` and ``compression``), why
    (``hold|raise|lower|oom``, :mod:`~lightning_bandlimit.ladder.reasons`), the free bytes it
    was decided at and the threshold they were compared with.

    Example:
        >>> d = Decision(2, 0.0, "raise", free=50, threshold=100)
        >>> d.setting
        Setting(rung=2, compression=0.0)
    """

    reason: str
    free: int
    threshold: int

    @property
    def setting(self) -> Setting:
        return Setting(self.rung, self.compression)


def measured_state(value: tuple[Setting, float] | None) -> list[float] | None:
    """A setting and a figure measured or predicted there, as a ``state_dict`` keeps it.

    Example:
        >>> measured_state((Setting(2, 0.5), 1000.0)), measured_from_state([2, 0.5, 1000.0])
        ([2, 0.5, 1000.0], (Setting(rung=2, compression=0.5), 1000.0))
    """
    return None if value is None else [value[0].rung, value[0].compression, value[1]]


def measured_from_state(saved: list[float] | None) -> tuple[Setting, float] | None:
    """The inverse of :func:`measured_state`."""
    return None if saved is None else (Setting(int(saved[0]), float(saved[1])), float(saved[2]))
