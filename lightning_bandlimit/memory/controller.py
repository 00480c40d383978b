"""Decide the compression from memory headroom: thresholds, hysteresis, cooldown, a learned model.

The controller is plain Python (no Lightning), fed one :class:`~.probes.MemoryReading` per
check and, when known, the job's own peak memory at the compression it ran with:

* **Pressure** (free below ``min_free``): raise the compression at once. With a learned
  memory-versus-compression relation it jumps to the least compression predicted to free the
  missing bytes plus the *surprise*: how far free memory fell short of what the previous
  decision predicted (a co-tenant still growing, or a model too optimistic), so a co-tenant
  that grows steadily is met one check ahead. Without a relation (or when none is predicted
  to suffice) it steps up by ``raise_step``.
* **Hold** (free between ``min_free`` and ``release_free``): no change, the hysteresis band.
* **Release** (free at or above ``release_free`` for ``release_checks`` checks in a row, and
  ``cooldown_checks`` checks after the last change): lower the compression to the least one
  the learned relation predicts to keep ``release_free`` free (at once: a model error smaller
  than ``release_free - min_free`` cannot bring the job under pressure); without a usable
  relation, by ``lower_step``. Never below a compression that once ran out of memory
  (:meth:`CompressionController.on_oom`).

All changes stay within ``[min_compression, max_compression]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lightning_bandlimit.functional import check_compression
from lightning_bandlimit.memory.probes import MemoryReading

__all__ = ["CompressionController", "Decision", "MemoryModel"]

HOLD, RAISE, LOWER, OOM = "hold", "raise", "lower", "oom"


@dataclass(frozen=True)
class Decision:
    """One check's outcome: the compression to apply and why (``hold|raise|lower|oom``)."""

    compression: float
    reason: str
    free: int
    threshold: int


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

    def observe(self, compression: float, peak_bytes: float) -> None:
        key = round(round(compression / self.resolution) * self.resolution, 6)
        old = self.points.get(key)
        self.points[key] = peak_bytes if old is None else old + self.smoothing * (peak_bytes - old)

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


def _bytes(threshold: float, total: int) -> int:
    return int(threshold * total) if threshold < 1 else int(threshold)


class CompressionController:
    """Maps memory readings to compressions (see the module docstring).

    Args:
        min_free: free memory to keep: bytes (``>= 1``) or a fraction of the total (``< 1``).
        release_free: free memory above which compression is given back; bytes or fraction,
            above ``min_free``. Default: ``min_free`` doubled.
        min_compression: lower bound, in ``[0, 1)``.
        max_compression: upper bound, in ``[min_compression, 1)``.
        raise_step: compression added per check under pressure when the model cannot say more.
        lower_step: compression removed per release while the memory model cannot predict.
        release_checks: consecutive checks above ``release_free`` before a release.
        cooldown_checks: checks after any change before a release.
        margin: extra fraction of the deficit to free when jumping with the model.

    Raises:
        ValueError: for thresholds or bounds out of order, or non-positive steps and counts.

    Example:
        >>> from lightning_bandlimit.memory.probes import MemoryReading
        >>> ctl = CompressionController(min_free=0.2, release_free=0.4, max_compression=0.8)
        >>> ctl.decide(MemoryReading(total=100, free=10, source="scripted"), 0.0)
        Decision(compression=0.2, reason='raise', free=10, threshold=20)
    """

    def __init__(
        self,
        min_free: float = 0.1,
        release_free: float | None = None,
        min_compression: float = 0.0,
        max_compression: float = 0.9,
        raise_step: float = 0.2,
        lower_step: float = 0.05,
        release_checks: int = 3,
        cooldown_checks: int = 2,
        margin: float = 0.1,
    ) -> None:
        if min_free <= 0:
            raise ValueError(f"min_free must be positive (bytes, or a fraction of the total), got {min_free}")
        release_free = 2 * min_free if release_free is None else release_free
        if (min_free < 1) != (release_free < 1) or release_free <= min_free:
            raise ValueError(
                "release_free must be above min_free and in the same unit (both fractions < 1 or "
                f"both bytes), got min_free={min_free}, release_free={release_free}"
            )
        min_compression, max_compression = (
            check_compression(min_compression),
            check_compression(max_compression),
        )
        if max_compression < min_compression:
            raise ValueError(
                f"max_compression ({max_compression}) is below min_compression ({min_compression})"
            )
        if raise_step <= 0 or lower_step <= 0 or release_checks < 1 or cooldown_checks < 0 or margin < 0:
            raise ValueError(
                "expected raise_step > 0, lower_step > 0, release_checks >= 1, cooldown_checks >= 0 "
                f"and margin >= 0, got {raise_step}, {lower_step}, {release_checks}, {cooldown_checks}, "
                f"{margin}"
            )
        self.min_free, self.release_free = min_free, release_free
        self.min_compression, self.max_compression = min_compression, max_compression
        self.raise_step, self.lower_step = raise_step, lower_step
        self.release_checks, self.cooldown_checks, self.margin = release_checks, cooldown_checks, margin
        self.model = MemoryModel()
        self._calm = 0  # consecutive checks at or above release_free
        self._since_change = cooldown_checks  # a first release needs no cooldown
        self.oom_floor = min_compression  # releases never go below a compression that ran out of memory
        self._expected_free: float | None = None  # free memory the last decision predicted

    def clamp(self, c: float) -> float:
        """``c`` within ``[min_compression, max_compression]``."""
        return min(self.max_compression, max(self.min_compression, round(c, 6)))

    def _least_fitting(self, current: float, must_free: float) -> float | None:
        """Least compression predicted to use ``must_free`` bytes less than ``current`` does."""
        now = self.model.predict(current)
        if now is None:
            return None
        steps = int(round((self.max_compression - self.min_compression) / 0.01))
        for i in range(steps + 1):
            c = self.min_compression + i * 0.01
            predicted = self.model.predict(c)
            if predicted is not None and now - predicted >= must_free:
                return self.clamp(c)
        return None

    def decide(self, reading: MemoryReading, current: float) -> Decision:
        """The compression for the next steps, given a reading taken at ``current``."""
        decision = self._decide(reading, current)
        self._expected_free = self._predicted_free(reading.free, current, decision.compression)
        return decision

    def _predicted_free(self, free: int, current: float, target: float) -> float | None:
        """Free memory expected at the next check if nothing else changes; ``None`` if unknown."""
        if target == current:
            return float(free)
        now, then = self.model.predict(current), self.model.predict(target)
        return None if now is None or then is None else free + now - then

    def _decide(self, reading: MemoryReading, current: float) -> Decision:
        low = _bytes(self.min_free, reading.total)
        high = _bytes(self.release_free, reading.total)
        self._since_change += 1
        # How far free memory fell short of what the previous decision expected: a co-tenant
        # still growing, or a memory model too optimistic. Under pressure it is freed as well,
        # so a steady ramp is met one check ahead rather than one check late.
        surprise = 0.0 if self._expected_free is None else max(0.0, self._expected_free - reading.free)
        if reading.free < low:
            self._calm = 0
            deficit = (low - reading.free + surprise) * (1 + self.margin)
            target = self._least_fitting(current, deficit)
            if target is None or target <= current:
                target = current + self.raise_step
            return self._change(self.clamp(max(target, current)), current, RAISE, reading.free, low)
        if reading.free < high:
            self._calm = 0
            return Decision(current, HOLD, reading.free, low)
        self._calm += 1
        floor = max(self.min_compression, self.oom_floor)
        if self._calm < self.release_checks or self._since_change <= self.cooldown_checks or current <= floor:
            return Decision(current, HOLD, reading.free, high)
        spare = reading.free - high
        fitting = self._least_fitting(current, -spare)  # least c whose extra memory fits the spare
        target = max(current - self.lower_step if fitting is None else fitting, floor)
        return self._change(self.clamp(min(target, current)), current, LOWER, reading.free, high)

    def notify_change(self) -> None:
        """Restart the cooldown: a change this controller did not decide was applied (e.g. one
        another rank asked for, or an out-of-memory retry), so its last prediction no longer holds."""
        self._since_change = 0
        self._calm = 0
        self._expected_free = None

    def on_oom(self, current: float) -> float:
        """The compression to retry an out-of-memory step with; releases never go below it again."""
        self.notify_change()
        retry = self.clamp(current + self.raise_step)
        self.oom_floor = max(self.oom_floor, retry)
        return retry

    def _change(self, target: float, current: float, reason: str, free: int, threshold: int) -> Decision:
        if target == current:
            return Decision(current, HOLD, free, threshold)
        self._since_change = 0
        self._calm = 0
        return Decision(target, reason, free, threshold)

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "calm": self._calm,
            "since_change": self._since_change,
            "oom_floor": self.oom_floor,
            "expected_free": self._expected_free,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state.get("model", {}))
        self._calm = int(state.get("calm", 0))
        self._since_change = int(state.get("since_change", self.cooldown_checks))
        self.oom_floor = float(state.get("oom_floor", self.min_compression))
        expected = state.get("expected_free")
        self._expected_free = None if expected is None else float(expected)
