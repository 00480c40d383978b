"""The one place where the callbacks touch private Lightning state (``ModelCheckpoint``'s internals,
the fit loop's schedule of validations).

:func:`check_lightning_shapes` checks that the installed Lightning still has what these
functions rely on (the tests call it, and ``ElasticCheckpoint.setup`` does once), so a Lightning
upgrade that changes them fails with a message naming the attribute.
"""

from __future__ import annotations

import functools
import inspect

import lightning
import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint

__all__ = [
    "LastCheckpointHook",
    "batches_to_next_validation_or_end",
    "check_lightning_shapes",
    "last_saved_step",
    "save_last_checkpoint",
]


def _shape_error(attribute: str) -> RuntimeError:
    return RuntimeError(
        f"lightning_bandlimit.callbacks relies on {attribute}, which the installed lightning "
        f"{lightning.__version__} does not have as expected; install a lightning version in the range "
        "pyproject.toml pins"
    )


def _method_parameters(name: str) -> list[str] | None:
    method = vars(ModelCheckpoint).get(name)
    return list(inspect.signature(method).parameters) if callable(method) else None


@functools.cache
def check_lightning_shapes() -> None:
    """Check the private ``ModelCheckpoint`` attributes this module relies on (once per process).

    Raises:
        RuntimeError: naming the first attribute missing or changed, with the installed
            Lightning version.

    Example:
        >>> check_lightning_shapes()
    """
    if _method_parameters("_find_last_checkpoints") != ["self", "trainer"]:
        raise _shape_error("ModelCheckpoint._find_last_checkpoints(trainer)")
    if _method_parameters("_monitor_candidates") != ["self", "trainer"]:
        raise _shape_error("ModelCheckpoint._monitor_candidates(trainer)")
    if _method_parameters("_save_last_checkpoint") != ["self", "trainer", "monitor_candidates"]:
        raise _shape_error("ModelCheckpoint._save_last_checkpoint(trainer, monitor_candidates)")
    if not isinstance(getattr(ModelCheckpoint(), "_last_global_step_saved", None), int):
        raise _shape_error("ModelCheckpoint._last_global_step_saved")


class LastCheckpointHook:
    """Mixin for a ``ModelCheckpoint``: :meth:`before_finding_last` runs before Lightning looks
    for the newest ``last`` checkpoint (its private ``_find_last_checkpoints``, which
    ``ckpt_path="last"`` calls before any callback's ``setup``), and :meth:`choose_last` may
    narrow what it found (Lightning then takes the newest of what is left)."""

    def before_finding_last(self, trainer: pl.Trainer) -> None:
        """Prepare the callback for the search (nothing by default)."""

    def choose_last(self, trainer: pl.Trainer, candidates: set[str]) -> set[str]:
        """The candidates Lightning may resume from (all of them by default)."""
        return candidates

    def _find_last_checkpoints(self, trainer: pl.Trainer) -> set[str]:
        self.before_finding_last(trainer)
        return self.choose_last(trainer, super()._find_last_checkpoints(trainer))  # type: ignore[misc]


def last_saved_step(callback: ModelCheckpoint) -> int:
    """The global step at which ``callback`` last saved a checkpoint (0 before any)."""
    return callback._last_global_step_saved


def save_last_checkpoint(callback: ModelCheckpoint, trainer: pl.Trainer) -> None:
    """Save ``callback``'s ``last`` checkpoint now, as it does at a regular save."""
    callback._save_last_checkpoint(trainer, callback._monitor_candidates(trainer))


def batches_to_next_validation_or_end(trainer: pl.Trainer, batch_idx: int) -> int | None:
    """Training batches after ``batch_idx`` (whose ``on_train_batch_end`` runs now) before the
    next validation, the end of the epoch or the end of training, whichever comes first (``0``:
    it follows this batch); ``None`` when the schedule cannot be told (time-based validation,
    an iterable without length), so a caller keeps what it would keep anyway.

    Mirrors the fit loop's ``_should_check_val_fx`` for batch-based validation.
    """
    if getattr(trainer, "_val_check_time_interval", None) is not None:
        return None
    distances = []
    batches = trainer.num_training_batches
    if batches == float("inf"):
        return None
    distances.append(int(batches) - 1 - batch_idx)  # the epoch's last batch
    every = trainer.val_check_batch
    if every is not None and every != float("inf"):
        if trainer.check_val_every_n_epoch is None:
            iteration = getattr(trainer.fit_loop.epoch_loop, "total_batch_idx", None)
            if iteration is None:
                return None
        else:
            iteration = batch_idx
        every = int(every)
        distances.append(every - 1 - iteration % every)
    if trainer.max_steps is not None and trainer.max_steps >= 0:
        accumulate = max(1, int(trainer.accumulate_grad_batches))
        distances.append(
            (trainer.max_steps - trainer.global_step) * accumulate - (batch_idx + 1) % accumulate
        )
    return max(0, min(distances))
