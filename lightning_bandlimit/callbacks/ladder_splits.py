"""The micro-batch lever of :class:`~lightning_bandlimit.callbacks.AdaptiveBandLimit`
(:class:`SplitLever`): the strategy's ``training_step`` run in chunks at the split the ladder
chooses (:class:`~lightning_bandlimit.microbatch.SplitStep`), tried once before the ladder may use
it (:func:`~lightning_bandlimit.microbatch.split_trial`, on the first training batch), and what
is said of it."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from lightning_bandlimit.microbatch import SplitStep, batch_size, split_batch, split_trial

__all__ = ["TRIAL_SAMPLES", "SplitLever", "ladder_splits"]

# The trial's batch: the first samples of the first training batch, at most this many (the
# equality it checks holds at any size; a small batch keeps its memory and time small).
TRIAL_SAMPLES = 32


def ladder_splits(max_split: int, size: int) -> tuple[int, ...]:
    """The splits the ladder climbs: 2, 4, 8, ... up to ``max_split`` and the batch's ``size``.

    Example:
        >>> ladder_splits(8, 128), ladder_splits(8, 5), ladder_splits(1, 128)
        ((2, 4, 8), (2, 4), ())
    """
    splits, split = [], 2
    while split <= min(max_split, size):
        splits.append(split)
        split *= 2
    return tuple(splits)


class SplitLever:
    """A job's micro-batch lever: its split, its trial, its messages.

    Args:
        max_split: the most chunks a step's batch is run in.
        name: the name messages start with.

    Example:
        >>> lever = SplitLever(max_split=8)
        >>> lever.split, lever.tried
        (1, False)
    """

    def __init__(self, max_split: int, name: str = "AdaptiveBandLimit") -> None:
        self.max_split = max_split
        self.name = name
        self.step = SplitStep(name)
        self.tried = False
        self._batch: Any = None
        self._batch_idx = 0

    @property
    def split(self) -> int:
        """The chunks a step's batch runs in (``1``: whole)."""
        return self.step.split

    @split.setter
    def split(self, split: int) -> None:
        self.step.split = split

    @property
    def in_chunk(self) -> bool:
        """Whether a chunk before a step's last is being back-propagated."""
        return self.step.in_chunk

    def install(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Wrap the strategy's ``training_step`` (at split 1 it runs as it comes)."""
        self.step.install(trainer, pl_module)

    def start_step(self, batch: Any, batch_idx: int) -> None:
        """A training batch starts; the first one is kept for the trial."""
        self.step.start_step(batch_idx)
        if not self.tried:
            self._batch, self._batch_idx = batch, batch_idx

    def end_step(self) -> None:
        """A training batch ended."""
        self.step.end_step()

    def try_splits(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> tuple[int, ...] | None:
        """Once, after the first training batch: the splits the ladder may use, tried on that
        batch's first samples (``()``: none, said once with why); ``None`` once tried."""
        if self.tried:
            return None
        self.tried = True
        batch, self._batch = self._batch, None
        if not pl_module.automatic_optimization:
            rank_zero_info(f"{self.name}: the micro-batch lever needs automatic optimization; it is off")
            return ()
        size = None if batch is None else batch_size(batch)
        if size is None or size < 2:
            rank_zero_info(
                f"{self.name}: the micro-batch lever is off: the first batch has {size or 0} samples "
                "(a split needs at least 2)"
            )
            return ()
        sample = split_batch(batch, -(-size // TRIAL_SAMPLES))[0][0]
        context = trainer.precision_plugin.train_step_context
        result = split_trial(pl_module, sample, self._batch_idx, split=2, context=context)
        if not result.exact:
            rank_zero_warn(f"{self.name}: the micro-batch lever leaves the ladder: {result.reason}")
            return ()
        # BatchNorm needs two samples a chunk (one has no variance: its statistics would be NaN)
        self.step.min_chunk = 1 if result.batch_norm_difference is None else 2
        splits = ladder_splits(self.max_split, size // self.step.min_chunk)
        if not splits:
            rank_zero_info(
                f"{self.name}: the micro-batch lever is off: a batch of {size} cannot be split in chunks of 2"
            )
            return ()
        shown = min(size, TRIAL_SAMPLES)
        message = (
            f"{self.name}: micro-batch splits {list(splits)} on the top rung, tried on {shown} samples: the "
            f"split gradient is the whole batch's to {result.difference:.1e} (tolerance "
            f"{result.tolerance:.0e}, BatchNorm at its running statistics)"
        )
        if result.batch_norm_difference is not None:
            message += (
                "; BatchNorm normalises each chunk by its own statistics (ghost batches): in training "
                f"mode the split gradient differs by {result.batch_norm_difference:.1e} relative"
            )
        rank_zero_info(message)
        return splits

    def remove(self) -> None:
        """The strategy's own ``training_step`` again."""
        self.step.remove()
        self._batch = None
