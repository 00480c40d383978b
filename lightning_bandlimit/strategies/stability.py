"""``StabilityGuard``: "adjust, then evaluate the effect" for a resize.

After a resize the new hyperparameters are on probation for ``window`` optimizer steps. The
guard compares the training loss with its trend before the resize (the last ``history`` losses,
saved in the checkpoint, so the trend survives the restart) and calls the adjustment bad when

* a loss is not finite, or
* the median of the last ``patience`` losses exceeds both ``tolerance`` x the pre-resize median
  and that median plus ``spread`` robust standard deviations (1.4826 x the median absolute
  deviation) of the pre-resize losses, so the noise of small-batch losses does not trip it.

The guard only decides; :class:`~lightning_bandlimit.strategies.ElasticDDPStrategy` agrees on the
decision across ranks, rolls the model and optimizer back to the state they had at the resize,
and retries the rule with a damped factor (``k ** damping``, ``damping`` halved per retry). After
``max_retries`` failed retries it keeps the reference hyperparameters unscaled (damping 0).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterable
from typing import Any

from lightning_bandlimit.utils.validation import check_int, check_real

__all__ = ["StabilityGuard"]


class StabilityGuard:
    """Watch the loss after a resize and decide whether the adjustment diverged.

    Args:
        window: optimizer steps a new adjustment stays on probation.
        history: pre-resize losses kept as the trend.
        patience: losses whose median is compared with the trend (the first ``patience - 1``
            steps after a resize only trip on non-finite losses).
        tolerance: allowed factor between the post- and pre-resize median loss, ``> 1``.
        spread: allowed distance from the pre-resize median, in robust standard deviations of
            the pre-resize losses, ``>= 0``.
        max_retries: damped retries before falling back to unscaled hyperparameters.
        damping_factor: multiplies the damping at each retry, in ``(0, 1)``.

    Raises:
        ValueError: if an argument is out of range.

    Example:
        >>> guard = StabilityGuard(window=4, patience=2, tolerance=2.0)
        >>> [guard.record(loss) for loss in [1.0, 0.9, 0.8]]  # the trend before the resize
        ['idle', 'idle', 'idle']
        >>> guard.start()
        >>> [guard.record(loss) for loss in [0.85, 1.0, 4.0]]
        ['watching', 'watching', 'diverged']
        >>> guard.start(); [guard.record(loss) for loss in [0.7, 0.7, 0.6, 0.6]]
        ['watching', 'watching', 'watching', 'stable']
    """

    def __init__(
        self,
        window: int = 20,
        history: int = 50,
        patience: int = 5,
        tolerance: float = 1.5,
        spread: float = 4.0,
        max_retries: int = 2,
        damping_factor: float = 0.5,
    ) -> None:
        check_int("window", window, minimum=1)
        check_int("history", history, minimum=1)
        check_int("patience", patience, minimum=1)
        if patience > window:
            raise ValueError(f"patience must be <= window={window}, got {patience}")
        check_real("tolerance", tolerance, minimum=1, min_open=True)
        self.spread = check_real("spread", spread, minimum=0)
        check_int("max_retries", max_retries, minimum=0)
        check_real("damping_factor", damping_factor, minimum=0, maximum=1, min_open=True, max_open=True)
        self.window, self.patience, self.tolerance = window, patience, float(tolerance)
        self.max_retries, self.damping_factor = max_retries, float(damping_factor)
        self.trend: deque[float] = deque(maxlen=history)
        self._watched: list[float] | None = None
        self._limit: float | None = None  # the median loss above which an adjustment diverged

    @property
    def watching(self) -> bool:
        """Whether an adjustment is on probation."""
        return self._watched is not None

    def start(self) -> None:
        """Put a new adjustment on probation against the current trend."""
        finite = [x for x in self.trend if math.isfinite(x)]
        if finite:
            median = statistics.median(finite)
            sigma = 1.4826 * statistics.median(abs(x - median) for x in finite)
            self._limit = max(self.tolerance * median, median + self.spread * sigma) + 1e-3
        else:
            self._limit = None
        self._watched = []

    def stop(self) -> None:
        """End the probation without a verdict."""
        self._watched = None

    def record(self, loss: float) -> str:
        """Add one step's loss; returns ``"idle"``, ``"watching"``, ``"stable"`` or ``"diverged"``.

        Outside a probation the loss extends the trend. On ``"stable"`` the probation ends and the
        watched losses join the trend; on ``"diverged"`` it ends and they are dropped.
        """
        loss = float(loss)
        if self._watched is None:
            self.trend.append(loss)
            return "idle"
        self._watched.append(loss)
        if self._diverged():
            self._watched = None
            return "diverged"
        if len(self._watched) >= self.window:
            self.trend.extend(self._watched)
            self._watched = None
            return "stable"
        return "watching"

    def _diverged(self) -> bool:
        assert self._watched is not None
        if not math.isfinite(self._watched[-1]):
            return True
        if self._limit is None or len(self._watched) < self.patience:
            return False
        return statistics.median(self._watched[-self.patience :]) > self._limit

    def damping(self, retry: int) -> float:
        """The damping of retry number ``retry`` (0: the rule as is); 0 after ``max_retries``."""
        return 0.0 if retry > self.max_retries else self.damping_factor**retry

    def state_dict(self) -> dict[str, Any]:
        """The trend, as plain floats."""
        return {"trend": list(self.trend)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the trend saved by :meth:`state_dict`."""
        self.trend.clear()
        self.trend.extend(_floats(state.get("trend", [])))

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(window={self.window}, patience={self.patience}, "
            f"tolerance={self.tolerance}, max_retries={self.max_retries})"
        )


def _floats(values: Iterable[Any]) -> list[float]:
    return [float(v) for v in values]
