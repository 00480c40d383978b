"""``BandLimit``: band-limit an existing Lightning job's convolutions with one callback."""

from __future__ import annotations

import time
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_warn
from torch import nn
from typing_extensions import override

from lightning_bandlimit.callbacks._lightning import batches_to_next_validation_or_end
from lightning_bandlimit.layers.band_limited import BandLimitedConvNd
from lightning_bandlimit.layers.batchnorm import (
    Forward,
    RecentBatches,
    batchnorm_modules,
    recalibrate_batchnorm,
)
from lightning_bandlimit.layers.surgery import (
    Patterns,
    bandlimit,
    bandlimited_layers,
    normalize_patterns,
    unbandlimit,
)
from lightning_bandlimit.utils.validation import check_bool, check_compression, check_int

__all__ = ["BandLimit"]


class BandLimit(Callback):
    """Swap the model's convolutions for band-limited twins when the Trainer sets up.

    No change to the model's code: in ``setup`` every selected ``nn.Conv1d`` / ``nn.Conv2d`` of
    the LightningModule becomes a band-limited layer in place (same parameters and
    ``state_dict`` keys, so plain checkpoints load and band-limited checkpoints load into plain
    models). Layers that are band-limited already and match the patterns are managed too. The
    compression is part of this callback's state, so a run resumed from a checkpoint continues
    with the compression it had; it is logged as ``BandLimit/compression`` and the rate
    actually applied (quantised to each layer's grid, averaged) as
    ``BandLimit/achieved_compression``. Under DDP every rank swaps the same layers (checked).

    Args:
        compression: fraction of spectral coefficients to discard, in ``[0, 1)``.
        include: glob patterns over qualified module names to convert (``"backbone.*"``).
        exclude: glob patterns of modules to leave alone.
        pointwise: also convert 1x1 convolutions (skipped by default, see
            :mod:`lightning_bandlimit.layers.surgery`).
        restore_on_teardown: turn the modules this callback converted back into plain
            convolutions (and plain BatchNorm, ReLU, max-pool) when the Trainer tears down (by
            default the model stays band-limited, and usable either way).
        memory_lean: memory-lean training (on by default): BatchNorm, ReLU, max-pool and the
            remaining plain convolutions become their memory-lean twins and the band-limited
            layers keep the smallest exact form of their input, so the model keeps less for
            backward than with plain ``nn.Conv2d``, with the same gradients (to round-off).
            ``False`` swaps the convolutions only (e.g. for double backward, which the lean ops
            do not support).
        recalibrate_bn: BatchNorm follows the compression: before every validation during
            ``fit``, and at the end of an epoch or of training when the compression changed
            since, the running statistics of the model's BatchNorm layers are re-estimated over
            the last ``recalibrate_bn`` training batches
            (:func:`~lightning_bandlimit.layers.batchnorm.recalibrate_batchnorm`: forward passes in train
            mode without gradients, the random state untouched; under DDP the ranks' estimates are
            averaged). The running averages otherwise describe the
            old compression, and at a fixed compression they lag behind the weights. Training
            itself normalises with batch statistics, so the re-estimate waits until the running
            ones are used (a checkpoint saved mid-epoch after a change still holds the old
            ones). While the compression stays 0 the model is the plain one and its running
            statistics are the plain model's: then no batch is kept and nothing is re-estimated.
            The time
            spent is logged as ``BandLimit/bn_recalibration_seconds`` (cumulative). ``0`` turns
            it off.
        bn_forward: how to run the model on a training batch for the re-estimate,
            ``bn_forward(pl_module, batch)``; default: ``pl_module(batch[0])`` for a list or
            tuple, ``pl_module(batch)`` for a tensor.

    Raises:
        ValueError: if ``compression`` is outside ``[0, 1)`` or ``recalibrate_bn`` is negative.
        TypeError: if ``compression`` is not a real number, ``recalibrate_bn`` not an int, a
            flag not a bool, a pattern argument not a string or a sequence of strings, or
            ``bn_forward`` not callable.

    Example:
        >>> from lightning_bandlimit.models import ImageClassifier
        >>> from lightning_bandlimit.data import SyntheticImageDataModule
        >>> model = ImageClassifier("small_cnn", width=8)
        >>> trainer = pl.Trainer(
        ...     callbacks=[BandLimit(compression=0.5)], max_steps=2, limit_val_batches=1,
        ...     logger=False, enable_checkpointing=False, enable_progress_bar=False,
        ...     enable_model_summary=False,
        ... )
        >>> trainer.fit(model, SyntheticImageDataModule(train_size=16, val_size=8, batch_size=8))
        >>> type(model.backbone[0]).__name__, model.backbone[0].compression
        ('BandLimitedConv2d', 0.5)
    """

    def __init__(
        self,
        compression: float = 0.5,
        include: Patterns = None,
        exclude: Patterns = None,
        pointwise: bool = False,
        restore_on_teardown: bool = False,
        memory_lean: bool = True,
        recalibrate_bn: int = 8,
        bn_forward: Forward | None = None,
    ) -> None:
        super().__init__()
        self._compression = check_compression(compression)
        self.include = normalize_patterns("include", include)
        self.exclude = normalize_patterns("exclude", exclude)
        self.pointwise = check_bool("pointwise", pointwise)
        self.restore_on_teardown = check_bool("restore_on_teardown", restore_on_teardown)
        self.memory_lean = check_bool("memory_lean", memory_lean)
        check_int("recalibrate_bn", recalibrate_bn, minimum=0)  # a number of batches; 0: off
        if bn_forward is not None and not callable(bn_forward):
            raise TypeError(
                f"bn_forward must be callable as bn_forward(pl_module, batch), got {bn_forward!r}"
            )
        self.recalibrate_bn = recalibrate_bn
        self.bn_forward = bn_forward
        self.bn_recalibration_seconds = 0.0
        self.bn_recalibrations = 0
        self._recent: RecentBatches | None = None
        self._bn_stale = False
        self._layers: list[BandLimitedConvNd] = []
        self._converted: list[nn.Module] = []

    @property
    def state_key(self) -> str:
        return self._generate_state_key(include=self.include, exclude=self.exclude)

    @property
    def compression(self) -> float:
        """The compression applied to the managed layers; setting it updates them at once."""
        return self._compression

    @compression.setter
    def compression(self, value: float) -> None:
        value = check_compression(value)
        if value != self._compression:
            self._bn_stale = True
        self._compression = value
        for layer in self._layers:
            layer.compression = self._compression

    @property
    def layers(self) -> list[BandLimitedConvNd]:
        """The band-limited layers this callback manages (empty before ``setup``)."""
        return list(self._layers)

    @property
    def achieved_compression(self) -> float | None:
        """Mean rate applied by the managed layers in their last forward (``None`` before)."""
        rates = [
            layer.achieved_compression for layer in self._layers if layer.achieved_compression is not None
        ]
        return sum(rates) / len(rates) if rates else None

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self._layers:  # a second stage of the same Trainer: already converted
            return
        before = {id(m): type(m) for m in pl_module.modules()}
        bandlimit(
            pl_module,
            self._compression,
            include=self.include,
            exclude=self.exclude,
            pointwise=self.pointwise,
            memory_lean=self.memory_lean,
        )
        self._layers = [
            m for _, m in bandlimited_layers(pl_module, include=self.include, exclude=self.exclude)
        ]
        self._converted = [m for m in pl_module.modules() if type(m) is not before.get(id(m), type(m))]
        self.compression = self._compression
        self._bn_stale = False
        self._setup_bn(pl_module)
        count = len(self._layers)
        same_everywhere = trainer.strategy.reduce_boolean_decision(
            count == trainer.strategy.broadcast(count), all=True
        )
        if not same_everywhere:
            raise RuntimeError(
                f"BandLimit: ranks band-limited different numbers of layers (rank "
                f"{trainer.global_rank}: {count}); every rank must build the same model"
            )
        if count == 0:
            rank_zero_warn(
                f"BandLimit found no convolution to band-limit in {type(pl_module).__name__} "
                f"(include={self.include}, exclude={self.exclude}, pointwise={self.pointwise}); "
                "training runs with plain convolutions"
            )

    def _setup_bn(self, pl_module: pl.LightningModule) -> None:
        self._recent = None
        if not self.recalibrate_bn or not self._layers or not batchnorm_modules(pl_module):
            return
        if self.bn_forward is None and type(pl_module).forward in (
            nn.Module.forward,
            pl.LightningModule.forward,
        ):
            rank_zero_warn(
                f"{type(self).__name__}: {type(pl_module).__name__} defines no forward(), so BatchNorm "
                "statistics cannot be re-estimated after compression changes; pass "
                "bn_forward=lambda module, batch: ... (or recalibrate_bn=0 to silence this)"
            )
            return
        self._recent = RecentBatches(self.recalibrate_bn)

    def _bn_follows(self) -> bool:
        """Whether the running statistics need a re-estimate: the compression changed since the
        last one, or is above 0 (at 0 the layers are ``nn.Conv2d``'s exact twins)."""
        return self._bn_stale or self._compression > 0

    def _recalibrate_bn(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Re-estimate BatchNorm statistics over the recent training batches."""
        if self._recent is None or not self._bn_follows():
            return
        batches = list(self._recent.on(pl_module.device))
        if not batches:
            return
        started = time.perf_counter()
        recalibrate_batchnorm(pl_module, batches, forward=self.bn_forward)
        if trainer.world_size > 1:
            for module in batchnorm_modules(pl_module):
                for buffer in (module.running_mean, module.running_var):
                    buffer.copy_(trainer.strategy.reduce(buffer.clone(), reduce_op="mean"))
        self.bn_recalibration_seconds += time.perf_counter() - started
        self.bn_recalibrations += 1
        self._bn_stale = False
        if not self._bn_follows():
            self._recent.clear()  # back at compression 0: the batches are not needed again

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if (
            self._recent is not None
            and self._bn_follows()
            and self._needed_soon(trainer, pl_module, batch_idx)
        ):
            self._recent.append(batch)
        if self._should_log(trainer):
            self._log(pl_module, on_step=True)

    def _needed_soon(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch_idx: int) -> bool:
        """Whether a batch may be among the last ``recalibrate_bn`` before a re-estimate. On an
        accelerator the kept batches are host copies (no device memory): all are kept; on a CPU
        they are the job's own memory: only those a re-estimate will read."""
        if pl_module.device.type != "cpu":
            return True
        left = batches_to_next_validation_or_end(trainer, batch_idx)
        return left is None or left < self.recalibrate_bn

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking and trainer.state.fn == "fit":
            self._recalibrate_bn(trainer, pl_module)

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._bn_stale:  # changed since the last validation: an end-of-epoch checkpoint is consistent too
            self._recalibrate_bn(trainer, pl_module)

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._bn_stale:  # changed after the last validation: the final model is consistent too
            self._recalibrate_bn(trainer, pl_module)

    def _should_log(self, trainer: pl.Trainer) -> bool:
        # Loggers only write every log_every_n_steps; calling self.log more often costs time.
        return trainer.global_step % max(1, trainer.log_every_n_steps) == 0

    @override
    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._log(pl_module, on_step=False)

    def _log(self, pl_module: pl.LightningModule, on_step: bool) -> None:
        if not self._layers:
            return
        name = type(self).__name__
        pl_module.log(f"{name}/compression", self._compression, on_step=on_step, on_epoch=not on_step)
        achieved = self.achieved_compression
        if achieved is not None:
            pl_module.log(f"{name}/achieved_compression", achieved, on_step=on_step, on_epoch=not on_step)
        if self.bn_recalibrations:
            pl_module.log(
                f"{name}/bn_recalibration_seconds",
                self.bn_recalibration_seconds,
                on_step=on_step,
                on_epoch=not on_step,
            )

    @override
    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        """A fit that raised: Lightning calls no ``teardown`` then, so this does. Without it, an
        error in a step left the adaptive callback's profile hooked into every later autograd
        operation of the process (a second out-of-memory error in its first step did)."""
        self.teardown(trainer, pl_module, str(trainer.state.stage or "fit"))

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.restore_on_teardown:
            for layer in self._converted:
                unbandlimit(layer)
            self._layers, self._converted = [], []

    @override
    def state_dict(self) -> dict[str, Any]:
        # include/exclude/pointwise are informational: they let a checkpoint be re-band-limited
        # outside a Trainer (e.g. by the robustness recipe); loading never changes them.
        return {
            "compression": self._compression,
            "include": list(self.include) if self.include else None,
            "exclude": list(self.exclude) if self.exclude else None,
            "pointwise": self.pointwise,
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.compression = state_dict.get("compression", self._compression)
