"""What the elastic strategy does to the optimizers at a resize, and how it undoes it.

* :func:`apply_config` writes a rule's new :class:`TrainingConfig` into the optimizers,
  multiplicatively, moving the LR schedulers onto the rescaled curve with
  :func:`~lightning_bandlimit.strategies.rescale_base_lrs`.
* :class:`Rewarm`: the LR ramp after a resize that raised the LR (``LinearScaling``'s re-warmup).
* :class:`Snapshot`: the model, optimizers and schedulers at a resize, restored when the
  stability guard sees the loss diverge.

Nothing here knows Lightning: the strategy passes the trainer's optimizers and schedulers in.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from lightning_utilities.core.apply_func import apply_to_collection

from lightning_bandlimit.strategies.optimizer_config import apply_to_optimizer
from lightning_bandlimit.strategies.scaling_rule import TrainingConfig
from lightning_bandlimit.strategies.schedules import SampleSchedule, rescale_base_lrs

__all__ = [
    "Rewarm",
    "Snapshot",
    "apply_config",
    "resize_metrics",
    "schedule_base_lr",
    "step_schedule_warnings",
]


def apply_config(
    optimizers: Sequence[torch.optim.Optimizer],
    schedulers: Sequence[Any],
    applied: TrainingConfig,
    target: TrainingConfig,
) -> None:
    """Move the optimizers from the ``applied`` configuration to ``target``.

    Every group's LR (and ``initial_lr``) is multiplied by ``target.lr / applied.lr``, keeping
    the groups' ratios; momentum, betas and eps are set. An optimizer driven by a scheduler
    with ``base_lrs`` has its LRs moved by :func:`rescale_base_lrs`, so the schedule continues
    on the rescaled curve.

    Example:
        >>> opt = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1, momentum=0.9)
        >>> sched = SampleSchedule(opt, total_samples=100, kind="constant")
        >>> old = TrainingConfig(world_size=1, per_device_batch=8, lr=0.1, momentum=0.9)
        >>> apply_config([opt], [sched], old, replace(old, world_size=2, lr=0.2, momentum=0.8))
        >>> round(opt.param_groups[0]["lr"], 6), opt.param_groups[0]["momentum"], sched.get_last_lr()
        (0.2, 0.8, [0.2])
    """
    ratio = target.lr / applied.lr
    scheduled = [s for s in schedulers if hasattr(s, "base_lrs")]
    rescaled: set[int] = set()
    for scheduler in scheduled:
        first = id(scheduler.optimizer) not in rescaled
        rescale_base_lrs(scheduler, ratio, groups=first)
        rescaled.add(id(scheduler.optimizer))
    for optimizer in optimizers:
        # a scheduled optimizer's LRs moved with its scheduler: only the other hyperparameters here
        apply_to_optimizer(
            optimizer, applied, replace(target, lr=applied.lr) if id(optimizer) in rescaled else target
        )


def schedule_base_lr(optimizer: torch.optim.Optimizer, schedulers: Sequence[Any]) -> float:
    """The LR a run is planned with: the first scheduler's base LR (the group's LR may be
    mid-warmup, even 0), else the first group's ``initial_lr`` or ``lr``.

    Example:
        >>> opt = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)
        >>> schedule_base_lr(opt, [SampleSchedule(opt, total_samples=100, warmup_samples=10)])
        0.1
    """
    for scheduler in schedulers:
        if getattr(scheduler, "base_lrs", None):
            return float(scheduler.base_lrs[0])
    group = optimizer.param_groups[0]
    return float(group.get("initial_lr", group["lr"]))


def step_schedule_warnings(schedulers: Sequence[Any]) -> list[str]:
    """A warning for each scheduler that counts steps, not samples (its curve breaks at a resize).

    Example:
        >>> opt = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)
        >>> step_schedule_warnings([SampleSchedule(opt, total_samples=100)])
        []
    """
    return [
        f"ElasticDDPStrategy: {type(scheduler).__name__} counts steps, whose size changes with a "
        "resize, so its curve will not be continuous in samples seen; use "
        "lightning_bandlimit.strategies.SampleSchedule for elastic runs"
        for scheduler in schedulers
        if not isinstance(scheduler, SampleSchedule)
    ]


def resize_metrics(previous: int, target: TrainingConfig, damping: float) -> dict[str, float]:
    """What the strategy logs at a resize from ``previous`` processes to ``target``.

    Example:
        >>> config = TrainingConfig(world_size=2, per_device_batch=8, lr=0.2, momentum=0.9)
        >>> resize_metrics(1, config, 1.0)["ElasticDDPStrategy/global_batch"]
        16.0
    """
    metrics = {
        "ElasticDDPStrategy/world_size": float(target.world_size),
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
    return metrics


def resize_message(previous: int, target: TrainingConfig, rule: object, damping: float) -> str:
    """What the strategy says at a resize from ``previous`` processes to ``target`` by ``rule``.

    Example:
        >>> config = TrainingConfig(world_size=2, per_device_batch=8, lr=0.2, momentum=0.9)
        >>> resize_message(1, config, "linear", 1.0)  # doctest: +ELLIPSIS
        "ElasticDDPStrategy: world size 1 -> 2 ('linear', damping 1): global batch 16, lr 0.2, ..."
    """
    return (
        f"ElasticDDPStrategy: world size {previous} -> {target.world_size} ({rule!r}, damping "
        f"{damping:g}): global batch {target.global_batch}, lr {target.lr:.4g}, momentum "
        f"{target.momentum}, betas {target.betas}, accumulation {target.accumulation}"
    )


@dataclass(frozen=True)
class Rewarm:
    """A linear LR ramp from ``initial`` to 1 over ``length`` samples from ``start`` samples seen.

    Example:
        >>> ramp = Rewarm(start=100, length=50, initial=0.5)
        >>> ramp.factor(125), ramp.factor(150)
        (0.75, 1.0)
    """

    start: int
    length: int
    initial: float

    @classmethod
    def after(cls, target: TrainingConfig, ratio: float, samples_seen: int) -> Rewarm | None:
        """The ramp a resize to ``target`` that multiplied the LR by ``ratio`` asks for, if any."""
        if target.warmup_samples and ratio > 1:
            return cls(samples_seen, target.warmup_samples, 1.0 / ratio)
        return None

    def factor(self, samples_seen: int) -> float:
        """The LR multiplier at ``samples_seen`` (1 once the ramp is done)."""
        done = (samples_seen - self.start) / self.length
        return 1.0 if done >= 1 else self.initial + (1.0 - self.initial) * done

    def finished(self, samples_seen: int) -> bool:
        """Whether the ramp is over at ``samples_seen``."""
        return samples_seen - self.start >= self.length


def _to_cpu(obj: Any) -> Any:  # copies: state_dict tensors alias the live ones
    return apply_to_collection(obj, torch.Tensor, lambda t: t.detach().to("cpu", copy=True))


@dataclass(frozen=True)
class Snapshot:
    """The training state at a resize, to roll back to (tensors copied to the CPU)."""

    model: dict[str, Any]
    optimizers: list[dict[str, Any]]
    schedulers: list[dict[str, Any]]
    applied: TrainingConfig
    accumulation: int
    samples_seen: int

    @classmethod
    def take(
        cls,
        module: torch.nn.Module,
        optimizers: Sequence[torch.optim.Optimizer],
        schedulers: Sequence[Any],
        applied: TrainingConfig,
        accumulation: int,
        samples_seen: int,
    ) -> Snapshot:
        """Copy the state of ``module``, ``optimizers`` and ``schedulers`` now."""
        return cls(
            model=_to_cpu(module.state_dict()),
            optimizers=[_to_cpu(opt.state_dict()) for opt in optimizers],
            schedulers=[_to_cpu(s.state_dict()) for s in schedulers],
            applied=applied,
            accumulation=accumulation,
            samples_seen=samples_seen,
        )

    def restore(
        self,
        module: torch.nn.Module,
        optimizers: Sequence[torch.optim.Optimizer],
        schedulers: Sequence[Any],
        samples_seen: int,
    ) -> None:
        """Load the saved state back (gradients cleared).

        The data consumed since the snapshot is not given back (its updates are discarded), so
        each :class:`SampleSchedule` moves on by it too, in step with the data position.
        """
        module.load_state_dict(self.model)
        for opt, state in zip(optimizers, self.optimizers):
            opt.load_state_dict(copy.deepcopy(state))
        for opt in optimizers:
            opt.zero_grad(set_to_none=True)
        for scheduler, state in zip(schedulers, self.schedulers):
            scheduler.load_state_dict(copy.deepcopy(state))
            if isinstance(scheduler, SampleSchedule):
                scheduler.advance(samples_seen - self.samples_seen)
