"""An LR factor for one optimizer step, known only once the step's backward ran.

Two things scale an elastic step's LR on top of its schedule: the re-warmup ramp after a resize
(:class:`~lightning_bandlimit.strategies.elastic_resize.Rewarm`) and AdaScale's gain, measured
from the step's own gradients (so after the backward). :class:`StepLRFactor` multiplies every
parameter group's LR by the factor after the optimizer's closure (forward and backward) ran,
right before the update, and puts the scheduled LRs back once the step is over, even if it
failed: schedulers and checkpoints only ever see the schedule's LRs.

Plain Python over an optimizer's ``param_groups`` (a list of dicts with ``"lr"``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any

__all__ = ["StepLRFactor"]


class StepLRFactor:
    """Scale the LRs of one optimizer step by ``factor()``, asked after the closure ran.

    Use it as a ``with`` block around the optimizer's step, passing the step
    :meth:`after` ``(closure)``; the LRs the groups had on entry are back on exit.

    Args:
        param_groups: the optimizer's parameter groups.
        factor: called once, right after the closure: the multiplier (1 leaves the LRs alone).

    Example:
        >>> groups = [{"lr": 0.1}, {"lr": 0.02}]
        >>> seen = []
        >>> def optimizer_step(closure):  # what an optimizer does: the closure, then the update
        ...     closure()
        ...     seen.append([g["lr"] for g in groups])
        >>> with StepLRFactor(groups, lambda: 0.5) as scaled:
        ...     optimizer_step(scaled.after(lambda: None))
        >>> seen, [g["lr"] for g in groups]
        ([[0.05, 0.01]], [0.1, 0.02])
    """

    def __init__(self, param_groups: Sequence[dict[str, Any]], factor: Callable[[], float]) -> None:
        self.param_groups = param_groups
        self.factor = factor
        self._scheduled = [group["lr"] for group in param_groups]

    def after(self, closure: Callable[[], Any]) -> Callable[[], Any]:
        """``closure`` followed by the scaling of every group's LR by ``factor()``."""

        def scaled() -> Any:
            result = closure()
            factor = self.factor()
            if factor != 1.0:
                for group in self.param_groups:
                    group["lr"] = group["lr"] * factor
            return result

        return scaled

    def __enter__(self) -> StepLRFactor:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        for group, lr in zip(self.param_groups, self._scheduled):
            group["lr"] = lr
