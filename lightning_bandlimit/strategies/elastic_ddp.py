"""``ElasticDDPStrategy``: DDP for a job whose number of processes changes between restarts.

A job launched by ``torchrun --nnodes=MIN:MAX`` (or relaunched with other ``devices``) restarts
every worker on a membership change and resumes from its latest checkpoint. On such a resume
this strategy (a thin Lightning wrapper over the modules named) continues as if planned for the
new size:

* **Checkpoint** (``elastic_resume``): the configuration the run was planned with (world size,
  per-device batch, accumulation, LR, momentum / betas / eps), the one applied, the samples
  seen and the data position; a checkpoint this run cannot continue is refused before any write.
* **Rule** (``elastic_resize``): on a start with another world size (or accumulation), a
  :class:`~lightning_bandlimit.strategies.ScalingRule` maps the reference to the new size,
  applied *after* Lightning restored the optimizer and schedulers, multiplicatively (schedules
  continue on the rescaled curve; resizes never compound). ``KeepGlobalBatch`` sets
  ``trainer.accumulate_grad_batches``. The event is logged (``ElasticDDPStrategy/*``).
* **Data** (``elastic_data``): the training sampler becomes an
  :class:`~lightning_bandlimit.strategies.ElasticSampler`: the rest of the epoch is
  re-partitioned over the new ranks, each sample exactly once.
* **Schedule**: each :class:`~lightning_bandlimit.strategies.SampleSchedule` advances by the
  samples of every optimizer step (or AdaScale's progress, ``adascale``), not by steps.
* **Stability guard**: after a resize a :class:`~lightning_bandlimit.strategies.StabilityGuard`
  watches the loss; on divergence model, optimizer and schedulers roll back to the resize
  (``elastic_resize.Snapshot``) and the rule is retried with a damped factor.
* **CPU threads**: each process uses ``cores // local processes`` intra-op threads.

* **Faults** (``preemption``): while training, SIGTERM only sets a flag; at each optimizer-step
  boundary the ranks agree on it (one ``reduce``) and all stop at that step with exit status 143
  (a failure to torchrun, so it restarts the group). Checkpoints are written by
  :class:`~lightning_bandlimit.callbacks.checkpoint_io.DurableCheckpointIO` unless another
  ``checkpoint_io`` is given, and at training start every rank must have resumed the same step.

Checkpointing often enough, and on torchrun's SIGTERM, is the job of
:class:`~lightning_bandlimit.callbacks.ElasticCheckpoint`; ``trainer.fit(..., ckpt_path="last")``
resumes from it. Registered as ``Trainer(strategy="elastic_ddp")`` when this package is imported.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.fabric.plugins.environments import TorchElasticEnvironment
from lightning.pytorch.strategies import DDPStrategy, StrategyRegistry
from lightning.pytorch.trainer.states import RunningStage
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from typing_extensions import override

from lightning_bandlimit.callbacks.checkpoint_io import DurableCheckpointIO
from lightning_bandlimit.strategies._lightning import (
    LauncherHook,
    check_lightning_shapes,
    loader_with_sampler,
    set_batches_done_this_epoch,
)
from lightning_bandlimit.strategies.adascale import AdaScaleGain, GradientNormState, gradient_norm_hook
from lightning_bandlimit.strategies.elastic_data import (
    batches_done_this_epoch,
    elastic_sampler_for,
    restore_position,
)
from lightning_bandlimit.strategies.elastic_resize import (
    Rewarm,
    Snapshot,
    apply_config,
    resize_metrics,
    schedule_base_lr,
)
from lightning_bandlimit.strategies.elastic_resume import (
    CHECKPOINT_KEY,
    ResumeState,
    check_optimizer_states,
    check_resumable,
)
from lightning_bandlimit.strategies.elastic_sampler import ElasticSampler
from lightning_bandlimit.strategies.exact_global_batch import ExactGlobalBatch, MicroBatchPlan
from lightning_bandlimit.strategies.join_deadline import JoinDeadline
from lightning_bandlimit.strategies.preemption import Preemption
from lightning_bandlimit.strategies.scaling import (
    AdaScale,
    ScalingRule,
    TrainingConfig,
    default_rule,
    read_optimizer,
)
from lightning_bandlimit.strategies.schedules import SampleSchedule
from lightning_bandlimit.strategies.stability import StabilityGuard
from lightning_bandlimit.utils.validation import check_int, check_real

__all__ = ["ElasticDDPStrategy", "register_elastic_strategies"]


class ElasticDDPStrategy(LauncherHook, DDPStrategy):
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
        join_timeout: seconds within which the process group must form (every rank connected)
            under torchrun; past it the process exits with status 75 so that torchrun restarts the
            group (a node lost during the rendezvous would otherwise hold the others for the whole
            process-group ``timeout``, 30 minutes by default). ``None``: no bound.
        **kwargs: passed to ``DDPStrategy``; ``checkpoint_io`` defaults to
            :class:`~lightning_bandlimit.callbacks.checkpoint_io.DurableCheckpointIO`.

    Raises:
        RuntimeError: at training start, if the ranks resumed different checkpoints (before any
            step; torchrun restarts the group).
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
        join_timeout: float | None = 180.0,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("checkpoint_io", DurableCheckpointIO())
        super().__init__(**kwargs)
        if per_device_batch is not None:
            check_int("per_device_batch", per_device_batch, minimum=1)
        if cpu_threads is not None:
            check_int("cpu_threads", cpu_threads, minimum=0)  # None: auto, 0: leave torch alone
        if join_timeout is not None:
            join_timeout = check_real("join_timeout", join_timeout, minimum=0.0, min_open=True)
        if rule is not None and not isinstance(rule, ScalingRule):
            raise TypeError(f"rule must be a ScalingRule, got {type(rule).__name__}")
        if isinstance(rule, ExactGlobalBatch) and per_device_batch is not None:
            raise ValueError(
                f"ElasticDDPStrategy: {rule!r} chooses the per-device micro-batch for each world size, so "
                f"per_device_batch must be None, got {per_device_batch}"
            )
        self.rule = rule
        self.per_device_batch = per_device_batch
        self.guard: StabilityGuard | None = StabilityGuard() if guard is True else (guard or None)
        self.cpu_threads = cpu_threads
        self.seed = seed
        self.join_timeout = join_timeout
        self.reference: TrainingConfig | None = None
        self.applied: TrainingConfig | None = None
        self.samples_seen = 0
        self.resized_from: int | None = None
        self.sampler: ElasticSampler | None = None
        self.rollbacks: list[dict[str, Any]] = []
        self._has_comm_hook = kwargs.get("ddp_comm_hook") is not None
        self._restored: ResumeState | None = None
        self._restored_path: str | None = None
        self._snapshot: Snapshot | None = None
        self._rewarm: Rewarm | None = None
        self._step_samples = 0
        self._pending_loss: torch.Tensor | None = None  # the loss of the last optimizer step
        self._last_loss: torch.Tensor | None = None  # the loss of the last micro-batch
        self._norms: GradientNormState | None = None
        self._adascale = AdaScaleGain()
        self._launched_accumulation: int | None = None
        self.plan: MicroBatchPlan | None = None  # with ExactGlobalBatch: this world size's plan
        self._preemption = Preemption(agree=lambda local: self.reduce_boolean_decision(local, all=False))

    # ------------------------------------------------------------------ environment

    @override
    def before_launcher(self) -> None:
        # Under torchrun --nnodes=MIN:MAX the node count is only known at each (re)start.
        if isinstance(self.cluster_environment, TorchElasticEnvironment) and self.num_processes:
            world = self.cluster_environment.world_size()
            if world % self.num_processes == 0 and world // self.num_processes != self.num_nodes:
                self.num_nodes = world // self.num_processes
                self.set_world_ranks()

    @override
    def setup(self, trainer: pl.Trainer) -> None:
        check_lightning_shapes()
        super().setup(trainer)

    @override
    def teardown(self) -> None:
        self._preemption.uninstall()
        super().teardown()

    @override
    def setup_environment(self) -> None:
        elastic = isinstance(self.cluster_environment, TorchElasticEnvironment)
        with JoinDeadline(self.join_timeout if elastic else None, "the process group"):
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
            if self._has_comm_hook:
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
        if isinstance(self.rule, ExactGlobalBatch) and self.plan is None:
            self.plan = self.rule.plan(self.world_size)  # before any step: refuses an inexact size
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
        loader = loader_with_sampler(dataloader, sampler, micro)  # type: ignore[arg-type]
        # Tells Lightning the loader resumes mid-epoch (it warns otherwise); its position is the sampler's.
        loader.state_dict, loader.load_state_dict = sampler.state_dict, sampler.load_state_dict  # type: ignore[method-assign]
        return loader

    def _announce_plan(self, dataloader: object) -> None:
        assert isinstance(self.rule, ExactGlobalBatch) and self.plan is not None
        message = self.rule.describe(self.plan, getattr(dataloader, "batch_size", None))
        (rank_zero_info if self.plan.exact else rank_zero_warn)(f"ElasticDDPStrategy: {message}")

    # ------------------------------------------------------------------ checkpoints

    @override
    def load_checkpoint(
        self, checkpoint_path: str | Path, weights_only: bool | None = None
    ) -> dict[str, Any]:
        checkpoint = super().load_checkpoint(checkpoint_path, weights_only=weights_only)
        self._restored_path = str(checkpoint_path)
        saved = checkpoint.get(CHECKPOINT_KEY)
        self._restored = None if saved is None else ResumeState.from_checkpoint(saved, self._restored_path)
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
        check_optimizer_states(self.optimizers, checkpoint.get("optimizer_states", []), self._restored_path)
        try:
            super().load_optimizer_state_dict(checkpoint)
        except (KeyError, ValueError) as error:
            raise ValueError(
                f"ElasticDDPStrategy: the optimizer state in {self._restored_path} does not fit this run's "
                f"optimizer ({type(error).__name__}: {error}); it cannot resume it (nothing was written)"
            ) from None

    @override
    def save_checkpoint(
        self, checkpoint: dict[str, Any], filepath: str | Path, storage_options: Any = None
    ) -> None:
        if self.reference is not None and self.applied is not None:
            checkpoint[CHECKPOINT_KEY] = ResumeState(
                reference=self.reference,
                applied=self.applied,
                world_size=self.world_size,
                samples_seen=self.samples_seen,
                rule=type(self.rule).__name__ if self.rule is not None else None,
                sampler=self.sampler.state_dict() if self.sampler is not None else None,
                guard=self.guard.state_dict() if self.guard is not None else None,
                noise=dict(self._adascale.noise),
                rewarm=self._rewarm,
            ).to_checkpoint()
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

    @override
    def on_train_start(self) -> None:
        super().on_train_start()
        self._preemption.install()  # after Lightning's handlers, which it replaces while training
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
            lr=schedule_base_lr(optimizer, self._schedulers(trainer)),
        )
        restored = self._restored
        self._check_same_resume(trainer, 0 if restored is None else restored.samples_seen)
        if restored is None:
            self.reference = self.applied = launched
            if self.plan is not None and not self.plan.exact:  # the fallback's LR for this size
                self._apply_rule(trainer, damping=1.0)
            return
        self.reference, self.applied = restored.reference, restored.applied
        self.samples_seen = restored.samples_seen
        self._adascale = AdaScaleGain(restored.noise)
        self._rewarm = restored.rewarm
        if self.guard is not None and restored.guard:
            self.guard.load_state_dict(restored.guard)
        check_resumable(self.reference, launched, self.rule, self.world_size, self._restored_path)
        if self.sampler is not None:
            set_batches_done_this_epoch(trainer, batches_done_this_epoch(self.sampler))
        if restored.world_size == self.world_size and launched.accumulation == self.applied.accumulation:
            return
        self.resized_from = restored.world_size
        if self.guard is not None:
            self._snapshot = Snapshot.take(
                self.lightning_module,
                trainer.optimizers,
                self._schedulers(trainer),
                self.applied,
                trainer.accumulate_grad_batches,
                self.samples_seen,
            )
        self._launched_accumulation = launched.accumulation
        self._apply_rule(trainer, damping=1.0)
        if self.guard is not None:
            self.guard.start()

    def _check_same_resume(self, trainer: pl.Trainer, samples_seen: int) -> None:
        """Every rank must have resumed the same checkpoint (each picks ``last`` on its own)."""
        if self.world_size < 2:
            return
        mine = torch.tensor([trainer.global_step, samples_seen], dtype=torch.int64, device=self.root_device)
        everyone = self.all_gather(mine).reshape(self.world_size, 2).tolist()
        if any(row != everyone[0] for row in everyone):
            raise RuntimeError(
                "ElasticDDPStrategy: the ranks resumed different checkpoints (global step, samples seen "
                f"per rank: {everyone}; this rank read {self._restored_path}); stopping before any step so "
                "that torchrun restarts the group (nothing was written)"
            )

    @staticmethod
    def _schedulers(trainer: pl.Trainer) -> list[Any]:
        return [config.scheduler for config in trainer.lr_scheduler_configs]

    def _warn_step_schedulers(self, trainer: pl.Trainer) -> None:
        for scheduler in self._schedulers(trainer):
            if not isinstance(scheduler, SampleSchedule):
                rank_zero_warn(
                    f"ElasticDDPStrategy: {type(scheduler).__name__} counts steps, whose size changes with a "
                    "resize, so its curve will not be continuous in samples seen; use "
                    "lightning_bandlimit.strategies.SampleSchedule for elastic runs"
                )

    def _apply_rule(self, trainer: pl.Trainer, damping: float) -> None:
        assert self.reference is not None and self.applied is not None and self.rule is not None
        accumulation = None if self.rule.chooses_accumulation else self._launched_accumulation
        target = self.rule.adjust(self.reference, self.world_size, damping, accumulation=accumulation)
        apply_config(trainer.optimizers, self._schedulers(trainer), self.applied, target)
        trainer.accumulate_grad_batches = target.accumulation
        self._rewarm = Rewarm.after(target, target.lr / self.applied.lr, self.samples_seen)
        previous_world = self.applied.world_size
        self.applied = target
        self._log_resize(trainer, previous_world, target, damping)

    def _log_resize(self, trainer: pl.Trainer, previous: int, target: TrainingConfig, damping: float) -> None:
        _log_metrics(trainer, resize_metrics(previous, target, damping))
        rank_zero_info(
            f"ElasticDDPStrategy: world size {previous} -> {self.world_size} ({self.rule!r}, damping "
            f"{damping:g}): global batch {target.global_batch}, lr {target.lr:.4g}, momentum "
            f"{target.momentum}, betas {target.betas}, accumulation {target.accumulation}"
        )

    # ------------------------------------------------------------------ stability guard

    def _rollback(self, trainer: pl.Trainer) -> None:
        assert self._snapshot is not None and self.guard is not None
        snapshot = self._snapshot
        snapshot.restore(
            self.lightning_module, trainer.optimizers, self._schedulers(trainer), self.samples_seen
        )
        self.applied = snapshot.applied
        trainer.accumulate_grad_batches = snapshot.accumulation
        retry = len(self.rollbacks) + 1
        damping = self.guard.damping(retry)
        self.rollbacks.append(
            {
                "step": trainer.global_step,
                "retry": retry,
                "damping": damping,
                "samples_seen": self.samples_seen,
            }
        )
        rank_zero_warn(
            f"ElasticDDPStrategy: the loss diverged after the resize {self.resized_from} -> "
            f"{self.world_size}; rolled back to the state at the resize and retrying with damping {damping:g}"
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
        if self._step_samples == 0:  # an optimizer-step boundary: a SIGTERM stops every rank here
            self._preemption.check()
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
        for scheduler in self._schedulers(trainer):
            if isinstance(scheduler, SampleSchedule):
                scheduler.advance(progress)
        if isinstance(self.rule, AdaScale) and trainer.global_step % max(1, trainer.log_every_n_steps) == 0:
            metrics = {"ElasticDDPStrategy/gain": self.gain}
            noise = self._adascale.noise
            if noise.get("mu2", 0) > 0:
                metrics["ElasticDDPStrategy/noise_scale"] = noise["trace"] / noise["mu2"]
            _log_metrics(trainer, metrics)
        return output

    def _rewarm_factor(self) -> float:
        if self._rewarm is None:
            return 1.0
        if self._rewarm.finished(self.samples_seen):
            self._rewarm = None
            return 1.0
        return self._rewarm.factor(self.samples_seen)

    def _adascale_gain(self) -> float:
        """Update the gradient statistics from this backward and return the gain (1 unless AdaScale)."""
        if not isinstance(self.rule, AdaScale):
            return 1.0
        assert self.reference is not None
        batch = self._batch_size() * self.lightning_module.trainer.accumulate_grad_batches
        if self._norms is not None and self._norms.buckets:
            local = self.reduce(self._norms.local_sq.to(self.root_device, torch.float64), reduce_op="mean")
            self._adascale.observe(
                float(local), float(self._norms.global_sq), self.world_size, batch, self.rule.smoothing
            )
            self._norms.reset()
        return self._adascale.update(
            self.world_size * batch / self.reference.global_batch, self.reference.global_batch
        )

    @property
    def gain(self) -> float:
        """AdaScale's last LR gain (1 for other rules)."""
        return self._adascale.gain


def _log_metrics(trainer: pl.Trainer, metrics: dict[str, float]) -> None:
    for logger in trainer.loggers:
        logger.log_metrics(metrics, step=trainer.global_step)


def register_elastic_strategies() -> None:
    """Register ``"elastic_ddp"`` with Lightning's strategy registry (idempotent).

    Example:
        >>> register_elastic_strategies()
        >>> "elastic_ddp" in StrategyRegistry
        True
    """
    if CHECKPOINT_KEY not in StrategyRegistry:
        StrategyRegistry.register(
            CHECKPOINT_KEY,
            ElasticDDPStrategy,
            description="DDP that rescales the optimizer by rule after a resize",
            start_method="popen",
        )


register_elastic_strategies()
