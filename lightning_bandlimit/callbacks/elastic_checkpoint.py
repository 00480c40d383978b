"""``ElasticCheckpoint``: checkpoints for jobs that torchrun restarts at any moment."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.exceptions import SIGTERMException
from typing_extensions import override

from lightning_bandlimit.callbacks._lightning import (
    LastCheckpointHook,
    check_lightning_shapes,
    last_saved_step,
    save_last_checkpoint,
)
from lightning_bandlimit.callbacks.checkpoint_io import newest_readable, recover_temporaries
from lightning_bandlimit.utils.validation import check_int

__all__ = ["ElasticCheckpoint"]


class ElasticCheckpoint(LastCheckpointHook, ModelCheckpoint):
    """``last.ckpt`` every N steps and when torchrun stops the workers (SIGTERM).

    torchrun restarts *every* worker when a node joins or leaves, sending SIGTERM first; the new
    workers must resume from the job's own checkpoint. This ``ModelCheckpoint`` keeps one
    ``last.ckpt`` in a directory that does not depend on the logger's version (so a relaunch
    finds it), writes it every ``every_n_train_steps`` and, when Lightning stops training on
    SIGTERM, once more at that step. Relaunch with ``trainer.fit(..., ckpt_path="last")`` (the
    ``elastic`` recipe does) to resume from the newest one automatically; without a checkpoint
    the run starts fresh.

    A resume never reads a torn file: of the ``last`` checkpoints (``last.ckpt`` and, written by
    :class:`~lightning_bandlimit.callbacks.checkpoint_io.DurableCheckpointIO` (the default of
    ``ElasticDDPStrategy``), the version it replaced, ``last.prev.ckpt``), the newest that loads
    whole is resumed; a skipped one is named in a warning. First, what writers killed on this host
    left is settled: a complete temporary file (killed between its renames) is renamed into
    place, any other removed.

    Args:
        dirpath: the checkpoint directory; ``None``: ``<default_root_dir>/checkpoints``.
        every_n_train_steps: optimizer steps between checkpoints.
        save_last: keep ``last.ckpt`` (what ``ckpt_path="last"`` finds); leave it on.
        save_top_k: other checkpoints to keep (``0``: only ``last.ckpt``; ``-1``: all).
        **kwargs: passed to ``ModelCheckpoint``.

    Raises:
        TypeError: if ``every_n_train_steps`` is not an int.
        ValueError: if it is not positive.
        RuntimeError: at ``fit(ckpt_path="last")``, if ``last`` checkpoints exist but none loads
            (naming them; nothing is overwritten).

    Example:
        >>> callback = ElasticCheckpoint(dirpath="ckpts", every_n_train_steps=50)
        >>> callback.save_last, callback.every_n_train_steps
        (True, 50)
    """

    def __init__(
        self,
        dirpath: str | Path | None = None,
        every_n_train_steps: int = 50,
        save_last: bool = True,
        save_top_k: int = 0,
        **kwargs: Any,
    ) -> None:
        self._every_n_steps = check_int("every_n_train_steps", every_n_train_steps, minimum=1)
        # always ``last.ckpt``: a ``last-v1.ckpt`` beside a stale one would fork the resume chain
        kwargs.setdefault("enable_version_counter", False)
        self._stepped = False  # an optimizer step since the last on_train_batch_end
        super().__init__(
            dirpath=dirpath,
            every_n_train_steps=every_n_train_steps,
            save_last=save_last,
            save_top_k=save_top_k,
            **kwargs,
        )

    @property
    def every_n_train_steps(self) -> int:
        """Optimizer steps between checkpoints."""
        return self._every_n_steps

    @property
    def last_saved_step(self) -> int:
        """The global step of the newest checkpoint this callback finished writing (0 before any)."""
        return last_saved_step(self)

    def _fix_dirpath(self, trainer: pl.Trainer) -> None:
        if self.dirpath is None:
            self.dirpath = os.path.join(trainer.default_root_dir, "checkpoints")

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        check_lightning_shapes()
        self._fix_dirpath(trainer)
        super().setup(trainer, pl_module, stage)

    @override
    def before_finding_last(self, trainer: pl.Trainer) -> None:
        self._fix_dirpath(trainer)  # ckpt_path="last" is resolved before setup
        # one process per host settles killed writers' files (the ranks' agreement on the step
        # resumed, checked by ElasticDDPStrategy, catches a rank that looked before it did)
        if trainer.local_rank == 0 and self.dirpath is not None:
            promoted, _ = recover_temporaries(self.dirpath)
            for path in promoted:
                rank_zero_warn(
                    f"ElasticCheckpoint: {path} was complete in a killed writer's temporary file; "
                    "renamed it into place"
                )

    @override
    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        self._stepped = True

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        # Only right after an optimizer step. Mid-accumulation the data position is inside a step;
        # Lightning would save there on the first micro-batch after a resume (its record of the
        # last step saved starts at 0), and a resume from that file would train that step short.
        if not self._stepped:
            return
        self._stepped = False
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    @override
    def choose_last(self, trainer: pl.Trainer, candidates: set[str]) -> set[str]:
        if not candidates:
            return candidates
        found, skipped = newest_readable(candidates)
        if found is None:
            unreadable = "; ".join(f"{path} ({reason})" for path, reason in skipped)
            raise RuntimeError(f"ElasticCheckpoint: no last checkpoint can be read: {unreadable}")
        for path, reason in skipped:
            rank_zero_warn(
                f"ElasticCheckpoint: skipped {path}, which cannot be read ({reason}); resuming from {found}"
            )
        return {str(found)}

    @override
    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        if not isinstance(exception, SIGTERMException) or trainer.global_step == last_saved_step(self):
            return
        # Lightning raises SIGTERMException on every rank after the same batch, between steps.
        save_last_checkpoint(self, trainer)
        rank_zero_info(
            f"ElasticCheckpoint: saved {self.last_model_path} at step {trainer.global_step} on SIGTERM"
        )
