"""The one place where the example models touch Lightning's loop internals."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl

__all__ = ["advances_sample_schedules", "training_loader"]


def training_loader(trainer: pl.Trainer) -> Any:
    """The trainer's training dataloader, loaded now if Lightning has not loaded it yet.

    A ``max_steps`` run does not load it to estimate its steps, so ``configure_optimizers``
    would otherwise see ``None``.
    """
    if trainer.train_dataloader is None:
        trainer.fit_loop.setup_data()
    return trainer.train_dataloader


def advances_sample_schedules(trainer: pl.Trainer) -> bool:
    """Whether the trainer's strategy advances :class:`~lightning_bandlimit.strategies.SampleSchedule`
    (it declares ``advances_sample_schedules = True``, as ``ElasticDDPStrategy`` does)."""
    return bool(getattr(trainer.strategy, "advances_sample_schedules", False))
