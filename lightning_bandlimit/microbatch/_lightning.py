"""The one place the micro-batch lever touches private Lightning state: the logged values' batch
(``trainer._results``), so that ``self.log`` in a chunk's ``training_step`` counts the chunk's
samples. Without that state (another Lightning) it does nothing, and a chunk's logged value is
weighted as the whole batch's (an epoch mean then off by the chunks' unequal sizes only)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import lightning.pytorch as pl

__all__ = ["logged_per_chunk"]


@contextlib.contextmanager
def logged_per_chunk(trainer: pl.Trainer) -> Iterator[Callable[[Any], None]]:
    """``self.log`` in a chunk's ``training_step`` weighs by the chunk's batch size (Lightning
    takes it from the batch the step started with: the whole batch's); the whole batch again
    afterwards."""
    results = getattr(trainer, "_results", None)  # the step's logged values (private Lightning state)
    if results is None or not hasattr(results, "batch"):
        yield lambda part: None
        return

    whole, whole_size = results.batch, results.batch_size

    def chunk(part: Any) -> None:
        results.batch, results.batch_size = part, None

    try:
        yield chunk
    finally:
        results.batch, results.batch_size = whole, whole_size
