"""``ElasticDDPStrategy``: rescale the optimizer by rule when a run resumes on another world size.

What this version does (the rest of the elastic feature is not written yet, see the package
docstring): every checkpoint records the *reference* configuration (the world size, per-device
batch, accumulation and optimizer hyperparameters the run was planned with, kept from the first
run on) and the samples seen. When a run resumes from such a checkpoint on a different number
of processes, the strategy applies its :class:`~lightning_bandlimit.strategies.ScalingRule` to
the optimizers **after** Lightning restored their state, and logs the event
(``ElasticDDPStrategy/world_size``, ``/global_batch``, ``/lr``, ``/momentum``, ``/beta1``,
``/accumulation``). Registered as ``Trainer(strategy="elastic_ddp")``.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.strategies import DDPStrategy, StrategyRegistry
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override

from lightning_bandlimit.strategies.scaling import (
    ScalingRule,
    TrainingConfig,
    apply_to_optimizer,
    default_rule,
    read_optimizer,
)

__all__ = ["ElasticDDPStrategy", "register_elastic_strategies"]

_KEY = "elastic_ddp"


class ElasticDDPStrategy(DDPStrategy):
    """DDP that rescales the optimizer by a :class:`ScalingRule` after a resize.

    Args:
        rule: the scaling rule; ``None`` picks :func:`default_rule` for the (first) optimizer:
            square-root for Adam-like optimizers, linear for SGD.
        per_device_batch: samples per process per micro-batch; ``None`` reads the training
            dataloader's ``batch_size``.
        **kwargs: passed to ``DDPStrategy``.

    Raises:
        ValueError: at training start, for a checkpoint whose reference configuration cannot
            apply (e.g. a rule for Adam betas on an SGD run), before any step is taken.

    Example:
        >>> trainer = pl.Trainer(strategy="elastic_ddp", accelerator="cpu", devices=1, logger=False)
        >>> type(trainer.strategy).__name__
        'ElasticDDPStrategy'
    """

    def __init__(self, rule: ScalingRule | None = None, per_device_batch: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if per_device_batch is not None and per_device_batch < 1:
            raise ValueError(f"per_device_batch must be at least 1, got {per_device_batch}")
        self.rule = rule
        self.per_device_batch = per_device_batch
        self.reference: TrainingConfig | None = None
        self.samples_seen = 0
        self.resized_from: int | None = None
        self._restored: dict[str, Any] | None = None

    def _batch_size(self) -> int:
        if self.per_device_batch is not None:
            return self.per_device_batch
        loader = self.lightning_module.trainer.train_dataloader
        size = getattr(loader, "batch_size", None)
        if not isinstance(size, int) or size < 1:
            raise ValueError(
                "ElasticDDPStrategy could not read the per-device batch size from the training "
                f"dataloader (got {size!r}); pass per_device_batch="
            )
        return size

    @override
    def load_checkpoint(self, checkpoint_path: str | Path, weights_only: bool | None = None) -> dict[str, Any]:
        checkpoint = super().load_checkpoint(checkpoint_path, weights_only=weights_only)
        self._restored = checkpoint.get(_KEY)
        return checkpoint

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: str | Path, storage_options: Any = None) -> None:
        if self.reference is not None:
            checkpoint[_KEY] = {
                "reference": asdict(self.reference),
                "world_size": self.world_size,
                "samples_seen": self.samples_seen,
                "rule": type(self.rule).__name__ if self.rule is not None else None,
            }
        super().save_checkpoint(checkpoint, filepath, storage_options)

    @override
    def on_train_start(self) -> None:
        super().on_train_start()
        trainer = self.lightning_module.trainer
        optimizer = trainer.optimizers[0]
        if self.rule is None:
            self.rule = default_rule(optimizer)
        current = read_optimizer(optimizer, self.world_size, self._batch_size(), trainer.accumulate_grad_batches)
        if self._restored is None:
            self.reference = current
            return
        self.reference = TrainingConfig(**{**self._restored["reference"], "betas": _tuple(self._restored["reference"].get("betas"))})
        self.samples_seen = int(self._restored.get("samples_seen", 0))
        previous = int(self._restored["world_size"])
        if previous == self.world_size:
            return
        # The optimizer state Lightning restored holds the previous size's hyperparameters;
        # the rule maps the reference (the planned run) to this size, so resizes never compound.
        target = self.rule.adjust(self.reference, self.world_size)
        ratio = target.lr / current.lr
        for opt in trainer.optimizers:
            apply_to_optimizer(opt, read_optimizer(opt, self.world_size, current.per_device_batch, current.accumulation), target)
        # Schedulers that recompute the LR from base_lrs (SampleSchedule, LambdaLR, cosine, ...)
        # would undo the rule on their next step; OneCycleLR keeps max_lr in the groups: not handled.
        for config in trainer.lr_scheduler_configs:
            if hasattr(config.scheduler, "base_lrs"):
                config.scheduler.base_lrs = [lr * ratio for lr in config.scheduler.base_lrs]
        self.resized_from = previous
        self._log_resize(trainer, previous, target)

    def _log_resize(self, trainer: pl.Trainer, previous: int, target: TrainingConfig) -> None:
        metrics = {
            "ElasticDDPStrategy/world_size": float(self.world_size),
            "ElasticDDPStrategy/previous_world_size": float(previous),
            "ElasticDDPStrategy/global_batch": float(target.global_batch),
            "ElasticDDPStrategy/lr": target.lr,
            "ElasticDDPStrategy/accumulation": float(target.accumulation),
        }
        if target.momentum is not None:
            metrics["ElasticDDPStrategy/momentum"] = target.momentum
        if target.betas is not None:
            metrics["ElasticDDPStrategy/beta1"] = target.betas[0]
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)
        rank_zero_info(
            f"ElasticDDPStrategy: world size {previous} -> {self.world_size} ({self.rule!r}): global batch "
            f"{target.global_batch}, lr {target.lr:.4g}, momentum {target.momentum}, betas {target.betas}, "
            f"accumulation {target.accumulation}"
        )
        if target.accumulation != trainer.accumulate_grad_batches:
            rank_zero_info(
                f"ElasticDDPStrategy: the rule asks for accumulate_grad_batches={target.accumulation}; "
                f"this Trainer runs with {trainer.accumulate_grad_batches} (set it when relaunching)"
            )

    @override
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        super().on_train_batch_start(batch, batch_idx)
        if self.reference is not None:
            self.samples_seen += self.world_size * self._batch_size()


def _tuple(value: Any) -> tuple[float, float] | None:
    return None if value is None else (float(value[0]), float(value[1]))


def register_elastic_strategies() -> None:
    """Register ``"elastic_ddp"`` with Lightning's strategy registry (idempotent).

    Example:
        >>> register_elastic_strategies()
        >>> "elastic_ddp" in StrategyRegistry
        True
    """
    if _KEY not in StrategyRegistry:
        StrategyRegistry.register(
            _KEY, ElasticDDPStrategy, description="DDP that rescales the optimizer by rule after a resize",
            start_method="popen",
        )


register_elastic_strategies()
