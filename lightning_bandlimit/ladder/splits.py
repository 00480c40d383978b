"""What a ladder learned of the micro-batch splits: the peak memory and step time at each split
a step's batch ran in, on the top rung, and the predictions made from them.

A step's increment over the job's baseline is, to a first approximation, ``G + A / split``:
``A`` what the batch's activations take (a chunk of ``1 / split`` of the batch keeps that share
of them) and ``G`` what does not shrink with the chunk (gradients, the optimizer's transients).
Three predictions follow, each used where its direction is safe:

* **conservative** (:meth:`SplitMemory.predict`): a split not measured frees nothing over the
  largest-chunk split measured below it (what the ladder relies on to stop, compress, release);
* **hinted** (:meth:`SplitMemory.hint`): ``G + A / split`` through the two measured points of
  the smallest chunks (with one point, ``G = 0``): which split to try first, exact either way;
* **bounded** (:meth:`SplitMemory.bound`): a chunk ``m`` times larger keeps at most ``m`` times
  the increment (``G`` does not grow), so going down is never predicted to add less than it may.

Plain Python (no torch, no Lightning).
"""

from __future__ import annotations

from typing import Any

__all__ = ["SPLIT_SMOOTHING", "SplitMemory", "check_splits"]

# Weight of a new peak in a split's moving average, as the rungs' and compressions' points.
SPLIT_SMOOTHING = 0.5


def check_splits(splits: Any) -> tuple[int, ...]:
    """``splits`` as a sorted tuple of distinct ints above 1.

    Raises:
        TypeError: for a split that is not an int.
        ValueError: for a split below 2.

    Example:
        >>> check_splits([4, 2, 8])
        (2, 4, 8)
    """
    values = tuple(splits)
    for split in values:
        if isinstance(split, bool) or not isinstance(split, int):
            raise TypeError(f"splits must be ints, got {split!r} in {list(values)}")
        if split < 2:
            raise ValueError(
                f"splits must be at least 2 (1 is the whole batch), got {split} in {list(values)}"
            )
    return tuple(sorted(set(values)))


class SplitMemory:
    """Peak bytes and step seconds per split, measured on the top rung (see the module docstring).

    Example:
        >>> memory = SplitMemory()
        >>> memory.observe(2, 700.0)  # top rung (split 1) measured at 1000, baseline 400
        >>> memory.predict(4, top=1000.0), memory.hint(4, top=1000.0, baseline=400.0)
        (700.0, 550.0)
        >>> memory.bound(1, 2, peak=700.0, baseline=400.0)  # the whole batch keeps at most twice 300
        1000.0
    """

    def __init__(self) -> None:
        self.points: dict[int, float] = {}
        self.seconds: dict[int, float] = {}

    def observe(self, split: int, peak: float, replace: bool = False) -> None:
        """A step's peak at ``split``: averaged into its point, or (``replace``) taking its place."""
        old = self.points.get(split)
        keep = old is None or replace
        self.points[split] = float(peak) if keep else old + SPLIT_SMOOTHING * (float(peak) - old)  # type: ignore[operator]

    def observe_time(self, split: int, seconds: float, smoothing: float) -> None:
        """A step's time at ``split`` (an exponential moving average with ``smoothing``)."""
        old = self.seconds.get(split)
        self.seconds[split] = seconds if old is None else old + smoothing * (seconds - old)

    def shift(self, delta: float) -> None:
        """Every point moved by ``delta`` bytes (the job's baseline moved under them)."""
        self.points = {s: m + delta for s, m in self.points.items()}

    def forget(self) -> None:
        """The top rung changed: what was measured on the old one no longer holds."""
        self.points.clear()
        self.seconds.clear()

    def predict(self, split: int, top: float | None) -> float | None:
        """Predicted peak at ``split``: measured there, else that of the largest-chunk split
        measured below it (the top rung's ``top`` for the whole batch); ``None`` if none is known."""
        if split in self.points:
            return self.points[split]
        below = [s for s in self.points if s < split]
        return self.points[max(below)] if below else top

    def hint(self, split: int, top: float | None, baseline: float | None) -> float | None:
        """A hinted peak at ``split`` not measured yet (``G + A / split``); ``None`` when nothing
        below is measured or the splits measured did not lower the peak."""
        if split in self.points:
            return self.points[split]
        base = baseline or 0.0
        known = {s: p - base for s, p in self.points.items() if s < split}
        if top is not None:
            known[1] = top - base
        if not known:
            return None
        near = sorted(known)[-2:]
        if len(near) == 1:
            fixed, activations = 0.0, max(0.0, known[near[0]]) * near[0]
        else:
            a, b = near
            activations = (known[a] - known[b]) / (1 / a - 1 / b)
            if activations <= 0:
                return None
            fixed = max(0.0, known[a] - activations / a)
        return base + fixed + activations / split

    @staticmethod
    def bound(target: int, split: int, peak: float, baseline: float | None) -> float:
        """The most the peak may be at ``target`` (below ``split``, where it is ``peak``): the
        increment grows at most with the chunk."""
        base = baseline or 0.0
        return base + max(0.0, peak - base) * split / target

    def state_dict(self) -> dict[str, Any]:
        return {
            "points": [[s, m] for s, m in sorted(self.points.items())],
            "seconds": [[s, t] for s, t in sorted(self.seconds.items())],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.points = {int(s): float(m) for s, m in state.get("points", [])}
        self.seconds = {int(s): float(t) for s, t in state.get("seconds", [])}
