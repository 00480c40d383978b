"""Others' memory growth between a job's checks: what the ladder expects of them by the next check.

Plain Python (no torch, no Lightning); :class:`~lightning_bandlimit.ladder.controller.LadderController`
keeps one :class:`OthersGrowth` and feeds it every check.
"""

from __future__ import annotations

from typing import Any

from lightning_bandlimit.ladder.setting import FreeMemory, Setting, measured_from_state, measured_state

__all__ = ["OthersGrowth"]


def _floats(values: list[Any] | None) -> list[float | None]:
    return [None if v is None else float(v) for v in (values or [None, None])]


class OthersGrowth:
    """Others' memory growth over the job's last two checks, and the trend expected of it.

    Others' memory is the total less the free bytes, the job's own peak measured at its setting
    since the last check, and the memory other memory-aware jobs hold (``peers``): their growth
    is seen while the job changes its own setting too; without that measurement (or over budget,
    where a reading says 0 free however far over) only over a check the job held its setting. A
    peer's own change (giving back a rung) is not a ramp to meet: growth is not read across a
    check where the peers' memory became known or unknown.

    Example:
        >>> from lightning_bandlimit.memory.protocol import MemoryReading
        >>> growth, job = OthersGrowth(), Setting(0, 0.0)
        >>> [growth.check(job, MemoryReading(10_000, free, "scripted"), (job, 5000.0), None)
        ...  for free in (3000, 2600, 2200)]  # others take 400 bytes a check: a ramp
        [0.0, 0.0, 400.0]
        >>> growth.check(job, MemoryReading(10_000, 2200, "scripted"), (job, 5000.0), None)  # it stops
        0.0
    """

    def __init__(self) -> None:
        self.last: tuple[Setting, float] | None = None  # the last check's setting and free bytes
        self.last_others: float | None = None  # others' memory then, when the job's was measured
        self.last_peers: float | None = None  # peers' memory then
        self.growth: list[float | None] = [None, None]  # others' growth over the last two checks
        self.seen: list[float | None] = [None, None]  # the last two growths seen (gaps skipped)

    def check(
        self,
        current: Setting,
        reading: FreeMemory,
        observed: tuple[Setting, float] | None,
        peers: float | None,
    ) -> float:
        """A check's reading at ``current`` (``observed``: the job's peak measured since the last
        check, with its setting; ``peers``: their memory, bytes): the growth expected by the next
        check, the smaller of the last two (a sustained ramp goes on), so ``0`` after a single
        jump (a step: the co-tenant took what it takes)."""
        # over budget a reading says 0 free however far over: others' memory is not known then
        measured = observed is not None and observed[0] == current and reading.free > 0
        others = (
            float(reading.total - reading.free - observed[1] - (peers or 0.0))  # type: ignore[index]
            if measured
            else None
        )
        growth = None
        if self.last is not None and (peers is None) == (self.last_peers is None):  # else not comparable
            if others is not None and self.last_others is not None:
                growth = others - self.last_others
            elif self.last[0] == current:
                growth = self.last[1] - reading.free - ((peers or 0.0) - (self.last_peers or 0.0))
        self.last_peers = peers
        self.growth = [self.growth[1], growth]
        if growth is not None:
            self.seen = [self.seen[1], growth]
        self.last, self.last_others = (current, float(reading.free)), others
        if None in self.growth:
            return 0.0
        return max(0.0, min(self.growth))  # type: ignore[type-var]

    @property
    def ramp(self) -> float:
        """The smaller of the last two growths seen (gaps skipped), ``0`` until two were seen."""
        return 0.0 if None in self.seen else max(0.0, min(self.seen))  # type: ignore[type-var]

    def reset(self) -> None:
        """Forget the checks so far (after a change the job's ladder did not decide)."""
        self.__init__()  # type: ignore[misc]

    def state_dict(self) -> dict[str, Any]:
        return {
            "last": measured_state(self.last),
            "last_others": self.last_others,
            "last_peers": self.last_peers,
            "growth": list(self.growth),
            "seen_growth": list(self.seen),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.last = measured_from_state(state.get("last"))
        others, peers = state.get("last_others"), state.get("last_peers")
        self.last_others = None if others is None else float(others)
        self.last_peers = None if peers is None else float(peers)
        self.growth, self.seen = _floats(state.get("growth")), _floats(state.get("seen_growth"))
