"""``ElasticDDPStrategy``: DDP for a job whose number of processes changes between restarts.

A job launched by ``torchrun --nnodes=MIN:MAX`` (or simply relaunched with other ``devices``)
restarts every worker on a membership change and resumes from its latest checkpoint. On such a
resume this strategy makes training continue as if it had been planned for the new size:

* **Reference configuration.** Every checkpoint records the configuration the run was planned
  with (world size, per-device batch, accumulation, LR, momentum / betas / eps, from the first
  run on), the configuration currently applied, the samples seen and the data position.
* **Rule.** On a start with another world size (or accumulation), a
  :class:`~lightning_bandlimit.strategies.ScalingRule` maps the reference to the new size; the
  change is applied *after* Lightning restored the optimizer and schedulers, multiplicatively
  (group LRs, ``initial_lr`` and schedulers' ``base_lrs`` alike), so a schedule continues on the
  rescaled curve and resizes never compound. ``KeepGlobalBatch`` sets
  ``trainer.accumulate_grad_batches``. The event is logged (``ElasticDDPStrategy/*``).
* **Data.** The training sampler becomes an :class:`~lightning_bandlimit.strategies.ElasticSampler`
  whose position is saved with the checkpoint: the rest of the current epoch is re-partitioned
  over the new ranks, each sample exactly once.
* **Schedule.** Each :class:`~lightning_bandlimit.strategies.SampleSchedule` is advanced by the
  samples of every optimizer step (or by AdaScale's progress), so the LR curve is a function of
  samples seen, not of steps whose size changes.
* **Stability guard.** After a resize a :class:`~lightning_bandlimit.strategies.StabilityGuard`
  watches the loss; on divergence the model, optimizer and schedulers are rolled back to their
  state at the resize and the rule is retried with a damped factor.
* **CPU threads.** On CPU each process uses ``cores // local processes`` intra-op threads,
  re-evaluated at every (re)start.

Checkpointing often enough, and on the SIGTERM torchrun sends, is the job of
:class:`~lightning_bandlimit.callbacks.ElasticCheckpoint`; ``trainer.fit(..., ckpt_path="last")``
resumes from it. Registered as ``Trainer(strategy="elastic_ddp")`` when this package is imported.
"""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.fabric.plugins.environments import TorchElasticEnvironment
from lightning.pytorch.strategies import DDPStrategy, StrategyRegistry
from lightning.pytorch.trainer.states import RunningStage
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.data import _update_dataloader
from lightning_utilities.core.apply_func import apply_to_collection
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, RandomSampler, SequentialSampler
from typing_extensions import override

from lightning_bandlimit.strategies.adascale import GradientNormState, gradient_norm_hook
from lightning_bandlimit.strategies.elastic_sampler import ElasticSampler
from lightning_bandlimit.strategies.scaling import (
    AdaScale,
    KeepGlobalBatch,
    ScalingRule,
    TrainingConfig,
    adascale_gain,
    apply_to_optimizer,
    default_rule,
    gradient_noise_statistics,
    read_optimizer,
)
from lightning_bandlimit.strategies.schedules import SampleSchedule
from lightning_bandlimit.strategies.stability import StabilityGuard

__all__ = ["ElasticDDPStrategy", "register_elastic_strategies"]

_KEY = "elastic_ddp"
_FORMAT = 2


class ElasticDDPStrategy(DDPStrategy):
    """DDP that rescales hyperparameters by rule, keeps data position and schedule across resizes.

    Args:
        rule: the scaling rule; ``None`` picks :func:`default_rule` for the (first) optimizer:
            square-root for Adam-like optimizers, linear for SGD. Kept by the first run: a
            resumed run uses the rule given at relaunch.
        per_device_batch: samples per process per micro-batch; ``None`` reads the training
            dataloader's ``batch_size``.
        guard: the :class:`StabilityGuard` watching each resize; ``True`` for the default one,
            ``False`` to trust the rule blindly.
        cpu_threads: intra-op threads per process on CPU; ``None`` for the cores available to
            this process divided by the local processes, ``0`` to leave torch's setting alone.
        seed: seed of the :class:`ElasticSampler`'s per-epoch permutations (used when the
            training loader shuffles); ``None``: the seed of the ``DistributedSampler`` Lightning
            would have used (from ``seed_everything``), else 0.
        **kwargs: passed to ``DDPStrategy``.

    Raises:
        ValueError: for an out-of-range argument; at training start (before any step, so no
            checkpoint is written) for a checkpoint that cannot continue here: a rule that does not
            apply to its optimizer, another per-device batch, another training-set size, or
            (from :meth:`load_model_state_dict`) a different model.

    Example:
        >>> trainer = pl.Trainer(strategy="elastic_ddp", accelerator="cpu", devices=1, logger=False)
        >>> type(trainer.strategy).__name__
        'ElasticDDPStrategy'
    """

    #: read by models that build a :class:`SampleSchedule` (it advances them by samples seen)
    advances_sample_schedules = True

    def __init__(
        self,
        rule: ScalingRule | None = None,
        per_device_batch: int | None = None,
        guard: StabilityGuard | bool = True,
        cpu_threads: int | None = None,
        seed: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if per_device_batch is not None and per_device_batch < 1:
            raise ValueError(f"per_device_batch must be at least 1, got {per_device_batch}")
        if cpu_threads is not None and cpu_threads < 0:
            raise ValueError(
                f"cpu_threads must be None (auto), 0 (leave alone) or positive, got {cpu_threads}"
            )
        if rule is not None and not isinstance(rule, ScalingRule):
            raise TypeError(f"rule must be a ScalingRule, got {type(rule).__name__}")
        self.rule = rule
        self.per_device_batch = per_device_batch
        self.guard: StabilityGuard | None = StabilityGuard() if guard is True else (guard or None)
        self.cpu_threads = cpu_threads
        self.seed = seed
        self.reference: TrainingConfig | None = None
        self.applied: TrainingConfig | None = None
        self.samples_seen = 0
        self.resized_from: int | None = None
        self.sampler: ElasticSampler | None = None
        self.rollbacks: list[dict[str, Any]] = []
        self.gain = 1.0
        self._restored: dict[str, Any] | None = None
        self._restored_path: str | None = None
        self._snapshot: dict[str, Any] | None = None
        self._rewarm: tuple[int, int, float] | None = None  # (start samples, warmup samples, start factor)
        self._step_samples = 0
        self._pending_loss: torch.Tensor | None = None  # the loss of the last optimizer step
        self._last_loss: torch.Tensor | None = None  # the loss of the last micro-batch
        self._norms: GradientNormState | None = None
        self._noise: dict[str, float] = {}  # AdaScale: running tr(Sigma) and |G|^2
        self._launched_accumulation: int | None = None
        self._warned_no_statistics = False

    # ------------------------------------------------------------------ environment

    @override
    def _configure_launcher(self) -> None:
        # Under torchrun --nnodes=MIN:MAX the node count is only known at each (re)start.
        if isinstance(self.cluster_environment, TorchElasticEnvironment) and self.num_processes:
            world = self.cluster_environment.world_size()
            if world % self.num_processes == 0 and world // self.num_processes != self._num_nodes:
                self._num_nodes = world // self.num_processes
                self.set_world_ranks()
        super()._configure_launcher()

    @override
    def setup_environment(self) -> None:
        super().setup_environment()
        if self.root_device.type == "cpu" and self.cpu_threads != 0:
            local = int(os.environ.get("LOCAL_WORLD_SIZE", self.num_processes))
            threads = self.cpu_threads or max(1, len(os.sched_getaffinity(0)) // max(1, local))
            torch.set_num_threads(threads)
            rank_zero_info(f"ElasticDDPStrategy: {threads} CPU threads per process ({local} local processes)")

    @override
    def configure_ddp(self) -> None:
        super().configure_ddp()
        if isinstance(self.rule, AdaScale) and self.world_size > 1:
            if self._ddp_comm_hook is not None:
                raise ValueError(
                    "AdaScale measures gradients with its own DDP communication hook; drop ddp_comm_hook"
                )
            self._norms = GradientNormState()
            self.model.register_comm_hook(self._norms, gradient_norm_hook)  # type: ignore[union-attr, operator]

    # ------------------------------------------------------------------ data

    @override
    def process_dataloader(self, dataloader: object) -> object:
        dataloader = super().process_dataloader(dataloader)
        trainer = self.lightning_module.trainer if self.lightning_module is not None else None
        if trainer is None or trainer.state.stage != RunningStage.TRAINING:
            return dataloader
        sampler = self._elastic_sampler(dataloader)
        if self.sampler is not None:  # reloaded dataloaders keep the position
            sampler.load_state_dict(self.sampler.state_dict())
        elif self._restored is not None and "sampler" in self._restored:
            try:
                sampler.load_state_dict(self._restored["sampler"])
            except ValueError as error:
                raise ValueError(
                    f"ElasticDDPStrategy: the checkpoint {self._restored_path} saved a data position in a "
                    f"different training set ({error}); resume with the same dataset and shuffling, or start "
                    "a "
                    "new run in another directory"
                ) from None
        self.sampler = sampler
        loader = _update_dataloader(dataloader, sampler, mode=RunningStage.TRAINING)  # type: ignore[arg-type]
        # Tells Lightning the loader resumes mid-epoch (it warns otherwise); its position is the sampler's.
        loader.state_dict, loader.load_state_dict = sampler.state_dict, sampler.load_state_dict  # type: ignore[method-assign]
        return loader

    def _elastic_sampler(self, dataloader: object) -> ElasticSampler:
        if not isinstance(dataloader, DataLoader):
            raise ValueError(
                f"ElasticDDPStrategy needs a torch DataLoader for training to keep the data position, got "
                f"{type(dataloader).__name__}"
            )
        if isinstance(dataloader.dataset, IterableDataset):
            raise ValueError(
                "ElasticDDPStrategy needs a map-style dataset (with __len__) to keep the data position, got "
                "an IterableDataset"
            )
        if dataloader.batch_size is None:
            raise ValueError(
                "ElasticDDPStrategy needs DataLoader(batch_size=...) for training, not a custom batch_sampler"
            )
        original = dataloader.sampler
        seed = self.seed if self.seed is not None else 0
        if type(original) is DistributedSampler:
            shuffle = original.shuffle
            seed = original.seed if self.seed is None else self.seed
        elif isinstance(original, (RandomSampler, ElasticSampler)):
            shuffle = True if isinstance(original, RandomSampler) else original.shuffle
        elif isinstance(original, SequentialSampler):
            shuffle = False
        else:
            raise ValueError(
                f"ElasticDDPStrategy replaces the training sampler to keep the data position across resizes; "
                "it can replace RandomSampler, SequentialSampler or DistributedSampler, got "
                f"{type(original).__name__}"
            )
        return ElasticSampler(
            len(dataloader.dataset),  # type: ignore[arg-type]
            dataloader.batch_size,
            num_replicas=self.world_size,
            rank=self.global_rank,
            shuffle=shuffle,
            seed=seed,
            full_epoch_len=True,
        )

    # ------------------------------------------------------------------ checkpoints

    @override
    def load_checkpoint(
        self, checkpoint_path: str | Path, weights_only: bool | None = None
    ) -> dict[str, Any]:
        checkpoint = super().load_checkpoint(checkpoint_path, weights_only=weights_only)
        self._restored = checkpoint.get(_KEY)
        self._restored_path = str(checkpoint_path)
        return checkpoint

    @override
    def load_model_state_dict(self, checkpoint: Any, strict: bool = True) -> None:
        try:
            super().load_model_state_dict(checkpoint, strict=strict)
        except RuntimeError as error:
            raise RuntimeError(
                f"ElasticDDPStrategy: the checkpoint {self._restored_path} holds a different model than this "
                f"run's, so it cannot resume it (nothing was written). {error}"
            ) from None

    @override
    def load_optimizer_state_dict(self, checkpoint: Any) -> None:
        # torch fails with a bare KeyError when the optimizer family changed: say so first
        for optimizer, state in zip(self.optimizers, checkpoint.get("optimizer_states", [])):
            saved_groups = state.get("param_groups", [])
            if saved_groups:
                self._check_optimizer_family(
                    any("betas" in g for g in saved_groups), any("betas" in g for g in optimizer.param_groups)
                )
        try:
            super().load_optimizer_state_dict(checkpoint)
        except (KeyError, ValueError) as error:
            raise ValueError(
                f"ElasticDDPStrategy: the optimizer state in {self._restored_path} does not fit this run's "
                "optimizer "
                f"({type(error).__name__}: {error}); it cannot resume it (nothing was written)"
            ) from None

    @override
    def save_checkpoint(
        self, checkpoint: dict[str, Any], filepath: str | Path, storage_options: Any = None
    ) -> None:
        if self.reference is not None:
            checkpoint[_KEY] = {
                "format": _FORMAT,
                "reference": asdict(self.reference),
                "applied": asdict(self.applied) if self.applied is not None else None,
                "world_size": self.world_size,
                "samples_seen": self.samples_seen,
                "rule": type(self.rule).__name__ if self.rule is not None else None,
                "sampler": self.sampler.state_dict() if self.sampler is not None else None,
                "guard": self.guard.state_dict() if self.guard is not None else None,
                "noise": dict(self._noise),
                "rewarm": list(self._rewarm) if self._rewarm is not None else None,
            }
        super().save_checkpoint(checkpoint, filepath, storage_options)

    # ------------------------------------------------------------------ resize

    def _batch_size(self) -> int:
        if self.per_device_batch is not None:
            return self.per_device_batch
        if self.sampler is not None:
            return self.sampler.batch_size
        size = getattr(self.lightning_module.trainer.train_dataloader, "batch_size", None)
        if not isinstance(size, int) or size < 1:
            raise ValueError(
                "ElasticDDPStrategy could not read the per-device batch size from the training "
                f"dataloader (got {size!r}); pass per_device_batch="
            )
        return size

    def _reference_lr(self, trainer: pl.Trainer) -> float:
        """The schedule's base LR (the group's LR may be mid-warmup, even 0)."""
        for config in trainer.lr_scheduler_configs:
            if getattr(config.scheduler, "base_lrs", None):
                return float(config.scheduler.base_lrs[0])
        group = trainer.optimizers[0].param_groups[0]
        return float(group.get("initial_lr", group["lr"]))

    @override
    def on_train_start(self) -> None:
        super().on_train_start()
        trainer = self.lightning_module.trainer
        optimizer = trainer.optimizers[0]
        if self.rule is None:
            self.rule = default_rule(optimizer)
        self._warn_step_schedulers(trainer)
        launched = read_optimizer(
            optimizer,
            self.world_size,
            self._batch_size(),
            trainer.accumulate_grad_batches,
            lr=self._reference_lr(trainer),
        )
        if self._restored is None:
            self.reference = self.applied = launched
            return
        restored = self._restored
        self.reference = _config(restored["reference"])
        self.applied = _config(restored.get("applied") or restored["reference"])
        self.samples_seen = int(restored.get("samples_seen", 0))
        self._noise = {k: float(v) for k, v in (restored.get("noise") or {}).items()}
        rewarm = restored.get("rewarm")
        self._rewarm = (int(rewarm[0]), int(rewarm[1]), float(rewarm[2])) if rewarm else None
        if self.guard is not None and restored.get("guard"):
            self.guard.load_state_dict(restored["guard"])
        self._check_compatible(launched)
        self._rebase_epoch_progress(trainer)
        previous = int(restored["world_size"])
        if previous == self.world_size and launched.accumulation == self.applied.accumulation:
            return
        self.resized_from = previous
        if self.guard is not None:
            self._snapshot = self._take_snapshot(trainer)
        self._launched_accumulation = launched.accumulation
        self._apply_rule(trainer, damping=1.0)
        if self.guard is not None:
            self.guard.start()

    def _check_compatible(self, launched: TrainingConfig) -> None:
        assert self.reference is not None and self.rule is not None
        where = f"the checkpoint {self._restored_path}"
        if launched.per_device_batch != self.reference.per_device_batch:
            raise ValueError(
                f"ElasticDDPStrategy: {where} was planned with a per-device batch of "
                f"{self.reference.per_device_batch}, this run has {launched.per_device_batch}; the rules "
                "rescale for a "
                "change in the number of processes, so keep the per-device batch (nothing was written)"
            )
        self._check_optimizer_family(self.reference.betas is not None, launched.betas is not None)
        try:
            self.rule.adjust(self.reference, self.world_size, accumulation=launched.accumulation)
        except ValueError as error:
            raise ValueError(
                f"ElasticDDPStrategy: the rule {self.rule!r} cannot apply to {where}: {error} (nothing was "
                "written)"
            ) from None

    def _check_optimizer_family(self, saved_has_betas: bool, has_betas: bool) -> None:
        if saved_has_betas != has_betas:
            kinds = {True: "an Adam-family optimizer", False: "an optimizer without betas"}
            raise ValueError(
                f"ElasticDDPStrategy: the checkpoint {self._restored_path} was written with "
                f"{kinds[saved_has_betas]}, "
                f"this run uses {kinds[has_betas]}; it cannot resume it (nothing was written)"
            )

    def _rebase_epoch_progress(self, trainer: pl.Trainer) -> None:
        """Re-count the resumed epoch's finished batches in batches of *this* world size.

        The loader's length is this rank's whole epoch at the new size (``full_epoch_len``) but it
        yields only what is left, so Lightning must believe exactly ``whole - left`` batches of
        the epoch are done, or it ends the epoch early or late.
        """
        if self.sampler is None:
            return
        batch = self.sampler.batch_size
        whole = math.ceil(self.sampler.remaining(0) / batch)
        left = math.ceil(self.sampler.remaining() / batch)
        epoch_loop = trainer.fit_loop.epoch_loop
        current = epoch_loop.batch_progress.current
        done = whole - left
        # reset() then adds one completed batch when the checkpoint was written at a batch's end
        # and sets ready = started = processed = completed to it.
        completed = done - 1 if epoch_loop.restarted_on_train_batch_end else done
        current.ready = current.started = current.processed = current.completed = completed

    def _warn_step_schedulers(self, trainer: pl.Trainer) -> None:
        for config in trainer.lr_scheduler_configs:
            if not isinstance(config.scheduler, SampleSchedule):
                rank_zero_warn(
                    f"ElasticDDPStrategy: {type(config.scheduler).__name__} counts steps, whose size changes "
                    "with a "
                    "resize, so its curve will not be continuous in samples seen; use "
                    "lightning_bandlimit.strategies.SampleSchedule for elastic runs"
                )

    def _apply_rule(self, trainer: pl.Trainer, damping: float) -> None:
        assert self.reference is not None and self.applied is not None and self.rule is not None
        accumulation = None if isinstance(self.rule, KeepGlobalBatch) else self._launched_accumulation
        target = self.rule.adjust(self.reference, self.world_size, damping, accumulation=accumulation)
        ratio = target.lr / self.applied.lr
        for opt in trainer.optimizers:
            apply_to_optimizer(opt, self.applied, target)
        for config in trainer.lr_scheduler_configs:
            if hasattr(config.scheduler, "base_lrs"):
                config.scheduler.base_lrs = [lr * ratio for lr in config.scheduler.base_lrs]
                config.scheduler._last_lr = [g["lr"] for g in config.scheduler.optimizer.param_groups]
        trainer.accumulate_grad_batches = target.accumulation
        self._rewarm = (
            (self.samples_seen, target.warmup_samples, 1.0 / ratio)
            if target.warmup_samples and ratio > 1
            else None
        )
        previous_world = self.applied.world_size
        self.applied = target
        self._log_resize(trainer, previous_world, target, damping)

    def _log_resize(self, trainer: pl.Trainer, previous: int, target: TrainingConfig, damping: float) -> None:
        metrics = {
            "ElasticDDPStrategy/world_size": float(self.world_size),
            "ElasticDDPStrategy/previous_world_size": float(previous),
            "ElasticDDPStrategy/global_batch": float(target.global_batch),
            "ElasticDDPStrategy/lr": target.lr,
            "ElasticDDPStrategy/accumulation": float(target.accumulation),
            "ElasticDDPStrategy/damping": damping,
        }
        if target.momentum is not None:
            metrics["ElasticDDPStrategy/momentum"] = target.momentum
        if target.betas is not None:
            metrics["ElasticDDPStrategy/beta1"] = target.betas[0]
            metrics["ElasticDDPStrategy/beta2"] = target.betas[1]
        _log_metrics(trainer, metrics)
        rank_zero_info(
            f"ElasticDDPStrategy: world size {previous} -> {self.world_size} ({self.rule!r}, damping "
            f"{damping:g}): "
            f"global batch {target.global_batch}, lr {target.lr:.4g}, momentum {target.momentum}, betas "
            f"{target.betas}, accumulation {target.accumulation}"
        )

    # ------------------------------------------------------------------ stability guard

    def _take_snapshot(self, trainer: pl.Trainer) -> dict[str, Any]:
        def to_cpu(obj: Any) -> Any:  # copies: state_dict tensors alias the live ones
            return apply_to_collection(obj, torch.Tensor, lambda t: t.detach().to("cpu", copy=True))

        return {
            "model": to_cpu(self.lightning_module.state_dict()),
            "optimizers": [to_cpu(opt.state_dict()) for opt in trainer.optimizers],
            "schedulers": [to_cpu(c.scheduler.state_dict()) for c in trainer.lr_scheduler_configs],
            "applied": self.applied,
            "accumulation": trainer.accumulate_grad_batches,
            "samples_seen": self.samples_seen,
        }

    def _rollback(self, trainer: pl.Trainer) -> None:
        assert self._snapshot is not None and self.guard is not None
        snapshot = self._snapshot
        self.lightning_module.load_state_dict(snapshot["model"])
        for opt, state in zip(trainer.optimizers, snapshot["optimizers"]):
            opt.load_state_dict(copy.deepcopy(state))
        for opt in trainer.optimizers:
            opt.zero_grad(set_to_none=True)
        # The data consumed since the resize is not given back (its updates are discarded); the
        # schedule moves on by it too, so that it stays in step with the data position.
        for config, state in zip(trainer.lr_scheduler_configs, snapshot["schedulers"]):
            config.scheduler.load_state_dict(copy.deepcopy(state))
            if isinstance(config.scheduler, SampleSchedule):
                config.scheduler.advance(self.samples_seen - snapshot["samples_seen"])
        self.applied = snapshot["applied"]
        trainer.accumulate_grad_batches = snapshot["accumulation"]
        retry = len(self.rollbacks) + 1
        damping = self.guard.damping(retry)
        event = {
            "step": trainer.global_step,
            "retry": retry,
            "damping": damping,
            "samples_seen": self.samples_seen,
        }
        self.rollbacks.append(event)
        rank_zero_warn(
            f"ElasticDDPStrategy: the loss diverged after the resize {self.resized_from} -> "
            f"{self.world_size}; rolled "
            f"back to the state at the resize and retrying with damping {damping:g}"
            + (" (no rescaling)" if damping == 0 else "")
        )
        _log_metrics(trainer, {"ElasticDDPStrategy/rollback": float(retry)})
        self._apply_rule(trainer, damping=damping)
        self.guard.start()

    def _observe_loss(self, trainer: pl.Trainer) -> None:
        if self.guard is None or self._pending_loss is None:
            return
        was_watching = self.guard.watching
        verdict = self.guard.record(float(self._pending_loss))
        self._pending_loss = None
        if not was_watching:
            return
        # every rank watches the same steps, so this collective lines up
        if self.reduce_boolean_decision(verdict == "diverged", all=False):
            if self.guard.watching:
                self.guard.stop()
            self._rollback(trainer)
        elif verdict == "stable":
            self._snapshot = None

    # ------------------------------------------------------------------ per step

    @override
    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        output = super().training_step(*args, **kwargs)
        loss = output.get("loss") if isinstance(output, dict) else output
        if isinstance(loss, torch.Tensor):
            self._last_loss = loss.detach()
        return output

    @override
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        super().on_train_batch_start(batch, batch_idx)
        if self.reference is None:
            return
        trainer = self.lightning_module.trainer
        self._observe_loss(trainer)
        if self.sampler is not None:
            before = self.sampler.consumed
            self.sampler.advance(1)
            samples = self.sampler.consumed - before
        else:
            samples = self.world_size * self._batch_size()
        self.samples_seen += samples
        self._step_samples += samples

    @override
    def optimizer_step(
        self, optimizer: Any, closure: Callable[[], Any], model: Any = None, **kwargs: Any
    ) -> Any:
        if self.reference is None or self.applied is None:
            return super().optimizer_step(optimizer, closure, model, **kwargs)
        groups = optimizer.param_groups
        scheduled = [g["lr"] for g in groups]

        def closure_with_factor() -> Any:
            result = closure()
            factor = self._rewarm_factor() * self._adascale_gain()
            if factor != 1.0:
                for group in groups:
                    group["lr"] = group["lr"] * factor
            return result

        try:
            output = super().optimizer_step(optimizer, closure_with_factor, model, **kwargs)
        finally:
            for group, lr in zip(groups, scheduled):
                group["lr"] = lr
        # the guard judges optimizer steps (checked at the next batch start, a window boundary)
        self._pending_loss, self._last_loss = self._last_loss, None
        progress = (
            self.gain * self.reference.global_batch if isinstance(self.rule, AdaScale) else self._step_samples
        )
        self._step_samples = 0
        trainer = self.lightning_module.trainer
        for config in trainer.lr_scheduler_configs:
            if isinstance(config.scheduler, SampleSchedule):
                config.scheduler.advance(progress)
        if isinstance(self.rule, AdaScale) and trainer.global_step % max(1, trainer.log_every_n_steps) == 0:
            metrics = {"ElasticDDPStrategy/gain": self.gain}
            if self._noise.get("mu2", 0) > 0:
                metrics["ElasticDDPStrategy/noise_scale"] = self._noise["trace"] / self._noise["mu2"]
            _log_metrics(trainer, metrics)
        return output

    def _rewarm_factor(self) -> float:
        if self._rewarm is None:
            return 1.0
        start, length, initial = self._rewarm
        done = (self.samples_seen - start) / length
        if done >= 1:
            self._rewarm = None
            return 1.0
        return initial + (1.0 - initial) * done

    def _adascale_gain(self) -> float:
        """Update the gradient statistics from this backward and return the gain (1 unless AdaScale)."""
        if not isinstance(self.rule, AdaScale):
            return 1.0
        assert self.reference is not None and self.applied is not None
        if self._norms is not None and self._norms.buckets:
            local = self._norms.local_sq.to(self.root_device, torch.float64)
            local = self.reduce(local, reduce_op="mean")
            sigma2, mu2 = gradient_noise_statistics(
                float(local), float(self._norms.global_sq), self.world_size
            )
            self._norms.reset()
            batch = self._batch_size() * self.lightning_module.trainer.accumulate_grad_batches
            smoothing = self.rule.smoothing
            for key, value in (("trace", sigma2 * batch), ("mu2", mu2)):
                old = self._noise.get(key)
                self._noise[key] = value if old is None else (1 - smoothing) * old + smoothing * value
        scale = self.world_size * self._batch_size() * self.lightning_module.trainer.accumulate_grad_batches
        scale /= self.reference.global_batch
        if math.isclose(scale, 1.0):
            self.gain = 1.0
        elif "trace" not in self._noise:
            self.gain = self._no_statistics(scale)
        else:
            self.gain = adascale_gain(
                self._noise["trace"] / self.reference.global_batch, self._noise["mu2"], scale
            )
        return self.gain

    def _no_statistics(self, scale: float) -> float:
        if not self._warned_no_statistics:
            self._warned_no_statistics = True
            rank_zero_warn(
                "ElasticDDPStrategy: AdaScale has no gradient statistics yet (they need 2+ processes); "
                f"training at scale {scale:g} with gain 1 until it has"
            )
        return 1.0


def _log_metrics(trainer: pl.Trainer, metrics: dict[str, float]) -> None:
    for logger in trainer.loggers:
        logger.log_metrics(metrics, step=trainer.global_step)


def _config(saved: dict[str, Any]) -> TrainingConfig:
    betas = saved.get("betas")
    return TrainingConfig(**{**saved, "betas": None if betas is None else (float(betas[0]), float(betas[1]))})


def register_elastic_strategies() -> None:
    """Register ``"elastic_ddp"`` with Lightning's strategy registry (idempotent).

    Example:
        >>> register_elastic_strategies()
        >>> "elastic_ddp" in StrategyRegistry
        True
    """
    if _KEY not in StrategyRegistry:
        StrategyRegistry.register(
            _KEY,
            ElasticDDPStrategy,
            description="DDP that rescales the optimizer by rule after a resize",
            start_method="popen",
        )


register_elastic_strategies()
