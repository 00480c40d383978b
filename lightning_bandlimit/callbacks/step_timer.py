"""``StepTimer``: wall time of training steps, logged and kept for summaries."""

from __future__ import annotations

import statistics
import time
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from lightning_bandlimit.utils.validation import check_int

__all__ = ["StepTimer"]


class StepTimer(Callback):
    """Measure each training batch (forward, backward, optimizer step) with ``perf_counter``.

    Logs ``StepTimer/step_ms``; :attr:`median_ms` summarises the run, skipping the first
    ``warmup`` steps (caches, allocator, lazily rendered data).

    Args:
        warmup: steps left out of :attr:`median_ms`.

    Raises:
        ValueError: if ``warmup`` is negative.

    Example:
        >>> timer = StepTimer(warmup=0)
        >>> timer.median_ms is None
        True
    """

    def __init__(self, warmup: int = 5) -> None:
        super().__init__()
        self.warmup = check_int("warmup", warmup, minimum=0)
        self.durations_ms: list[float] = []
        self._started: float | None = None

    @property
    def median_ms(self) -> float | None:
        """Median step time after warm-up (all steps if there were no more); ``None`` before any."""
        kept = self.durations_ms[self.warmup :] or self.durations_ms
        return statistics.median(kept) if kept else None

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._started = time.perf_counter()

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._started is None:
            return
        elapsed = (time.perf_counter() - self._started) * 1e3
        self.durations_ms.append(elapsed)
        pl_module.log("StepTimer/step_ms", elapsed, on_step=True, on_epoch=False)
