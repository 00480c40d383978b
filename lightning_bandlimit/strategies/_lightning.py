"""The one place where the strategies touch private Lightning and torch state.

Each function is named for what the strategy needs; :func:`check_lightning_shapes` checks that
the installed Lightning and torch still have the attributes these functions rely on (the tests
call it, and ``ElasticDDPStrategy.setup`` does once), so a Lightning upgrade that changes them
fails with a message naming the attribute instead of silently mis-counting an epoch.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from datetime import timedelta
from typing import Any

import lightning
import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.trainer.states import RunningStage
from lightning.pytorch.utilities import data as lightning_data
from torch.optim.lr_scheduler import LRScheduler
from torch.utils.data import DataLoader, Sampler

__all__ = [
    "LauncherHook",
    "check_lightning_shapes",
    "loader_with_sampler",
    "process_group_settings",
    "set_batches_done_this_epoch",
    "set_scheduler_last_lr",
]

_PROGRESS_FIELDS = ("ready", "started", "processed", "completed")


def _private(module: str, name: str) -> Any:
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        raise _shape_error(f"{module}.{name}") from None


def _shape_error(attribute: str) -> RuntimeError:
    return RuntimeError(
        f"lightning_bandlimit.strategies relies on {attribute}, which the installed lightning "
        f"{lightning.__version__} (torch {torch.__version__}) does not have as expected; "
        "install a lightning version in the range pyproject.toml pins"
    )


@functools.cache
def check_lightning_shapes() -> None:
    """Check the private Lightning / torch attributes this module relies on (once per process).

    Raises:
        RuntimeError: naming the first attribute missing or changed, with the installed
            Lightning version.

    Example:
        >>> check_lightning_shapes()
    """
    if not callable(vars(DDPStrategy).get("_configure_launcher")):
        raise _shape_error("DDPStrategy._configure_launcher()")
    if not callable(vars(DDPStrategy).get("_get_process_group_backend")):
        raise _shape_error("DDPStrategy._get_process_group_backend()")
    if not isinstance(getattr(DDPStrategy(), "_timeout", None), timedelta):
        raise _shape_error("DDPStrategy._timeout (the process group's timeout)")
    update = _private("lightning.pytorch.utilities.data", "_update_dataloader")
    if list(inspect.signature(update).parameters)[:3] != ["dataloader", "sampler", "mode"]:
        raise _shape_error("lightning.pytorch.utilities.data._update_dataloader(dataloader, sampler, mode)")
    init_args = _private("lightning.pytorch.utilities.data", "_get_dataloader_init_args_and_kwargs")
    if list(inspect.signature(init_args).parameters)[:3] != ["dataloader", "sampler", "mode"]:
        raise _shape_error(
            "lightning.pytorch.utilities.data._get_dataloader_init_args_and_kwargs(dataloader, sampler, mode)"
        )
    _private("lightning.pytorch.utilities.data", "_reinstantiate_wrapped_cls")
    epoch_loop = _private("lightning.pytorch.loops.training_epoch_loop", "_TrainingEpochLoop")
    if not isinstance(getattr(epoch_loop, "restarted_on_train_batch_end", None), property):
        raise _shape_error("the property _TrainingEpochLoop.restarted_on_train_batch_end")
    current = getattr(_private("lightning.pytorch.loops.progress", "_BatchProgress")(), "current", None)
    if current is None or not all(isinstance(getattr(current, f, None), int) for f in _PROGRESS_FIELDS):
        raise _shape_error(f"_TrainingEpochLoop.batch_progress.current.{{{', '.join(_PROGRESS_FIELDS)}}}")
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.5)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    if getattr(scheduler, "_last_lr", None) != [0.5] or scheduler.get_last_lr() != [0.5]:
        raise _shape_error("LRScheduler._last_lr (what get_last_lr() returns)")


class LauncherHook:
    """Mixin for a Lightning strategy: :meth:`before_launcher` runs right before Lightning
    configures the launcher (its private ``Strategy._configure_launcher``, called once the
    cluster environment and the process counts are known)."""

    def before_launcher(self) -> None:
        """Adjust the strategy before its launcher is configured (nothing by default)."""

    def _configure_launcher(self) -> None:
        self.before_launcher()
        super()._configure_launcher()  # type: ignore[misc]


def process_group_settings(strategy: DDPStrategy) -> tuple[str, timedelta]:
    """The backend and timeout a DDP strategy's ``setup_distributed`` forms its process group with."""
    return strategy._get_process_group_backend(), strategy._timeout


def loader_with_sampler(
    dataloader: DataLoader, sampler: Sampler, batch_size: int | None = None
) -> DataLoader:
    """A copy of a training ``dataloader`` (of any ``DataLoader`` subclass) drawing from ``sampler``.

    Lightning's private ``_update_dataloader`` machinery re-instantiates the loader with its
    original arguments, as Lightning does when it injects a ``DistributedSampler``; a
    ``batch_size`` other than ``None`` replaces the loader's own.

    Raises:
        ValueError: if the loader's class does not take ``batch_size`` and one is given.
    """
    if batch_size is None or batch_size == dataloader.batch_size:
        return lightning_data._update_dataloader(dataloader, sampler, mode=RunningStage.TRAINING)
    args, kwargs = lightning_data._get_dataloader_init_args_and_kwargs(
        dataloader, sampler, mode=RunningStage.TRAINING
    )
    kwargs = dict(kwargs)  # Lightning returns the loader's own saved kwargs: do not change them
    positional = tuple(getattr(dataloader, "__pl_saved_arg_names", ()))
    if "batch_size" in positional[: len(args)]:
        index = positional.index("batch_size")
        args = (*args[:index], batch_size, *args[index + 1 :])
    else:
        accepts = inspect.signature(type(dataloader).__init__).parameters
        if "batch_size" not in accepts and not any(p.kind is p.VAR_KEYWORD for p in accepts.values()):
            raise ValueError(
                f"{type(dataloader).__name__} does not take batch_size, so its micro-batch cannot be "
                f"changed to {batch_size}; use a torch DataLoader for training"
            )
        kwargs["batch_size"] = batch_size
    return lightning_data._reinstantiate_wrapped_cls(dataloader, *args, **kwargs)


def set_batches_done_this_epoch(trainer: pl.Trainer, done: int) -> None:
    """Make the fit loop believe ``done`` batches of the current (resumed) epoch are finished.

    Call it from ``on_train_start`` of a resumed run: Lightning's epoch loop then adds one
    completed batch when the checkpoint was written at a batch's end, and sets its ready /
    started / processed / completed counters to that.
    """
    epoch_loop = trainer.fit_loop.epoch_loop
    current = epoch_loop.batch_progress.current
    completed = done - 1 if epoch_loop.restarted_on_train_batch_end else done
    current.ready = current.started = current.processed = current.completed = completed


def set_scheduler_last_lr(scheduler: LRScheduler, last_lr: list[Any]) -> None:
    """Set what ``scheduler.get_last_lr()`` returns (torch keeps it in the private ``_last_lr``),
    for a scheduler that changed its optimizer's LRs outside ``step()``."""
    scheduler._last_lr = last_lr
