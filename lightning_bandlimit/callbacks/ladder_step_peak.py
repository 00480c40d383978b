"""The job's peak on a check's step, metered where the probe does not measure the job itself
(:class:`StepPeak`): on a GPU from the allocator's peak statistics, else from the bytes the step
saves for backward; :func:`~lightning_bandlimit.callbacks.ladder_reading.read_job` reads it.
"""

from __future__ import annotations

from typing import Any

import torch

from lightning_bandlimit.recompute.saved_tensors import SavedTensorMeter

__all__ = ["StepPeak"]


class StepPeak:
    """The job's peak on a check's step where the probe does not measure the job itself: on a
    GPU ``torch.cuda.max_memory_allocated`` from the step's start (read by :func:`~.ladder_reading.read_job`),
    with ``torch.cuda.memory_allocated`` at the start as what the job held then, else the bytes
    the step saved for backward, from its start to its backward (an increment already).

    Attributes:
        bytes: the last metered peak (also what a profiling step measured); ``None``: none.
        base: on a GPU, the bytes allocated at the metered step's start; ``None``: not metered.

    Example:
        >>> import torch
        >>> peak = StepPeak()
        >>> peak.start(torch.device("cpu"), exclude=())
        >>> x = torch.ones(256, requires_grad=True)
        >>> y = (x * x).sum()  # saves x for backward (counted once): 1 KiB
        >>> peak.stop(); peak.bytes
        1024
    """

    def __init__(self) -> None:
        self.bytes: int | None = None
        self.base: int | None = None
        self._meter: SavedTensorMeter | None = None

    def start(self, device: torch.device | None, exclude: Any) -> None:
        """Meter the step starting now (``exclude``: tensors not counted, e.g. the parameters)."""
        if device is not None and device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            self.base = int(torch.cuda.memory_allocated(device))
        else:
            self._meter = SavedTensorMeter(exclude=exclude).__enter__()

    def stop(self, profiled: int | None = None) -> None:
        """Stop metering (before the step's backward, or at its end); ``profiled``: the peak a
        profiling step measured, taken as the step's."""
        if profiled is not None:
            self.bytes = profiled
        if self._meter is not None:
            self._meter.__exit__(None, None, None)
            self.bytes, self._meter = self._meter.bytes, None
