"""Learning-rate schedules driven by samples seen, not by optimizer steps.

A step-based schedule (``CosineAnnealingLR(T_max=steps)``) is planned for one global batch:
when an elastic restart changes the world size, the same number of steps covers a different
number of samples and the LR jumps off its curve. :class:`SampleSchedule` reads its position
from a progress counter (samples seen, or any other monotone measure such as AdaScale's
scale-invariant progress), so a resize only changes how fast the curve is travelled, never
where on it the run is.

* :func:`lr_multiplier`: the curve itself, a pure function of progress.
* :class:`SampleSchedule`: an ``LRScheduler`` whose progress is moved with
  :meth:`~SampleSchedule.advance`; ``step()`` (as Lightning calls it) only re-applies it.
* :func:`rescale_base_lrs`: move a scheduler onto a rescaled curve when a scaling rule changes
  the LR at a resize.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from lightning_bandlimit.strategies._lightning import set_scheduler_last_lr
from lightning_bandlimit.utils.validation import check_choice, check_real

__all__ = ["KINDS", "SampleSchedule", "lr_multiplier", "rescale_base_lrs"]

KINDS = ("cosine", "linear", "constant")


def _check_schedule(total: float, warmup: float, kind: str, min_lr_ratio: float) -> None:
    check_real("total_samples", total, minimum=0, min_open=True)
    check_real("warmup_samples", warmup, minimum=0)
    if warmup > total:
        raise ValueError(f"warmup_samples must be <= total_samples={total}, got {warmup}")
    check_choice("kind", kind, KINDS)
    check_real("min_lr_ratio", min_lr_ratio, minimum=0, maximum=1)


def _check_progress(name: str, value: float) -> float:
    return check_real(name, float(value), minimum=0)  # float(): tensors and NumPy scalars too


def lr_multiplier(
    progress: float,
    total: float,
    warmup: float = 0.0,
    kind: str = "cosine",
    min_lr_ratio: float = 0.0,
) -> float:
    """The LR, as a fraction of the base LR, after ``progress`` samples.

    * ``progress < warmup``: linear warmup, ``progress / warmup`` (0 at the start).
    * then, with ``t = (progress - warmup) / (total - warmup)`` clipped to ``[0, 1]``:
      ``"cosine"``: ``m + (1 - m) (1 + cos(pi t)) / 2``; ``"linear"``: ``m + (1 - m)(1 - t)``;
      ``"constant"``: ``1`` (``min_lr_ratio`` unused); where ``m = min_lr_ratio``.
    * from ``total`` on: flat (``m`` for cosine and linear). With ``warmup == total`` there is
      no decay phase: the LR drops from 1 to ``m`` at ``total``.

    Args:
        progress: samples seen (any non-negative float).
        total: samples at which the decay ends, ``> 0``.
        warmup: samples of linear warmup, in ``[0, total]``.
        kind: ``"cosine"``, ``"linear"`` or ``"constant"``.
        min_lr_ratio: final LR as a fraction of the base LR, in ``[0, 1]``.

    Returns:
        The multiplier, in ``[0, 1]``.

    Raises:
        ValueError: for ``progress < 0``, ``total <= 0``, ``warmup`` outside ``[0, total]``, an
            unknown ``kind`` or ``min_lr_ratio`` outside ``[0, 1]``.

    Example:
        >>> lr_multiplier(50, total=1000, warmup=100)
        0.5
        >>> lr_multiplier(550, total=1000, warmup=100)  # half-way through the cosine
        0.5
        >>> round(lr_multiplier(550, total=1000, warmup=100, kind="linear", min_lr_ratio=0.2), 6)
        0.6
        >>> lr_multiplier(5000, total=1000, warmup=100, min_lr_ratio=0.1)
        0.1
    """
    _check_schedule(total, warmup, kind, min_lr_ratio)
    progress = _check_progress("progress", progress)
    if progress < warmup:
        return progress / warmup
    if kind == "constant":
        return 1.0
    decay = total - warmup
    t = 1.0 if decay == 0 or progress >= total else (progress - warmup) / decay
    if kind == "cosine":
        shape = 0.5 * (1.0 + math.cos(math.pi * t))
    else:
        shape = 1.0 - t
    return min_lr_ratio + (1.0 - min_lr_ratio) * shape


class SampleSchedule(LRScheduler):
    """An LR schedule whose position is the number of samples seen.

    Each group's LR is ``base_lr * lr_multiplier(progress, total_samples, warmup_samples,
    kind, min_lr_ratio)``. :meth:`advance` (or :meth:`set_progress`) moves the progress *and*
    applies the new LRs at once, so the order relative to ``step()`` does not matter;
    ``step()`` (no arguments, as Lightning calls it) recomputes the LRs from the current progress
    without moving it. Call ``advance(samples_in_the_global_step)`` after each optimizer step:
    the next step then uses the LR at the samples seen so far, whatever the global batch.

    :attr:`progress` is a plain attribute, so the inherited :meth:`state_dict` saves it with
    ``base_lrs`` (and the schedule's parameters); loading restores all of them, overriding the
    values this instance was constructed with.

    Args:
        optimizer: the wrapped optimizer; its groups' ``lr`` are the base LRs.
        total_samples: samples at which the decay ends, ``> 0``.
        warmup_samples: samples of linear warmup from 0, in ``[0, total_samples]``.
        kind: ``"cosine"``, ``"linear"`` or ``"constant"`` (see :func:`lr_multiplier`).
        min_lr_ratio: final LR as a fraction of the base LR, in ``[0, 1]``.
        last_epoch: as for any ``LRScheduler`` (``-1`` for a new run); it counts ``step()``
            calls and does not affect the LR.

    Raises:
        ValueError: for ``total_samples <= 0``, ``warmup_samples`` outside
            ``[0, total_samples]``, an unknown ``kind`` or ``min_lr_ratio`` outside ``[0, 1]``.

    Example:
        >>> opt = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)
        >>> sched = SampleSchedule(opt, total_samples=1000, warmup_samples=100)
        >>> opt.param_groups[0]["lr"]
        0.0
        >>> sched.advance(50)  # half the warmup
        >>> round(opt.param_groups[0]["lr"], 6), sched.fraction
        (0.05, 0.05)
        >>> sched.set_progress(550)  # half-way through the cosine
        >>> round(opt.param_groups[0]["lr"], 6)
        0.05
    """

    def __init__(
        self,
        optimizer: Optimizer,
        total_samples: int,
        warmup_samples: int = 0,
        kind: str = "cosine",
        min_lr_ratio: float = 0.0,
        last_epoch: int = -1,
    ) -> None:
        _check_schedule(total_samples, warmup_samples, kind, min_lr_ratio)
        self.total_samples = total_samples
        self.warmup_samples = warmup_samples
        self.kind = kind
        self.min_lr_ratio = float(min_lr_ratio)
        self.progress = 0.0
        super().__init__(optimizer, last_epoch)

    @property
    def fraction(self) -> float:
        """``progress / total_samples`` (above 1 once the schedule has ended)."""
        return self.progress / self.total_samples

    def multiplier(self) -> float:
        """:func:`lr_multiplier` at the current progress."""
        return lr_multiplier(
            self.progress, self.total_samples, self.warmup_samples, self.kind, self.min_lr_ratio
        )

    def get_lr(self) -> list[Any]:
        """Each group's LR at the current progress: ``base_lr * multiplier()``."""
        factor = self.multiplier()
        return [base * factor for base in self.base_lrs]

    _get_closed_form_lr = get_lr

    def advance(self, samples: float) -> None:
        """Add ``samples`` (a float: fractional progress such as AdaScale's is fine) and apply the LRs.

        Args:
            samples: progress to add, finite and ``>= 0``.

        Raises:
            ValueError: if ``samples`` is negative or not finite.
        """
        self.progress += _check_progress("samples", samples)
        self._apply()

    def set_progress(self, samples: float) -> None:
        """Set the progress to ``samples`` and apply the LRs.

        Args:
            samples: samples seen, finite and ``>= 0``.

        Raises:
            ValueError: if ``samples`` is negative or not finite.
        """
        self.progress = _check_progress("samples", samples)
        self._apply()

    def _apply(self) -> None:
        """Write :meth:`get_lr` into the optimizer's groups without counting a ``step()``."""
        for group, lr in zip(self.optimizer.param_groups, self.get_lr(), strict=True):
            _set_lr(group, lr)
        set_scheduler_last_lr(self, _current_lrs(self.optimizer))


def _set_lr(group: dict[str, Any], lr: Any, key: str = "lr") -> None:
    if isinstance(group[key], torch.Tensor):
        group[key].fill_(float(lr))
    else:
        group[key] = lr


def _current_lrs(optimizer: Optimizer) -> list[Any]:
    return [g["lr"].clone() if isinstance(g["lr"], torch.Tensor) else g["lr"] for g in optimizer.param_groups]


def rescale_base_lrs(scheduler: LRScheduler, factor: float, *, groups: bool = True) -> None:
    """Multiply every group's base LR, ``initial_lr`` and current LR by ``factor``.

    For a scheduler that computes its LRs from ``base_lrs`` in closed form (such as
    :class:`SampleSchedule`), the schedule then continues on the same curve scaled by
    ``factor``: use it when a scaling rule changes the LR at a resize. (Recursive schedulers,
    which update the current LR multiplicatively, follow only approximately.)

    Args:
        scheduler: the scheduler whose optimizer's groups are rescaled.
        factor: the scale, finite and ``> 0``.
        groups: also rescale the optimizer's groups (``lr``, ``initial_lr``); ``False`` for a
            second scheduler of an optimizer whose groups were rescaled already.

    Raises:
        ValueError: if ``factor`` is not finite and positive.

    Example:
        >>> opt = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)
        >>> sched = SampleSchedule(opt, total_samples=100, kind="linear")
        >>> sched.advance(50); rescale_base_lrs(sched, 2.0)
        >>> round(sched.base_lrs[0], 6), round(opt.param_groups[0]["lr"], 6)
        (0.2, 0.1)
    """
    factor = check_real("factor", float(factor), minimum=0, min_open=True)
    scheduler.base_lrs = [base * factor for base in scheduler.base_lrs]
    if groups:
        for group in scheduler.optimizer.param_groups:
            _set_lr(group, group["lr"] * factor)
            if "initial_lr" in group:
                _set_lr(group, group["initial_lr"] * factor, key="initial_lr")
    set_scheduler_last_lr(scheduler, _current_lrs(scheduler.optimizer))
