"""What the ladder decides over: a :class:`Setting` of its levers, a :class:`Decision` to move to
one, and the :class:`FreeMemory` it decides from (any probe's reading)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

__all__ = ["Decision", "FreeMemory", "Setting", "measured_from_state", "measured_state"]


class FreeMemory(Protocol):
    """A reading of the device's memory, as the ladder needs it (a
    :class:`~lightning_bandlimit.memory.MemoryReading` is one): free and total bytes."""

    @property
    def free(self) -> int: ...

    @property
    def total(self) -> int: ...


@dataclass(frozen=True, repr=False)
class Setting:
    """A point of the ladder: checkpointed stages (``rung``), the compression, and the chunks a
    step's batch runs in (``split``, keyword only; ``1``: whole).

    Example:
        >>> Setting(2, 0.0), Setting(2, 0.0, split=4)
        (Setting(rung=2, compression=0.0), Setting(rung=2, compression=0.0, split=4))
    """

    rung: int
    compression: float
    split: int = field(default=1, kw_only=True)

    def __repr__(self) -> str:
        split = f", split={self.split}" if self.split != 1 else ""
        return f"{type(self).__name__}(rung={self.rung}, compression={self.compression!r}{split})"


@dataclass(frozen=True, repr=False)
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

    def __repr__(self) -> str:
        split = f", split={self.split}" if self.split != 1 else ""
        return (
            f"Decision(rung={self.rung}, compression={self.compression!r}{split}, reason={self.reason!r}, "
            f"free={self.free!r}, threshold={self.threshold!r})"
        )

    @property
    def setting(self) -> Setting:
        return Setting(self.rung, self.compression, split=self.split)

    @classmethod
    def at(cls, setting: Setting, reason: str, free: int, threshold: int) -> Decision:
        """A decision to run at ``setting`` (its split included).

        Example:
            >>> Decision.at(Setting(1, 0.0, split=2), "hold", free=5, threshold=10)
            Decision(rung=1, compression=0.0, split=2, reason='hold', free=5, threshold=10)
        """
        return cls(setting.rung, setting.compression, reason, free, threshold, split=setting.split)


def measured_state(value: tuple[Setting, float] | None) -> list[float] | None:
    """A setting and a figure measured or predicted there, as a ``state_dict`` keeps it (the
    split after the figure, when not 1).

    Example:
        >>> measured_state((Setting(2, 0.5), 1000.0)), measured_from_state([2, 0.5, 1000.0])
        ([2, 0.5, 1000.0], (Setting(rung=2, compression=0.5), 1000.0))
        >>> measured_state((Setting(2, 0.0, split=4), 10.0))
        [2, 0.0, 10.0, 4]
    """
    if value is None:
        return None
    setting = value[0]
    saved = [setting.rung, setting.compression, value[1]]
    return saved if setting.split == 1 else [*saved, setting.split]


def measured_from_state(saved: list[float] | None) -> tuple[Setting, float] | None:
    """The inverse of :func:`measured_state`."""
    if saved is None:
        return None
    split = int(saved[3]) if len(saved) > 3 else 1
    return Setting(int(saved[0]), float(saved[1]), split=split), float(saved[2])
