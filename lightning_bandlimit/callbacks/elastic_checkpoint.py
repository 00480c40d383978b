"""``ElasticCheckpoint``: checkpoints for jobs that torchrun restarts at any moment."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import SIGTERMException
from typing_extensions import override

from lightning_bandlimit.callbacks._lightning import (
    LastCheckpointHook,
    check_lightning_shapes,
    last_saved_step,
    save_last_checkpoint,
)
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

    Args:
        dirpath: the checkpoint directory; ``None``: ``<default_root_dir>/checkpoints``.
        every_n_train_steps: optimizer steps between checkpoints.
        save_last: keep ``last.ckpt`` (what ``ckpt_path="last"`` finds); leave it on.
        save_top_k: other checkpoints to keep (``0``: only ``last.ckpt``; ``-1``: all).
        **kwargs: passed to ``ModelCheckpoint``.

    Raises:
        TypeError: if ``every_n_train_steps`` is not an int.
        ValueError: if it is not positive.

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
