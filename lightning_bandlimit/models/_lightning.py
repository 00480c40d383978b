"""The one place where the example models touch Lightning's loop internals.

:func:`check_lightning_shapes` checks that the installed Lightning still has what these
functions rely on (the tests call it, and :func:`training_loader` does once), so a Lightning
upgrade that changes them fails with a message naming the attribute.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

import lightning
import lightning.pytorch as pl

__all__ = ["advances_sample_schedules", "check_lightning_shapes", "training_loader"]


@functools.cache
def check_lightning_shapes() -> None:
    """Check the Lightning loop attributes this module relies on (once per process).

    Raises:
        RuntimeError: naming the attribute missing, with the installed Lightning version.

    Example:
        >>> check_lightning_shapes()
    """
    try:
        fit_loop = importlib.import_module("lightning.pytorch.loops.fit_loop")._FitLoop
    except (ImportError, AttributeError):
        fit_loop = None
    if not callable(getattr(fit_loop, "setup_data", None)):
        raise RuntimeError(
            "lightning_bandlimit.models relies on lightning.pytorch.loops.fit_loop._FitLoop.setup_data(), "
            f"which the installed lightning {lightning.__version__} does not have; install a lightning "
            "version in the range pyproject.toml pins"
        )


def training_loader(trainer: pl.Trainer) -> Any:
    """The trainer's training dataloader, loaded now if Lightning has not loaded it yet.

    A ``max_steps`` run does not load it to estimate its steps, so ``configure_optimizers``
    would otherwise see ``None``.
    """
    if trainer.train_dataloader is None:
        check_lightning_shapes()
        trainer.fit_loop.setup_data()
    return trainer.train_dataloader


def advances_sample_schedules(trainer: pl.Trainer) -> bool:
    """Whether the trainer's strategy advances :class:`~lightning_bandlimit.strategies.SampleSchedule`
    (it declares ``advances_sample_schedules = True``, as ``ElasticDDPStrategy`` does)."""
    return bool(getattr(trainer.strategy, "advances_sample_schedules", False))
