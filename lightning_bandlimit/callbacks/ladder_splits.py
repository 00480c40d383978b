"""The micro-batch lever of :class:`~lightning_bandlimit.callbacks.AdaptiveBandLimit`
(:class:`SplitLever`): the strategy's ``training_step`` run in chunks at the split the ladder
chooses (:class:`~lightning_bandlimit.microbatch.SplitStep`), tried once before the ladder may use
it (:func:`~lightning_bandlimit.microbatch.split_trial`, on the first training batch), and what
is said of it.

A split is exact when the trial finds the whole batch's gradient in training mode; with
BatchNorm each chunk is normalised by its own statistics (ghost batches), and the split is
allowed, as a ghost-batch split, only for chunks of at least ``ghost_batch`` samples
(:data:`GHOST_BATCH` by default: ghost batches of 32 or more are a known, usually benign regime,
Hoffer et al. 2017; below 8-16 samples BatchNorm's error grows fast, Wu and He 2018).

The trial's outcome (:class:`SplitOutcome`: the splits it allows, or none and why) is part of the
callback's checkpoint, so a resumed job does not try again (on a batch of another point of the
run) and keeps the lever as it was; a restored split is reconciled with it
(:meth:`SplitLever.restore_split`, :func:`clamp_split`) as a restored rung is clamped to the top.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from lightning_bandlimit.ladder.splits import check_splits
from lightning_bandlimit.microbatch import SplitStep, batch_size, split_batch, split_trial
from lightning_bandlimit.utils.validation import check_int

__all__ = ["GHOST_BATCH", "TRIAL_SAMPLES", "SplitLever", "SplitOutcome", "clamp_split", "ladder_splits"]

# The trial's batch: the first samples of the first training batch, at most this many (the
# equality it checks holds at any size; a small batch keeps its memory and time small).
TRIAL_SAMPLES = 32
#: the fewest samples a chunk of a ghost-batch split (a model with BatchNorm in training mode) keeps
GHOST_BATCH = 32


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


def clamp_split(split: int, allowed: tuple[int, ...]) -> int:
    """``split`` if ``allowed`` has it, else the largest allowed split below it, else ``1``.

    Example:
        >>> clamp_split(4, (2, 4, 8)), clamp_split(6, (2, 4, 8)), clamp_split(2, ()), clamp_split(1, (2,))
        (4, 4, 1, 1)
    """
    return max((s for s in allowed if s <= split), default=1)


@dataclass(frozen=True)
class SplitOutcome:
    """What the micro-batch lever's trial found (:meth:`SplitLever.try_splits`).

    Attributes:
        splits: the splits the ladder may use (ascending; ``()``: none, the lever is off).
        min_chunk: the fewest samples a chunk may have (``ghost_batch`` with BatchNorm: each
            chunk is normalised by its own statistics).
        reason: why the lever is off (``None`` when it has splits).
        ghost: whether the splits are ghost-batch splits (approximate: BatchNorm in training
            mode) rather than exact ones.

    Example:
        >>> trial = SplitOutcome((2, 4), min_chunk=32, ghost=True)
        >>> SplitOutcome.from_state(trial.state_dict()) == trial
        True
    """

    splits: tuple[int, ...]
    min_chunk: int = 1
    reason: str | None = None
    ghost: bool = False

    def state_dict(self) -> dict[str, Any]:
        """The outcome as plain values."""
        return {
            "splits": list(self.splits),
            "min_chunk": self.min_chunk,
            "reason": self.reason,
            "ghost": self.ghost,
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> SplitOutcome:
        """The outcome :meth:`state_dict` saved.

        Raises:
            TypeError: for splits or a chunk size that are not ints, a reason that is not a string,
                a ghost flag that is not a bool.
            ValueError: for a split below 2 or a chunk size below 1.
        """
        reason = state.get("reason")
        if reason is not None and not isinstance(reason, str):
            raise TypeError(f"a split trial's reason must be a string or None, got {reason!r}")
        ghost = state.get("ghost", False)
        if not isinstance(ghost, bool):
            raise TypeError(f"a split trial's ghost flag must be a bool, got {ghost!r}")
        splits = check_splits(state.get("splits", ()))
        min_chunk = check_int("min_chunk", state.get("min_chunk", 1), minimum=1)
        return cls(splits, min_chunk, reason, ghost)


class SplitLever:
    """A job's micro-batch lever: its split, its trial, its messages.

    Args:
        max_split: the most chunks a step's batch is run in.
        ghost_batch: the fewest samples a chunk of a ghost-batch split keeps (a model whose
            BatchNorm layers normalise each chunk by its own statistics).
        name: the name messages start with.

    Attributes:
        outcome: what the trial found (``None``: not tried yet).

    Example:
        >>> lever = SplitLever(max_split=8)
        >>> lever.split, lever.tried
        (1, False)
        >>> saved = {"tried": True, "splits": [2, 4], "min_chunk": 2, "reason": None, "ghost": False}
        >>> lever.load_state_dict(saved)
        >>> lever.tried, lever.outcome.splits, lever.restore_split(4)
        (True, (2, 4), 4)
    """

    def __init__(
        self, max_split: int, ghost_batch: int = GHOST_BATCH, name: str = "AdaptiveBandLimit"
    ) -> None:
        self.max_split = max_split
        self.ghost_batch = ghost_batch
        self.name = name
        self.step = SplitStep(name)
        self.outcome: SplitOutcome | None = None
        self._batch: Any = None
        self._batch_idx = 0

    @property
    def tried(self) -> bool:
        """Whether the trial ran (in this fit, an earlier one, or the run a checkpoint saved)."""
        return self.outcome is not None

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
        batch, self._batch = self._batch, None
        self.outcome = self._trial(trainer, pl_module, batch)
        self.step.min_chunk = self.outcome.min_chunk
        return self.outcome.splits

    def _trial(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any) -> SplitOutcome:
        if not pl_module.automatic_optimization:
            reason = "the micro-batch lever needs automatic optimization"
            rank_zero_info(f"{self.name}: {reason}; it is off")
            return SplitOutcome((), reason=reason)
        size = None if batch is None else batch_size(batch)
        if size is None or size < 2:
            reason = f"the first batch has {size or 0} samples (a split needs at least 2)"
            rank_zero_info(f"{self.name}: the micro-batch lever is off: {reason}")
            return SplitOutcome((), reason=reason)
        sample = split_batch(batch, -(-size // TRIAL_SAMPLES))[0][0]
        context = trainer.precision_plugin.train_step_context
        result = split_trial(pl_module, sample, self._batch_idx, split=2, context=context)
        if not result.exact:
            rank_zero_warn(f"{self.name}: the micro-batch lever leaves the ladder: {result.reason}")
            return SplitOutcome((), reason=result.reason)
        shown = min(size, TRIAL_SAMPLES)
        if not result.ghost:
            # BatchNorm exact in training mode (e.g. its chunks' statistics agree to round-off)
            # still needs two samples a chunk: one has no variance
            min_chunk = 1 if result.batch_norm_difference is None else 2
            splits = ladder_splits(self.max_split, size // min_chunk)
            if not splits:
                reason = f"a batch of {size} cannot be split in chunks of {min_chunk}"
                rank_zero_info(f"{self.name}: the micro-batch lever is off: {reason}")
                return SplitOutcome((), min_chunk, reason)
            difference = max(result.difference, result.batch_norm_difference or 0.0)
            rank_zero_info(
                f"{self.name}: micro-batch splits {list(splits)} on the top rung, exact: tried on {shown} "
                f"samples in training mode, the split gradient is the whole batch's to {difference:.1e} "
                f"(tolerance {result.tolerance:.0e})"
            )
            return SplitOutcome(splits, min_chunk)
        ghost = (
            f"BatchNorm normalises each chunk by its own statistics (ghost batches): tried on {shown} "
            f"samples in training mode, the split gradient differs from the whole batch's by "
            f"{result.batch_norm_difference:.1e} relative"
        )
        splits = ladder_splits(self.max_split, size // self.ghost_batch)
        if not splits:
            reason = (
                f"{ghost}; a ghost-batch split keeps at least ghost_batch={self.ghost_batch} samples a "
                f"chunk, and a batch of {size} has no such split (a smaller ghost_batch allows one)"
            )
            rank_zero_info(f"{self.name}: the micro-batch lever is off: {reason}")
            return SplitOutcome((), self.ghost_batch, reason, ghost=True)
        rank_zero_info(
            f"{self.name}: micro-batch splits {list(splits)} on the top rung, ghost batches of at least "
            f"{self.ghost_batch} samples (approximate, not exact): {ghost}"
        )
        return SplitOutcome(splits, self.ghost_batch, ghost=True)

    def ladder(self, splits: tuple[int, ...]) -> tuple[int, ...]:
        """Of ``splits`` (a controller's), those the trial allows (all of them before it ran)."""
        return splits if self.outcome is None else tuple(s for s in splits if s in self.outcome.splits)

    def restore_split(self, split: int) -> int:
        """The split to run at for ``split`` (restored from a checkpoint, or applied when the
        trial ran): as it is when the trial allows it or has not run (it is reconciled then);
        else the largest allowed split below it, or ``1``, said once.

        Raises:
            TypeError: if ``split`` is not an int.
            ValueError: if ``split`` is below 1.
        """
        split = check_int("split", split, minimum=1)
        if self.outcome is None or split == 1:
            return split
        clamped = clamp_split(split, self.outcome.splits)
        if clamped != split:
            why = (
                f"allows splits {list(self.outcome.splits)}"
                if self.outcome.splits
                else f"left the lever off ({self.outcome.reason})"
            )
            rank_zero_warn(
                f"{self.name}: split {split} is not one the micro-batch lever's trial allows (it {why}); "
                f"running at split {clamped}"
            )
        return clamped

    def state_dict(self) -> dict[str, Any]:
        """The trial's outcome as plain values (``{"tried": False}`` before it ran)."""
        if self.outcome is None:
            return {"tried": False}
        return {"tried": True, **self.outcome.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The trial's outcome :meth:`state_dict` saved: not tried (or tried by a version that
        judged in eval mode only: no ``ghost`` flag), the trial runs on the next first batch; else
        it does not, and the splits above ``max_split`` are left out.

        Raises:
            TypeError, ValueError: for a state that is not one :meth:`state_dict` writes.
        """
        if not state.get("tried", False) or "ghost" not in state:
            # not tried, or tried before the trial judged in training mode: tried again
            self.outcome = None
            return
        saved = SplitOutcome.from_state(state)
        splits = tuple(s for s in saved.splits if s <= self.max_split)
        reason = saved.reason
        if saved.splits and not splits:
            reason = f"max_split={self.max_split} is below the splits it allowed ({list(saved.splits)})"
        self.outcome = SplitOutcome(splits, saved.min_chunk, reason, saved.ghost)
        self.step.min_chunk = saved.min_chunk

    def remove(self) -> None:
        """The strategy's own ``training_step`` again."""
        self.step.remove()
        self._batch = None
