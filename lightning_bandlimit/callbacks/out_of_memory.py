"""The out-of-memory backstop: free what an out-of-memory error left, retry once (the error
recognised by :func:`~lightning_bandlimit.utils.out_of_memory.is_out_of_memory`, the package's one
test, which the micro-batch split trial uses too).

:class:`~lightning_bandlimit.callbacks.AdaptiveBandLimit` wraps the LightningModule's
``training_step`` with :func:`guard_training_step`: an out-of-memory error raised in it calls the
callback back (which moves to a setting that needs less memory) and runs the batch again, once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.memory import garbage_collection_cuda

from lightning_bandlimit.memory.process import release_cached_memory
from lightning_bandlimit.utils.out_of_memory import is_out_of_memory

__all__ = ["free_memory", "guard_fit", "guard_training_step", "unguard_training_step"]


def free_memory(device: torch.device | None) -> None:
    """Collect garbage and return cached memory to the device (and, off CUDA, to the host)."""
    garbage_collection_cuda()  # gc.collect() and torch.cuda.empty_cache()
    if device is None or device.type != "cuda":
        release_cached_memory(device)  # the host's allocator too (malloc_trim), which Lightning leaves alone


def guard_training_step(pl_module: pl.LightningModule, on_out_of_memory: Callable[[], None]) -> None:
    """Wrap ``pl_module.training_step``: an out-of-memory error in it calls ``on_out_of_memory()``
    and runs the step again, once (a second error propagates); any other error propagates.

    ``on_out_of_memory`` runs outside the ``except`` block, whose traceback would pin tensors.
    """
    original = pl_module.training_step

    def training_step(*args: Any, **kwargs: Any) -> Any:
        try:
            return original(*args, **kwargs)
        except Exception as error:  # noqa: BLE001 - re-raised unless it is an OOM
            if not is_out_of_memory(error):
                raise
        on_out_of_memory()
        return original(*args, **kwargs)

    pl_module.training_step = training_step  # type: ignore[method-assign]


def unguard_training_step(pl_module: pl.LightningModule) -> None:
    """Undo :func:`guard_training_step`: back to the class's method (returns ``None``)."""
    del pl_module.training_step


def guard_fit(
    trainer: pl.Trainer, pl_module: pl.LightningModule, on_out_of_memory: Callable[[], None]
) -> pl.LightningModule | None:
    """:func:`guard_training_step` in a single-process fit; returns the guarded module, or
    ``None`` (said once) under multi-process training, where one rank retrying alone would
    desynchronise the collectives."""
    if trainer.world_size > 1:
        rank_zero_info("AdaptiveBandLimit: the out-of-memory backstop is off under multi-process training")
        return None
    guard_training_step(pl_module, on_out_of_memory)
    return pl_module
