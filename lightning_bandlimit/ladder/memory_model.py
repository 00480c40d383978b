"""The job's peak memory as a function of a lever's setting, learned online.

:class:`MemoryModel` learns a peak per point of one lever: per rung at the floor compression
(``resolution=1``, the exact rungs on the whole batch) and per compression of the continuum (on
the lossy rung, at the largest micro-batch split). The splits' own peaks follow another shape
(``G + A / split``: what the activations take shrinks with the chunk) and are learned by
:class:`~lightning_bandlimit.ladder.splits.SplitMemory`; all three sit in
:class:`~lightning_bandlimit.ladder.learned.LadderModel`. :func:`threshold_bytes` turns a
free-memory threshold into bytes.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MemoryModel", "threshold_bytes"]


class MemoryModel:
    """The job's peak memory as a function of compression, learned from what it has run with.

    Each observation updates an exponential moving average for its compression (rounded to
    ``resolution``). Predictions interpolate linearly between observed compressions; outside
    them they extrapolate with the slope of the secant over the whole observed span (the slope
    of two neighbouring points a hundredth apart is mostly measurement noise). A model whose
    secant does not fall, i.e. whose memory does not shrink with compression, predicts nothing.

    Args:
        smoothing: weight of a new observation in the moving average, in ``(0, 1]``.
        resolution: compressions closer than this share one point.

    Raises:
        ValueError: for ``smoothing`` outside ``(0, 1]`` or a non-positive ``resolution``.

    Example:
        >>> model = MemoryModel()
        >>> model.observe(0.0, 1000); model.observe(0.5, 600)
        >>> model.predict(0.25), model.predict(0.75)
        (800.0, 400.0)
    """

    def __init__(self, smoothing: float = 0.5, resolution: float = 0.01) -> None:
        if not 0 < smoothing <= 1 or resolution <= 0:
            raise ValueError(
                f"expected smoothing in (0, 1] and resolution > 0, got {smoothing}, {resolution}"
            )
        self.smoothing, self.resolution = smoothing, resolution
        self.points: dict[float, float] = {}

    def observe(self, compression: float, peak_bytes: float, replace: bool = False) -> None:
        """A peak measured at ``compression``: averaged into the point there, or (``replace``)
        taking its place."""
        key = round(round(compression / self.resolution) * self.resolution, 6)
        old = self.points.get(key)
        keep = old is None or replace
        self.points[key] = peak_bytes if keep else old + self.smoothing * (peak_bytes - old)  # type: ignore[operator]

    def shift(self, delta: float) -> None:
        """Every point moved by ``delta`` bytes (the job's baseline moved under them)."""
        self.points = {c: m + delta for c, m in self.points.items()}

    def predict(self, compression: float) -> float | None:
        """Predicted peak bytes at ``compression``; ``None`` until two compressions were seen,
        or while the memory seen does not fall with compression."""
        if len(self.points) < 2:
            return None
        xs = sorted(self.points)
        lo, hi = xs[0], xs[-1]
        slope = (self.points[hi] - self.points[lo]) / (hi - lo)
        if slope >= 0:
            return None
        if compression <= lo:
            return self.points[lo] + slope * (compression - lo)
        if compression >= hi:
            return self.points[hi] + slope * (compression - hi)
        b = next(x for x in xs if x >= compression)
        a = xs[xs.index(b) - 1]
        ya, yb = self.points[a], self.points[b]
        return ya + (yb - ya) * (compression - a) / (b - a)

    def state_dict(self) -> dict[str, Any]:
        return {"points": [[c, m] for c, m in sorted(self.points.items())]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.points = {float(c): float(m) for c, m in state.get("points", [])}


def threshold_bytes(threshold: float, total: int) -> int:
    """A free-memory threshold in bytes: ``threshold`` bytes, or that fraction of ``total`` below 1."""
    return int(threshold * total) if threshold < 1 else int(threshold)
