"""``ElasticDDPStrategy``: DDP for a job whose number of processes changes between restarts.

A job launched by ``torchrun --nnodes=MIN:MAX`` (or relaunched with other ``devices``) restarts
every worker on a membership change and resumes from its latest checkpoint; this strategy (a
thin Lightning wrapper over the modules named) continues as if planned for the new size:

* **Checkpoint** (``elastic_resume``): the planned configuration (world size, per-device batch,
  accumulation, LR, momentum / betas / eps), the one applied, the samples seen and the data
  position; a checkpoint this run cannot continue is refused before any write.
* **Rule** (``elastic_resize``): on a start with another world size (or accumulation), a
  :class:`~lightning_bandlimit.strategies.ScalingRule` maps the reference to the new size,
  applied multiplicatively after Lightning restored optimizer and schedulers (resizes never
  compound); the event is logged (``ElasticDDPStrategy/*``). The strategy asks the rule, never
  tests its type: ``rule.micro_batch_plan`` (``ExactGlobalBatch`` chooses micro-batch and
  accumulation), ``rule.gain_tracker`` (``AdaScale``'s LR gain, from a DDP communication hook).
* **Data** (``elastic_data``): the training sampler becomes an
  :class:`~lightning_bandlimit.strategies.ElasticSampler`: the rest of the epoch is
  re-partitioned over the new ranks, each sample exactly once. Each
  :class:`~lightning_bandlimit.strategies.SampleSchedule` advances by samples, not steps.
* **Stability guard** (``elastic_rollback``): after a resize a
  :class:`~lightning_bandlimit.strategies.StabilityGuard` watches the loss; on divergence model,
  optimizer and schedulers roll back to the resize and the rule is retried with a damped factor.
* **Faults** (``preemption``): SIGTERM only sets a flag; at each optimizer-step boundary the ranks
  agree on it (one ``reduce``) and all stop there with status 143 (torchrun restarts the group).
  :class:`~lightning_bandlimit.callbacks.checkpoint_io.DurableCheckpointIO` writes checkpoints
  unless another ``checkpoint_io`` is given; every rank must have resumed the same step.
* **Peers** (``peer_health``): a peer silent for ``hang_timeout`` ends every rank with status 75
  (torchrun restarts the group); a straggler is reported once (``drop_stragglers``: it leaves).
  The process group is closed at exit on every rank (``health.exit``). CPU: each process uses
  ``cores // local processes`` intra-op threads.

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
from lightning_bandlimit.health.exit import close_at_exit
from lightning_bandlimit.health.round_store import agent_store_shared, init_in_round_namespace
from lightning_bandlimit.strategies._lightning import (
    LauncherHook,
    check_lightning_shapes,
    process_group_settings,
    set_batches_done_this_epoch,
)
from lightning_bandlimit.strategies.elastic_data import (
    batches_done_this_epoch,
    elastic_loader,
    elastic_sampler_for,
    loader_batch_size,
    restore_position,
)
from lightning_bandlimit.strategies.elastic_guarded import GuardedResize, log_metrics
from lightning_bandlimit.strategies.elastic_resize import (
    Rewarm,
    Snapshot,
    apply_config,
    resize_message,
    resize_metrics,
    schedule_base_lr,
    step_schedule_warnings,
)
from lightning_bandlimit.strategies.elastic_resume import (
    CHECKPOINT_KEY,
    CheckedResume,
    ResumeState,
    check_resumable,
    check_same_checkpoint,
)
from lightning_bandlimit.strategies.elastic_rollback import RollbackWatch
from lightning_bandlimit.strategies.elastic_sampler import ElasticSampler
from lightning_bandlimit.strategies.join_deadline import JoinDeadline
from lightning_bandlimit.strategies.optimizer_config import read_optimizer
from lightning_bandlimit.strategies.peer_health import PeerHealth
from lightning_bandlimit.strategies.preemption import Preemption
from lightning_bandlimit.strategies.rules import (
    GainTracker,
    MicroBatchPlan,
    ScalingRule,
    TrainingConfig,
    default_rule,
)
from lightning_bandlimit.strategies.schedules import SampleSchedule
from lightning_bandlimit.strategies.stability import StabilityGuard
from lightning_bandlimit.utils.validation import check_int, check_real

__all__ = ["ElasticDDPStrategy", "register_elastic_strategies"]


class ElasticDDPStrategy(CheckedResume, LauncherHook, GuardedResize, PeerHealth, DDPStrategy):
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
        hang_timeout: seconds a peer may stop beating before the ranks name it and exit with
            status 75 (torchrun restarts the group); ``None``: the collective's own timeout.
        slow_factor, slow_steps: a rank whose forward takes over ``slow_factor`` times the
            others' median for ``slow_steps`` steps is reported once; ``None``: not watched.
        drop_stragglers: a reported straggler leaves: every rank stops at that step as on a
            SIGTERM (a checkpoint there, status 143) and the straggler ends its torchrun agent,
            so the group re-forms smaller (one process per node).
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
        hang_timeout: float | None = 60.0,
        slow_factor: float | None = 2.0,
        slow_steps: int = 20,
        drop_stragglers: bool = False,
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
        if rule is not None and rule.chooses_micro_batch and per_device_batch is not None:
            raise ValueError(
                f"ElasticDDPStrategy: {rule!r} chooses the per-device micro-batch for each world size, so "
                f"per_device_batch must be None, got {per_device_batch}"
            )
        self._init_health(hang_timeout, slow_factor, slow_steps, drop_stragglers)
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
        self._has_comm_hook = kwargs.get("ddp_comm_hook") is not None
        self._watch = RollbackWatch(self.guard) if self.guard is not None else None
        self._rewarm: Rewarm | None = None
        self._step_samples = 0
        self._last_loss: torch.Tensor | None = None  # the loss of the last micro-batch
        # what the rule measures while training (AdaScale: the LR gain); rebuilt if the rule is chosen later
        self._gain: GainTracker = rule.gain_tracker() if rule is not None else GainTracker()
        self._launched_accumulation: int | None = None
        self.plan: MicroBatchPlan | None = None  # for a rule that chooses the micro-batch: this size's plan
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
        self._stop_health()
        self._preemption.uninstall()
        super().teardown()

    @override
    def setup_environment(self) -> None:
        elastic = isinstance(self.cluster_environment, TorchElasticEnvironment)
        with JoinDeadline(self.join_timeout if elastic else None, "the process group"):
            super().setup_environment()
        close_at_exit()
        self._start_health()
        if self.root_device.type == "cpu" and self.cpu_threads != 0:
            local = int(os.environ.get("LOCAL_WORLD_SIZE", self.num_processes))
            threads = self.cpu_threads or max(1, len(os.sched_getaffinity(0)) // max(1, local))
            torch.set_num_threads(threads)
            rank_zero_info(f"ElasticDDPStrategy: {threads} CPU threads per process ({local} local processes)")

    @override
    def setup_distributed(self) -> None:
        if agent_store_shared() and not torch.distributed.is_initialized():  # see health/round_store.py
            self.set_world_ranks()
            backend, timeout = process_group_settings(self)
            device = self.root_device if self.root_device.type != "cpu" else None
            init_in_round_namespace(backend, self.global_rank, self.world_size, timeout, device)
        super().setup_distributed()  # the rest of Lightning's set-up (it sees the group formed)

    @override
    def configure_ddp(self) -> None:
        super().configure_ddp()
        self._gain.attach(self.model, self.world_size, self._has_comm_hook)
        self._attach_forward_timer()

    # ------------------------------------------------------------------ data

    @override
    def process_dataloader(self, dataloader: object) -> object:
        dataloader = super().process_dataloader(dataloader)
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

    # ------------------------------------------------------------------ checkpoints

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
                noise=dict(self._gain.noise),
                rewarm=self._rewarm,
            ).to_checkpoint()
        super().save_checkpoint(checkpoint, filepath, storage_options)

    # ------------------------------------------------------------------ resize

    def _batch_size(self) -> int:
        if self.per_device_batch is not None:
            return self.per_device_batch
        if self.sampler is not None:
            return self.sampler.batch_size
        return loader_batch_size(self.lightning_module.trainer.train_dataloader)

    @override
    def on_train_start(self) -> None:
        super().on_train_start()
        self._preemption.install()  # after Lightning's handlers, which it replaces while training
        trainer = self.lightning_module.trainer
        optimizer = trainer.optimizers[0]
        if self.rule is None:
            self.rule = default_rule(optimizer)
            self._gain = self.rule.gain_tracker()
        for message in step_schedule_warnings(self._schedulers(trainer)):
            rank_zero_warn(message)
        launched = read_optimizer(
            optimizer,
            self.world_size,
            self._batch_size(),
            trainer.accumulate_grad_batches,
            lr=schedule_base_lr(optimizer, self._schedulers(trainer)),
        )
        restored = self._restored
        if self.world_size > 1:
            mine = [trainer.global_step, 0 if restored is None else restored.samples_seen]
            everyone = self.all_gather(torch.tensor(mine, dtype=torch.int64, device=self.root_device))
            check_same_checkpoint(everyone.reshape(self.world_size, 2).tolist(), self._restored_path)
        if restored is None:
            self.reference = self.applied = launched
            if self.plan is not None and not self.plan.exact:  # the fallback's LR for this size
                self._apply_rule(trainer, damping=1.0)
            return
        self.reference, self.applied = restored.reference, restored.applied
        self.samples_seen = restored.samples_seen
        self._gain.load_noise(restored.noise)
        self._rewarm = restored.rewarm
        if self.guard is not None and restored.guard:
            self.guard.load_state_dict(restored.guard)
        check_resumable(self.reference, launched, self.rule, self.world_size, self._restored_path)
        if self.sampler is not None:
            set_batches_done_this_epoch(trainer, batches_done_this_epoch(self.sampler))
        if restored.world_size == self.world_size and launched.accumulation == self.applied.accumulation:
            return
        self.resized_from = restored.world_size
        if self._watch is not None:
            self._watch.arm(
                Snapshot.take(
                    self.lightning_module,
                    trainer.optimizers,
                    self._schedulers(trainer),
                    self.applied,
                    trainer.accumulate_grad_batches,
                    self.samples_seen,
                )
            )
        self._launched_accumulation = launched.accumulation
        self._apply_rule(trainer, damping=1.0)
        if self._watch is not None:
            self._watch.watch()

    @staticmethod
    def _schedulers(trainer: pl.Trainer) -> list[Any]:
        return [config.scheduler for config in trainer.lr_scheduler_configs]

    def _apply_rule(self, trainer: pl.Trainer, damping: float) -> None:
        assert self.reference is not None and self.applied is not None and self.rule is not None
        accumulation = None if self.rule.chooses_accumulation else self._launched_accumulation
        target = self.rule.adjust(self.reference, self.world_size, damping, accumulation=accumulation)
        apply_config(trainer.optimizers, self._schedulers(trainer), self.applied, target)
        trainer.accumulate_grad_batches = target.accumulation
        self._rewarm = Rewarm.after(target, target.lr / self.applied.lr, self.samples_seen)
        previous_world, self.applied = self.applied.world_size, target
        log_metrics(trainer, resize_metrics(previous_world, target, damping))
        rank_zero_info(resize_message(previous_world, target, self.rule, damping))

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
        trainer = self.lightning_module.trainer
        self._health_step(trainer.global_step)
        if self._step_samples == 0:  # an optimizer-step boundary: the ranks' forward times meet here
            self._health_step_end(trainer.global_step)
        if self.reference is None:
            return
        if self._step_samples == 0:  # a SIGTERM stops every rank here
            self._preemption.check()
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
    def backward(self, closure_loss: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        self._health_forward_end()
        return super().backward(closure_loss, *args, **kwargs)

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
            factor = self._rewarm_factor() * self._step_gain()
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
        if self._watch is not None:
            self._watch.step_loss(self._last_loss)
        self._last_loss = None
        progress = self._gain.progress(self._step_samples, self.reference.global_batch)
        self._step_samples = 0
        trainer = self.lightning_module.trainer
        for scheduler in self._schedulers(trainer):
            if isinstance(scheduler, SampleSchedule):
                scheduler.advance(progress)
        metrics = self._gain.metrics() if trainer.global_step % max(1, trainer.log_every_n_steps) == 0 else {}
        if metrics:
            log_metrics(trainer, metrics)
        return output

    def _rewarm_factor(self) -> float:
        if self._rewarm is not None and self._rewarm.finished(self.samples_seen):
            self._rewarm = None  # done: not saved any more
        return 1.0 if self._rewarm is None else self._rewarm.factor(self.samples_seen)

    def _step_gain(self) -> float:
        """The rule's LR gain for this step, after its backward (1 unless the rule measures one)."""
        assert self.reference is not None
        return self._gain.step_gain(
            lambda t: self.reduce(t.to(self.root_device, torch.float64), reduce_op="mean"),
            self.world_size,
            self._batch_size() * self.lightning_module.trainer.accumulate_grad_batches,
            self.reference.global_batch,
        )

    @property
    def gain(self) -> float:
        """The rule's last LR gain (AdaScale's; 1 for other rules)."""
        return self._gain.gain

    @property
    def gradient_noise(self) -> dict[str, float]:
        """The running gradient statistics ``{"trace", "mu2"}`` (AdaScale's; else those resumed)."""
        return self._gain.noise


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
