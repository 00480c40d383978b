"""The out-of-memory backstop of :class:`~lightning_bandlimit.callbacks.AdaptiveBandLimit`
(:class:`OutOfMemoryBackstop`, ``oom_backstop=True``, single-process runs).

The ladder acts between steps, on what it measured; a co-tenant growing faster than its checks,
or a step bigger than predicted, can still run the job out of memory inside a step. An
out-of-memory error raised inside ``training_step`` (the forward pass) moves the job to a
setting that needs less memory and retries that batch once: to the top rung if it is below it;
there, to its largest micro-batch split, then up the compression continuum
(:meth:`~lightning_bandlimit.ladder.LadderController.on_oom`, which the releases never go below
again); in the first step, which measures the units
(:mod:`~lightning_bandlimit.callbacks.ladder_profile`), with every unit checkpointed. It cannot
catch an out-of-memory error in ``backward``, the optimizer step, data loading or another
process; a second one on the same batch propagates. Under DDP it is off, since one rank
retrying alone would desynchronise the collectives.

How the error is recognised, the memory it left freed and the step wrapped is
:mod:`~lightning_bandlimit.callbacks.out_of_memory`; here is what the ladder does when it fires.
"""

from __future__ import annotations

from collections.abc import Callable

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_warn

from lightning_bandlimit.callbacks.ladder_events import LadderEvents
from lightning_bandlimit.callbacks.ladder_profile import FirstStep
from lightning_bandlimit.callbacks.out_of_memory import free_memory, guard_fit, unguard_training_step
from lightning_bandlimit.ladder.setting import Setting

__all__ = ["OutOfMemoryBackstop"]


class OutOfMemoryBackstop:
    """Retries a batch whose ``training_step`` ran out of memory, once, at a setting that needs
    less memory.

    Attributes:
        guarded: the LightningModule whose ``training_step`` is wrapped (``None``: none, or
            multi-process training).

    Example:
        >>> backstop = OutOfMemoryBackstop()
        >>> backstop.guarded is None
        True
    """

    def __init__(self) -> None:
        self.guarded: pl.LightningModule | None = None

    def install(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, recover: Callable[[], None]
    ) -> None:
        """Wrap ``pl_module.training_step`` (once per fit, single-process only; said once
        otherwise): an out-of-memory error in it calls ``recover()`` and runs the batch again."""
        if self.guarded is None:
            self.guarded = guard_fit(trainer, pl_module, recover)

    def remove(self) -> None:
        """The module's own ``training_step`` again."""
        if self.guarded is not None:
            self.guarded = unguard_training_step(self.guarded)

    def retry_setting(
        self,
        step: int,
        current: Setting,
        first_step: FirstStep,
        events: LadderEvents,
        device: torch.device | None,
    ) -> Setting | None:
        """The batch of ``step`` ran out of memory at ``current``: free what it left, then the
        setting to retry it at (the caller moves there and records it), said once per error.
        ``None`` in the first step, whose measurement is incomplete: it restarts with every unit
        checkpointed, and the first step moves the job to the top rung when it ends."""
        free_memory(device)
        if first_step.profiling is not None:
            first_step.restart_after_oom(step)
            rank_zero_warn(
                f"AdaptiveBandLimit: out of memory in training_step at step {step} (the first, which "
                "measures the units); retrying the batch once with every unit checkpointed"
            )
            return None
        retry = events.out_of_memory(current)
        rank_zero_warn(
            f"AdaptiveBandLimit: out of memory in training_step at step {step}; "
            f"retrying the batch once at {retry} (was {current})"
        )
        return retry
