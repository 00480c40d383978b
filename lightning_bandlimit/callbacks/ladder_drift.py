"""The job's own baseline (what it holds between steps) over a run (:class:`BaselineDrift`): its
growth, reported once when it is large, with its rate.
"""

from __future__ import annotations

from lightning_bandlimit.utils.units import MIB

__all__ = ["BaselineDrift"]


class BaselineDrift:
    """The job's own baseline (what it holds between steps, at a measured step's start) over a
    run: its growth said once, when it exceeds ``large`` bytes (the ladder's ``min_free``: the
    headroom it keeps), with its rate. The first base seen is skipped (the run's first step
    allocates the optimizer's state within it).

    Example:
        >>> drift = BaselineDrift("Job")
        >>> [drift.update(step, base, large=100 * MIB) is not None for step, base in
        ...  [(1, 800 * MIB), (2, 900 * MIB), (5, 960 * MIB), (9, 1010 * MIB), (12, 1020 * MIB)]]
        [False, False, False, True, False]
        >>> print(drift.message)  # doctest: +ELLIPSIS
        Job: the job's own memory between steps grew by 110.0 MiB from step 2 to step 9 (15.71 MiB a step)...
    """

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.first: tuple[int, int] | None = None  # (step, bytes): the first base counted
        self.seen = 0
        self.message: str | None = None  # said once, then kept

    def update(self, step: int, base: int | None, large: float) -> str | None:
        """A check's base at ``step``; the message when the growth first exceeds ``large``."""
        if base is None or self.message is not None:
            return None
        self.seen += 1
        if self.seen == 1:
            return None
        if self.first is None:
            self.first = (step, base)
            return None
        growth = base - self.first[1]
        if growth <= large or step <= self.first[0]:
            return None
        rate = growth / (step - self.first[0])
        self.message = (
            f"{self.owner}: the job's own memory between steps grew by {growth / MIB:.1f} MiB from "
            f"step {self.first[0]} to step {step} ({rate / MIB:.2f} MiB a step), more than the "
            f"{large / MIB:.1f} MiB the ladder keeps free (a cache filling, an allocator growing). "
            "The ladder learns each setting from the step's increment above it, so the growth does "
            "not count against a rung; the free memory it takes is met like any shortfall (README, "
            '"The job\'s own drift")'
        )
        return self.message
