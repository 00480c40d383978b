"""Stragglers: a rank persistently slower than the others, reported once.

Plain Python (no torch, no Lightning). The strategy gathers every rank's own time for a step
(its local compute, which no rank waits for another in) and feeds them to a
:class:`StragglerDetector` on every rank; the same figures give the same verdict everywhere.

**The rule.** At a step, rank ``r`` is *slow* when its time is over ``slow_factor`` times the
median of the **other** ranks' times at that step. The others' median, not the median of all
ranks, so that a straggler does not pull its own yardstick up: with 2 ranks the median of all
is the mean of the two, and a rank 3x slower than its peer is only 1.5x that mean (2x slower:
1.33x, never flagged at ``slow_factor=1.5``); against the others' median, the peer's time, it is
3x. With 4 or more ranks and one straggler the two agree nearly. A rank that half or more of the
ranks are as slow as is the median itself, not a straggler. World size 1: no others, never slow.

A rank slow at ``slow_steps`` consecutive observed steps is *flagged*: :meth:`~StragglerDetector.observe`
returns a :class:`Straggler` for it at that step, once. It stays flagged (and is not reported
again) until it has been not slow at ``slow_steps`` consecutive steps; it is reported again only
if it then is slow for ``slow_steps`` consecutive steps anew. A step at which a rank is not slow
(a step all ranks found slow alike, such as a checkpoint save, counts as not slow) starts its
count again. A change in the number of times given (the world size changed: ranks renumbered)
forgets everything: counts, window and flags.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import median
from typing import Any

from lightning_bandlimit.utils.validation import check_int, check_real

__all__ = ["Straggler", "StragglerDetector"]


@dataclass(frozen=True)
class Straggler:
    """A rank flagged as a straggler, with the figures of the window it was flagged over.

    Attributes:
        rank: the straggler's rank.
        step: the step it was flagged at.
        seconds: its median step time over the last ``slow_steps`` steps.
        median: what a typical other rank took: the median over the other ranks of their median
            step times over the same window (the others', as the rule compares against; see the
            module docstring).
        ratio: ``seconds / median`` (``inf`` if ``median`` is 0).
        slow_steps: the window, in steps (the detector's ``slow_steps``).
        slow_factor: the detector's ``slow_factor``.

    Example:
        >>> straggler = Straggler(rank=1, step=120, seconds=0.84, median=0.31, ratio=0.84 / 0.31)
        >>> straggler.message()  # doctest: +ELLIPSIS
        'rank 1 is a straggler: 0.84 s a step against a median of 0.31 s (2.7x) for the last 20 ...'
        >>> straggler.message().endswith("for the last 20 steps (slow_factor=1.5)")
        True
    """

    rank: int
    step: int
    seconds: float
    median: float
    ratio: float
    slow_steps: int = 20
    slow_factor: float = 1.5

    def message(self) -> str:
        """One line: the rank, its time, the others' median, the ratio and the rule's settings."""
        return (
            f"rank {self.rank} is a straggler: {self.seconds:.3g} s a step against a median of "
            f"{self.median:.3g} s ({self.ratio:.1f}x) for the last {self.slow_steps} steps "
            f"(slow_factor={self.slow_factor:g})"
        )


def _median_of_others(values: Sequence[float], rank: int) -> float:
    return median(v for i, v in enumerate(values) if i != rank)


class StragglerDetector:
    """Flags a rank slower than ``slow_factor`` times the others' median for ``slow_steps`` steps.

    See the module docstring for the rule: the comparison is against the median of the *other*
    ranks' times (for 2 ranks: the peer's time), a run of ``slow_steps`` consecutive slow steps
    flags a rank once, and ``slow_steps`` consecutive steps not slow clear the flag.

    Args:
        slow_factor: how many times the others' median a rank's step time must exceed to be
            slow at a step; a finite real number > 1.
        slow_steps: how many consecutive slow steps flag a rank (and how many not slow clear
            the flag); an int >= 1.

    Raises:
        TypeError: if ``slow_factor`` is not a real number or ``slow_steps`` not an int (bools
            are neither).
        ValueError: if ``slow_factor`` is not finite or not > 1, or ``slow_steps`` < 1.

    Example:
        >>> detector = StragglerDetector(slow_factor=1.5, slow_steps=3)
        >>> [detector.observe(step, [0.3, 0.9]) for step in (1, 2)]
        [[], []]
        >>> [s.rank for s in detector.observe(3, [0.3, 0.9])], detector.flagged
        ([1], (1,))
        >>> detector.observe(4, [0.3, 0.9])  # reported once
        []
    """

    def __init__(self, slow_factor: float = 1.5, slow_steps: int = 20) -> None:
        self.slow_factor = check_real("slow_factor", slow_factor, minimum=1, min_open=True)
        self.slow_steps = check_int("slow_steps", slow_steps, minimum=1)
        self.reset()

    def reset(self) -> None:
        """Forget every step seen: counts, window and flags (as a change of world size does)."""
        self._world_size: int | None = None
        self._slow_run: list[int] = []  # per rank: consecutive slow steps (a rank not flagged)
        self._calm_run: list[int] = []  # per rank: consecutive steps not slow (a flagged rank)
        self._flagged: set[int] = set()
        self._window: deque[list[float]] = deque(maxlen=self.slow_steps)  # the last steps' times

    @property
    def flagged(self) -> tuple[int, ...]:
        """The ranks flagged now (reported, and not yet ``slow_steps`` steps not slow), sorted."""
        return tuple(sorted(self._flagged))

    @property
    def world_size(self) -> int | None:
        """The number of ranks of the steps observed since the last reset (``None``: none yet)."""
        return self._world_size

    def observe(self, step: int, seconds: Sequence[float]) -> list[Straggler]:
        """One step's times: the ranks flagged at this step (empty but at a flag), by rank.

        Args:
            step: the step the times are of (only reported in a :class:`Straggler`); an int >= 0.
            seconds: ``seconds[r]``, rank ``r``'s time for this step, in seconds; one per rank.
                A length other than the last step's (the world size changed) first resets the
                detector; that is not an error.

        Raises:
            TypeError: if ``step`` is not an int, ``seconds`` not a sequence, or a time not a real
                number.
            ValueError: if ``step`` < 0, ``seconds`` is empty, or a time is negative, NaN or
                infinite (nothing is counted then).

        Example:
            >>> StragglerDetector(slow_steps=1).observe(7, [0.2, 0.2, 0.2, 0.5])  # doctest: +ELLIPSIS
            [Straggler(rank=3, step=7, seconds=0.5, median=0.2, ratio=2.5, slow_steps=1, ...)]
        """
        check_int("step", step, minimum=0)
        if isinstance(seconds, (str, bytes)) or not isinstance(seconds, Sequence):
            raise TypeError(
                f"seconds must be a sequence of step times, one per rank, got {type(seconds).__name__}"
            )
        if len(seconds) == 0:
            raise ValueError("seconds must hold one step time per rank, got an empty sequence")
        times = [check_real(f"seconds[{r}]", t, minimum=0) for r, t in enumerate(seconds)]
        if len(times) != self._world_size:
            self.reset()
            self._world_size = len(times)
            self._slow_run = [0] * len(times)
            self._calm_run = [0] * len(times)
        self._window.append(times)
        if len(times) < 2:
            return []
        found: list[Straggler] = []
        for rank, time in enumerate(times):
            slow = time > self.slow_factor * _median_of_others(times, rank)
            if rank in self._flagged:
                self._calm_run[rank] = 0 if slow else self._calm_run[rank] + 1
                if self._calm_run[rank] >= self.slow_steps:
                    self._flagged.discard(rank)
                    self._calm_run[rank] = 0
                continue
            self._slow_run[rank] = self._slow_run[rank] + 1 if slow else 0
            if self._slow_run[rank] >= self.slow_steps:
                self._flagged.add(rank)
                self._slow_run[rank] = 0
                found.append(self._straggler(rank, step))
        return found

    def _straggler(self, rank: int, step: int) -> Straggler:
        """The figures of ``rank`` over the window (the last ``slow_steps`` steps)."""
        medians = [median(column) for column in zip(*self._window)]
        seconds, others = medians[rank], _median_of_others(medians, rank)
        ratio = seconds / others if others > 0 else math.inf
        return Straggler(rank, step, seconds, others, ratio, self.slow_steps, self.slow_factor)

    def state_dict(self) -> dict[str, Any]:
        """The detector's counts, window and flags, as plain values (ints, floats, lists, ``None``).

        Example:
            >>> detector = StragglerDetector(slow_steps=2)
            >>> detector.observe(1, [1.0, 3.0])
            []
            >>> detector.state_dict()
            {'world_size': 2, 'slow_run': [0, 1], 'calm_run': [0, 0], 'flagged': [], 'window': [[1.0, 3.0]]}
        """
        return {
            "world_size": self._world_size,
            "slow_run": list(self._slow_run),
            "calm_run": list(self._calm_run),
            "flagged": sorted(self._flagged),
            "window": [list(times) for times in self._window],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`'s values (``slow_factor`` and ``slow_steps`` stay this
        detector's; a window longer than its ``slow_steps`` keeps its last steps).

        Raises:
            ValueError: if the lists do not match ``world_size`` or a flagged rank is out of range.
        """
        world_size = state.get("world_size")
        if world_size is None:
            self.reset()
            return
        world_size = check_int("world_size", world_size, minimum=1)
        slow_run = [int(n) for n in state["slow_run"]]
        calm_run = [int(n) for n in state["calm_run"]]
        flagged = {int(r) for r in state["flagged"]}
        window = [[float(t) for t in times] for times in state["window"]]
        if (
            len(slow_run) != world_size
            or len(calm_run) != world_size
            or any(len(times) != world_size for times in window)
            or any(not 0 <= r < world_size for r in flagged)
        ):
            raise ValueError(
                f"a StragglerDetector state must hold one count, time and flag per rank of its "
                f"world_size ({world_size}), got {state!r}"
            )
        self.reset()
        self._world_size, self._slow_run, self._calm_run, self._flagged = (
            world_size,
            slow_run,
            calm_run,
            flagged,
        )
        self._window.extend(window)
