"""Where an elastic run stands across resizes, and what of it a checkpoint keeps.

:class:`ElasticProgress` is ``ElasticDDPStrategy``'s bookkeeping: the configuration the run was
planned with (``reference``, its first launch) and the one the optimizers hold (``applied``),
the samples seen (in all, and in the optimizer step under way), the LR re-warmup still running
and the world size a resize came from. At training start it begins a new run or takes back what
a checkpoint's :class:`~lightning_bandlimit.strategies.elastic_resume.ResumeState` holds, and
says whether the start is a resize (another world size or accumulation); at a resize it gives the
rule's configuration for the new size and records it once applied; at a save it gives the
:class:`ResumeState` to write under ``checkpoint["elastic_ddp"]``.

Plain values only (no torch, no Lightning): the strategy moves the optimizers and the trainer
(``elastic_resize.apply_config``) and asks this object what to move them to.
"""

from __future__ import annotations

from typing import Any

from lightning_bandlimit.strategies.elastic_resize import Rewarm
from lightning_bandlimit.strategies.elastic_resume import ResumeState
from lightning_bandlimit.strategies.scaling_rule import ScalingRule, TrainingConfig

__all__ = ["ElasticProgress"]


class ElasticProgress:
    """An elastic run's configurations, samples seen and LR re-warmup, across resizes.

    Attributes:
        reference: the configuration the run was planned with (its first launch); ``None``
            until training starts.
        applied: the configuration the optimizers hold now; ``None`` until training starts.
        samples_seen: samples trained on so far (every rank's), since the run began.
        step_samples: samples of the optimizer step under way (every rank's); 0 at a step
            boundary.
        rewarm: the LR ramp after a resize that raised the LR, while it runs.
        resized_from: the world size this start resized from; ``None`` if it is no resize.
        launched_accumulation: at a resize, the accumulation this launch was started with (what
            a rule that does not choose the accumulation keeps).

    Example:
        >>> launched = TrainingConfig(world_size=2, per_device_batch=8, lr=0.1)
        >>> progress = ElasticProgress()
        >>> progress.begin(launched)
        >>> progress.count(16); progress.count(16)
        >>> progress.samples_seen, progress.end_step(), progress.at_step_boundary
        (32, 32, True)
        >>> saved = progress.resume_state(world_size=2)
        >>> resumed = ElasticProgress()
        >>> resumed.resume(saved)
        >>> resumed.is_resize(saved, 1, launched), resumed.resized_from
        (True, 2)
    """

    def __init__(self) -> None:
        self.reference: TrainingConfig | None = None
        self.applied: TrainingConfig | None = None
        self.samples_seen = 0
        self.step_samples = 0
        self.rewarm: Rewarm | None = None
        self.resized_from: int | None = None
        self.launched_accumulation: int | None = None

    @property
    def started(self) -> bool:
        """Whether training started: the reference and applied configurations are known."""
        return self.reference is not None and self.applied is not None

    @property
    def at_step_boundary(self) -> bool:
        """Whether no sample of an optimizer step is counted yet (the last step is done)."""
        return self.step_samples == 0

    # ------------------------------------------------------------------ training start

    def begin(self, launched: TrainingConfig) -> None:
        """Start a new run, planned with (and training at) ``launched``."""
        self.reference = self.applied = launched

    def resume(self, restored: ResumeState) -> None:
        """Continue the run ``restored`` from a checkpoint: its configurations, samples seen and
        re-warmup (the sampler's, guard's and gain's parts are theirs to load)."""
        self.reference, self.applied = restored.reference, restored.applied
        self.samples_seen = restored.samples_seen
        self.rewarm = restored.rewarm

    def is_resize(self, restored: ResumeState, world_size: int, launched: TrainingConfig) -> bool:
        """Whether resuming ``restored`` at ``world_size`` as ``launched`` is a resize.

        A resize is another world size, or another accumulation than the one applied when saved;
        if it is one, :attr:`resized_from` and :attr:`launched_accumulation` are recorded.
        Call it after :meth:`resume`.
        """
        assert self.applied is not None
        if restored.world_size == world_size and launched.accumulation == self.applied.accumulation:
            return False
        self.resized_from = restored.world_size
        self.launched_accumulation = launched.accumulation
        return True

    # ------------------------------------------------------------------ resize

    def target(self, rule: ScalingRule, world_size: int, damping: float) -> TrainingConfig:
        """The configuration ``rule`` maps the reference to at ``world_size``, ``damping`` applied.

        The accumulation is the launch's unless the rule chooses it.
        """
        assert self.reference is not None
        accumulation = None if rule.chooses_accumulation else self.launched_accumulation
        return rule.adjust(self.reference, world_size, damping, accumulation=accumulation)

    def move_to(self, target: TrainingConfig) -> int:
        """Record that the optimizers now hold ``target``; the world size applied before.

        The re-warmup becomes the one the move asks for, ending any ramp under way: only a
        move that raised the LR, to a ``target`` with ``warmup_samples``, asks one
        (:meth:`Rewarm.after`).
        """
        assert self.applied is not None
        self.rewarm = Rewarm.after(target, target.lr / self.applied.lr, self.samples_seen)
        previous, self.applied = self.applied.world_size, target
        return previous

    # ------------------------------------------------------------------ per step

    def count(self, samples: int) -> None:
        """Count ``samples`` more trained on (every rank's), in all and in the step under way."""
        self.samples_seen += samples
        self.step_samples += samples

    def end_step(self) -> int:
        """The samples of the optimizer step just done; the next step's count starts at 0."""
        samples, self.step_samples = self.step_samples, 0
        return samples

    def rewarm_factor(self) -> float:
        """The re-warmup's LR multiplier now (1 without one); a finished ramp is dropped, so it
        is not saved any more."""
        if self.rewarm is not None and self.rewarm.finished(self.samples_seen):
            self.rewarm = None
        return 1.0 if self.rewarm is None else self.rewarm.factor(self.samples_seen)

    # ------------------------------------------------------------------ checkpoint

    def resume_state(
        self,
        world_size: int,
        rule: str | None = None,
        sampler: dict[str, Any] | None = None,
        guard: dict[str, Any] | None = None,
        noise: dict[str, float] | None = None,
    ) -> ResumeState:
        """What a checkpoint keeps of the run now (only once :attr:`started`).

        Args:
            world_size: the number of processes now.
            rule: the scaling rule's class name, for the record.
            sampler: the :class:`ElasticSampler`'s state (the data position), if any.
            guard: the :class:`StabilityGuard`'s state, if any.
            noise: the rule's running gradient statistics (AdaScale's), if any.
        """
        assert self.reference is not None and self.applied is not None
        return ResumeState(
            reference=self.reference,
            applied=self.applied,
            world_size=world_size,
            samples_seen=self.samples_seen,
            rule=rule,
            sampler=sampler,
            guard=guard,
            noise=dict(noise or {}),
            rewarm=self.rewarm,
        )
