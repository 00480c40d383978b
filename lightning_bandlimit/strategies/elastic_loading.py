"""The elastic strategy's training data, in Lightning's hooks: the loader, the plan and the position.

:class:`ElasticLoading` is the side of :class:`~lightning_bandlimit.strategies.ElasticDDPStrategy`
that feeds training:

* **Plan**: for a rule that chooses the micro-batch (``rule.micro_batch_plan``, as
  ``ExactGlobalBatch`` does), this world size's plan is asked once, before any step (it may
  refuse the size), and said (a warning when it is not exact); it sets the per-device
  micro-batch and the trainer's accumulation.
* **Loader**: the training loader Lightning prepared is rebuilt around an
  :class:`~lightning_bandlimit.strategies.ElasticSampler` (``elastic_data``): the rest of the
  epoch re-partitioned over the ranks, each sample exactly once, in the loader's order.
* **Position**: a reloaded loader keeps the position of the one before; the first takes the
  checkpoint's. Each batch moves it on; a resumed epoch counts its batches done at the new size
  (in the epoch loop, through the ``_lightning`` adapter).

The sampler's choice and the position's rules are ``elastic_data``'s; nothing here decides them.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.trainer.states import RunningStage
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from lightning_bandlimit.strategies._lightning import set_batches_done_this_epoch
from lightning_bandlimit.strategies.elastic_data import (
    batches_done_this_epoch,
    elastic_loader,
    elastic_sampler_for,
    loader_batch_size,
    restore_position,
)
from lightning_bandlimit.strategies.elastic_resume import ResumeState
from lightning_bandlimit.strategies.elastic_sampler import ElasticSampler
from lightning_bandlimit.strategies.scaling_rule import MicroBatchPlan, ScalingRule

__all__ = ["ElasticLoading"]


class ElasticLoading:
    """Mixin of :class:`~lightning_bandlimit.strategies.ElasticDDPStrategy` (before the Lightning
    strategy in its bases): the training loader, the rule's micro-batch plan, the data position.

    The strategy calls :meth:`_init_loading` from its ``__init__``, :meth:`_continue_epoch` when
    it resumes, :meth:`_next_batch` at each batch start and :meth:`_batch_size` for the
    per-device batch; ``process_dataloader`` is Lightning's hook.

    Attributes:
        sampler: the training sampler (``None`` before the first training loader).
        plan: for a rule that chooses the micro-batch, this world size's plan.
    """

    rule: ScalingRule | None
    world_size: int
    global_rank: int
    lightning_module: Any
    _restored: ResumeState | None
    _restored_path: str | None

    def _init_loading(self, per_device_batch: int | None, seed: int | None) -> None:
        self.per_device_batch = per_device_batch
        self.seed = seed
        self.sampler: ElasticSampler | None = None
        self.plan: MicroBatchPlan | None = None  # for a rule that chooses the micro-batch: this size's plan

    def process_dataloader(self, dataloader: object) -> object:
        dataloader = super().process_dataloader(dataloader)  # type: ignore[misc]
        trainer = self.lightning_module.trainer if self.lightning_module is not None else None
        if trainer is None or trainer.state.stage != RunningStage.TRAINING:
            return dataloader
        if self.rule is not None and self.plan is None:
            self.plan = self.rule.micro_batch_plan(self.world_size)  # before any step: may refuse the size
            if self.plan is not None:
                self._announce_plan(dataloader)
        micro = self.plan.micro_batch if self.plan is not None else None
        if self.plan is not None:
            trainer.accumulate_grad_batches = self.plan.accumulation
        sampler = elastic_sampler_for(dataloader, self.world_size, self.global_rank, self.seed, micro)
        # reloaded dataloaders keep the position; the first one takes the checkpoint's
        restored = None if self._restored is None else self._restored.sampler
        restore_position(
            sampler, self.sampler.state_dict() if self.sampler else restored, self._restored_path
        )
        self.sampler = sampler
        return elastic_loader(dataloader, sampler, micro)

    def _announce_plan(self, dataloader: object) -> None:
        assert self.rule is not None and self.plan is not None
        message = self.rule.describe(self.plan, getattr(dataloader, "batch_size", None))
        (rank_zero_info if self.plan.exact else rank_zero_warn)(f"ElasticDDPStrategy: {message}")

    def _batch_size(self) -> int:
        """The per-device batch: the one given, else the sampler's, else the training loader's."""
        if self.per_device_batch is not None:
            return self.per_device_batch
        if self.sampler is not None:
            return self.sampler.batch_size
        return loader_batch_size(self.lightning_module.trainer.train_dataloader)

    def _continue_epoch(self, trainer: pl.Trainer) -> None:
        """A resumed run: the epoch loop counts the batches the position says are done at this size."""
        if self.sampler is not None:
            set_batches_done_this_epoch(trainer, batches_done_this_epoch(self.sampler))

    def _next_batch(self) -> int:
        """A training batch starts: the position moves on by it; the samples it holds (every rank's)."""
        if self.sampler is not None:
            before = self.sampler.consumed
            self.sampler.advance(1)
            return self.sampler.consumed - before
        return self.world_size * self._batch_size()
