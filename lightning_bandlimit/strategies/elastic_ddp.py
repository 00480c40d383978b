"""``ElasticDDPStrategy``: DDP for a job whose number of processes changes between restarts.

A job launched by ``torchrun --nnodes=MIN:MAX`` (or relaunched with other ``devices``) restarts
every worker on a membership change and resumes from its latest checkpoint; this strategy (a
thin Lightning wrapper over the modules named) continues as if planned for the new size:

* **Checkpoint** (``elastic_resume``): the planned configuration (world size, per-device batch,
  accumulation, LR, momentum / betas / eps), the one applied, the samples seen and the data
  position; a checkpoint this run cannot continue is refused before any write. What is saved
  and taken back, and whether a start is a resize, is ``elastic_progress``'s bookkeeping.
* **Rule** (``elastic_resize``): on a start with another world size (or accumulation), a
  :class:`~lightning_bandlimit.strategies.ScalingRule` maps the reference to the new size,
  applied multiplicatively after Lightning restored optimizer and schedulers (resizes never
  compound); the event is logged (``ElasticDDPStrategy/*``). The strategy asks the rule, never
  tests its type: ``rule.micro_batch_plan`` (``ExactGlobalBatch`` chooses micro-batch and
  accumulation), ``rule.gain_tracker`` (``AdaScale``'s LR gain, from a DDP communication hook).
  The re-warmup and the gain scale each step's LR after its backward (``step_lr``).
* **Data** (``elastic_data``, in Lightning's hooks by ``elastic_loading``): the training sampler
  becomes an :class:`~lightning_bandlimit.strategies.ElasticSampler`: the rest of the epoch is
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
  The process group is closed at exit on every rank (``health.exit``).
* **Processes** (``elastic_processes``, which also wires the faults and peers above into
  Lightning's hooks): the node count follows torchrun's world size at each start; on CPU each
  process uses ``cores // local processes`` intra-op threads.

Checkpointing often enough, and on torchrun's SIGTERM, is the job of
:class:`~lightning_bandlimit.callbacks.ElasticCheckpoint`; ``trainer.fit(..., ckpt_path="last")``
resumes from it. Registered as ``Trainer(strategy="elastic_ddp")`` when this package is imported.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import DDPStrategy, StrategyRegistry
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from typing_extensions import override

from lightning_bandlimit.callbacks.checkpoint_io import DurableCheckpointIO
from lightning_bandlimit.strategies._lightning import check_lightning_shapes
from lightning_bandlimit.strategies.elastic_guarded import GuardedResize, log_metrics
from lightning_bandlimit.strategies.elastic_loading import ElasticLoading
from lightning_bandlimit.strategies.elastic_processes import ElasticProcesses
from lightning_bandlimit.strategies.elastic_progress import ElasticProgress
from lightning_bandlimit.strategies.elastic_resize import (
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
    check_resumable,
    check_same_checkpoint,
)
from lightning_bandlimit.strategies.elastic_rollback import RollbackWatch
from lightning_bandlimit.strategies.optimizer_config import read_optimizer
from lightning_bandlimit.strategies.rules import default_rule
from lightning_bandlimit.strategies.scaling_rule import GainTracker, ScalingRule, TrainingConfig
from lightning_bandlimit.strategies.schedules import SampleSchedule
from lightning_bandlimit.strategies.stability import StabilityGuard
from lightning_bandlimit.strategies.step_lr import StepLRFactor
from lightning_bandlimit.utils.validation import check_int

__all__ = ["ElasticDDPStrategy", "register_elastic_strategies"]


class ElasticDDPStrategy(CheckedResume, GuardedResize, ElasticLoading, ElasticProcesses, DDPStrategy):
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
        self._init_processes(cpu_threads, join_timeout)  # start, CPU threads, SIGTERM (ElasticProcesses)
        if rule is not None and not isinstance(rule, ScalingRule):
            raise TypeError(f"rule must be a ScalingRule, got {type(rule).__name__}")
        if rule is not None and rule.chooses_micro_batch and per_device_batch is not None:
            raise ValueError(
                f"ElasticDDPStrategy: {rule!r} chooses the per-device micro-batch for each world size, so "
                f"per_device_batch must be None, got {per_device_batch}"
            )
        self._init_health(hang_timeout, slow_factor, slow_steps, drop_stragglers)
        self._init_loading(per_device_batch, seed)  # the sampler and the plan (ElasticLoading)
        self.rule = rule
        self.guard: StabilityGuard | None = StabilityGuard() if guard is True else (guard or None)
        self._progress = ElasticProgress()  # the configurations, samples seen, re-warmup
        self._has_comm_hook = kwargs.get("ddp_comm_hook") is not None
        self._watch = RollbackWatch(self.guard) if self.guard is not None else None
        self._last_loss: torch.Tensor | None = None  # the loss of the last micro-batch
        # what the rule measures while training (AdaScale: the LR gain); rebuilt if the rule is chosen later
        self._gain: GainTracker = rule.gain_tracker() if rule is not None else GainTracker()

    # ------------------------------------------------------------------ where the run stands

    @property
    def reference(self) -> TrainingConfig | None:
        """The configuration the run was planned with (its first launch); ``None`` before training."""
        return self._progress.reference

    @property
    def applied(self) -> TrainingConfig | None:
        """The configuration the optimizers hold now; ``None`` before training."""
        return self._progress.applied

    @applied.setter
    def applied(self, config: TrainingConfig | None) -> None:  # a rollback puts the snapshot's back
        self._progress.applied = config

    @property
    def samples_seen(self) -> int:
        """Samples trained on so far (every rank's), since the run began."""
        return self._progress.samples_seen

    @property
    def resized_from(self) -> int | None:
        """The world size this start resized from; ``None`` if it is no resize."""
        return self._progress.resized_from

    # ------------------------------------------------------------------ set-up

    @override
    def setup(self, trainer: pl.Trainer) -> None:
        check_lightning_shapes()
        super().setup(trainer)

    @override
    def configure_ddp(self) -> None:
        super().configure_ddp()  # the forward timed for the straggler report (ElasticProcesses)
        self._gain.attach(self.model, self.world_size, self._has_comm_hook)

    # ------------------------------------------------------------------ checkpoints

    @override
    def save_checkpoint(
        self, checkpoint: dict[str, Any], filepath: str | Path, storage_options: Any = None
    ) -> None:
        if self._progress.started:
            checkpoint[CHECKPOINT_KEY] = self._progress.resume_state(
                self.world_size,
                rule=type(self.rule).__name__ if self.rule is not None else None,
                sampler=self.sampler.state_dict() if self.sampler is not None else None,
                guard=self.guard.state_dict() if self.guard is not None else None,
                noise=self._gain.noise,
            ).to_checkpoint()
        super().save_checkpoint(checkpoint, filepath, storage_options)

    # ------------------------------------------------------------------ resize

    @override
    def on_train_start(self) -> None:
        super().on_train_start()  # SIGTERM handled from here on (ElasticProcesses)
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
            self._progress.begin(launched)
            if self.plan is not None and not self.plan.exact:  # the fallback's LR for this size
                self._apply_rule(trainer, damping=1.0)
            return
        self._progress.resume(restored)
        self._gain.load_noise(restored.noise)
        if self.guard is not None and restored.guard:
            self.guard.load_state_dict(restored.guard)
        check_resumable(self.reference, launched, self.rule, self.world_size, self._restored_path)
        self._continue_epoch(trainer)
        if not self._progress.is_resize(restored, self.world_size, launched):
            return
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
        self._apply_rule(trainer, damping=1.0)
        if self._watch is not None:
            self._watch.watch()

    @staticmethod
    def _schedulers(trainer: pl.Trainer) -> list[Any]:
        return [config.scheduler for config in trainer.lr_scheduler_configs]

    def _apply_rule(self, trainer: pl.Trainer, damping: float) -> None:
        assert self.applied is not None and self.rule is not None
        target = self._progress.target(self.rule, self.world_size, damping)
        apply_config(trainer.optimizers, self._schedulers(trainer), self.applied, target)
        trainer.accumulate_grad_batches = target.accumulation
        previous_world = self._progress.move_to(target)
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
        super().on_train_batch_start(batch, batch_idx)  # peers, SIGTERM at a step boundary (ElasticProcesses)
        if not self._progress.started:
            return
        trainer = self.lightning_module.trainer
        self._observe_loss(trainer)
        self._progress.count(self._next_batch())

    @override
    def optimizer_step(
        self, optimizer: Any, closure: Callable[[], Any], model: Any = None, **kwargs: Any
    ) -> Any:
        if not self._progress.started:
            return super().optimizer_step(optimizer, closure, model, **kwargs)
        with StepLRFactor(optimizer.param_groups, self._lr_factor) as scaled:
            output = super().optimizer_step(optimizer, scaled.after(closure), model, **kwargs)
        # the guard judges optimizer steps (checked at the next batch start, a window boundary)
        if self._watch is not None:
            self._watch.step_loss(self._last_loss)
        self._last_loss = None
        assert self.reference is not None
        advance = self._gain.progress(self._progress.end_step(), self.reference.global_batch)
        trainer = self.lightning_module.trainer
        for scheduler in self._schedulers(trainer):
            if isinstance(scheduler, SampleSchedule):
                scheduler.advance(advance)
        metrics = self._gain.metrics() if trainer.global_step % max(1, trainer.log_every_n_steps) == 0 else {}
        if metrics:
            log_metrics(trainer, metrics)
        return output

    def _lr_factor(self) -> float:
        """This step's LR multiplier, after its backward: the re-warmup's times the rule's gain."""
        return self._progress.rewarm_factor() * self._step_gain()

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
