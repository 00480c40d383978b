"""The scaling rule's protocol: what a rule reads and writes, and what it declares to the strategy.

A rule maps the *reference* configuration (the one the schedule was planned for, recorded in
the checkpoint) and a new world size to a new configuration (:class:`TrainingConfig`);
:class:`ScalingRule` is the base every rule derives from (the fixed-factor rules are in
``rules.py``, ``AdaScale`` in ``adascale.py``, ``ExactGlobalBatch`` in ``exact_global_batch.py``).

What a rule needs from the strategy beyond :meth:`ScalingRule.adjust` it declares:
:meth:`ScalingRule.micro_batch_plan` (a rule that chooses the micro-batch, such as
``ExactGlobalBatch``, answers with a :class:`MicroBatchPlan`) and :meth:`ScalingRule.gain_tracker`
(a rule that measures an LR gain while training, such as ``AdaScale``, answers with its own
:class:`GainTracker`); the strategy asks, it never tests a rule's type.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from lightning_bandlimit.utils.validation import check_int, check_real

__all__ = [
    "GainTracker",
    "MicroBatchPlan",
    "ScalingRule",
    "TrainingConfig",
]


@dataclass(frozen=True)
class TrainingConfig:
    """What a scaling rule reads and writes.

    Attributes:
        world_size: number of data-parallel processes.
        per_device_batch: samples per process per micro-batch.
        accumulation: micro-batches per optimizer step.
        lr: learning rate (of the first parameter group; others keep their ratio to it).
        momentum: SGD momentum, or ``None``.
        betas: Adam-family betas, or ``None``.
        eps: Adam-family epsilon, or ``None``.
        warmup_samples: samples over which to ramp up to ``lr`` after a resize (0: none).
    """

    world_size: int
    per_device_batch: int
    accumulation: int = 1
    lr: float = 0.1
    momentum: float | None = None
    betas: tuple[float, float] | None = None
    eps: float | None = None
    warmup_samples: int = 0

    def __post_init__(self) -> None:
        for name in ("world_size", "per_device_batch", "accumulation"):
            check_int(name, getattr(self, name), minimum=1)
        check_real("lr", self.lr, minimum=0.0, min_open=True)

    @property
    def global_batch(self) -> int:
        """Samples per optimizer step across all processes."""
        return self.world_size * self.per_device_batch * self.accumulation


@dataclass(frozen=True)
class MicroBatchPlan:
    """How ``world_size`` processes make one optimizer step.

    Attributes:
        world_size: data-parallel processes.
        micro_batch: samples per process per forward/backward.
        accumulation: micro-batches per optimizer step.
        exact: whether :attr:`global_batch` equals the global batch the rule keeps.
    """

    world_size: int
    micro_batch: int
    accumulation: int
    exact: bool = True

    @property
    def global_batch(self) -> int:
        """Samples per optimizer step: ``world_size * micro_batch * accumulation``."""
        return self.world_size * self.micro_batch * self.accumulation


class GainTracker:
    """The LR gain a rule measures while training; this base measures none (gain 1).

    ``ElasticDDPStrategy`` builds one per run from :meth:`ScalingRule.gain_tracker` and asks it,
    at each optimizer step, for the LR gain and for the progress to advance each
    :class:`~lightning_bandlimit.strategies.SampleSchedule` by. ``AdaScale``'s measures the gain
    from gradient statistics (``adascale.py``).

    Attributes:
        noise: gradient statistics ``{"trace", "mu2"}``; this base only keeps those of the
            checkpoint it resumed, so that they are saved again.

    Example:
        >>> tracker = GainTracker()
        >>> tracker.gain, tracker.progress(samples=16, reference_batch=8), tracker.metrics()
        (1.0, 16, {})
    """

    def __init__(self, noise: dict[str, float] | None = None) -> None:
        self.noise: dict[str, float] = dict(noise or {})

    @property
    def gain(self) -> float:
        """The last LR gain (1 here)."""
        return 1.0

    def load_noise(self, noise: dict[str, float]) -> None:
        """Continue from the gradient statistics saved in a checkpoint."""
        self.noise = dict(noise)

    def attach(self, ddp_model: Any, world_size: int, has_comm_hook: bool) -> None:
        """Called once the model is wrapped in DDP (a tracker may register a communication hook)."""

    def step_gain(
        self,
        reduce_mean: Callable[[torch.Tensor], torch.Tensor],
        world_size: int,
        batch: int,
        reference_batch: int,
    ) -> float:
        """The LR gain for this optimizer step, after its backward (1 here).

        Args:
            reduce_mean: the mean of a tensor over the ranks.
            world_size: the number of processes.
            batch: samples behind one rank's gradient (per-device batch x accumulation).
            reference_batch: the reference configuration's global batch.
        """
        return 1.0

    def progress(self, samples: int, reference_batch: int) -> float:
        """What a :class:`SampleSchedule` advances by for a step that trained ``samples``."""
        return samples

    def metrics(self) -> dict[str, float]:
        """What to log about the gain (nothing here)."""
        return {}


class ScalingRule(ABC):
    """Maps a reference configuration to one for a new world size (see the module docstring).

    Besides :meth:`adjust`, a rule declares what else it needs from the strategy:
    :attr:`chooses_accumulation`, :attr:`chooses_micro_batch` with :meth:`micro_batch_plan`, and
    :meth:`gain_tracker`.
    """

    name: str = "rule"
    #: whether :meth:`adjust` chooses the gradient accumulation (it then ignores ``accumulation``)
    chooses_accumulation: bool = False
    #: whether :meth:`adjust` chooses the per-device micro-batch (a resume may then change it, and
    #: the strategy's ``per_device_batch`` must be left to it)
    chooses_micro_batch: bool = False

    def micro_batch_plan(self, world_size: int) -> MicroBatchPlan | None:
        """The micro-batch and accumulation to train with on ``world_size`` processes; ``None``
        (this base): the training loader's batch size and the launch's accumulation.

        Raises:
            ValueError: if the rule refuses ``world_size``.
        """
        return None

    def describe(self, plan: MicroBatchPlan, loader_batch: int | None = None) -> str:
        """One line saying what ``plan`` (from :meth:`micro_batch_plan`) runs.

        Args:
            plan: a plan of this rule.
            loader_batch: the training loader's own ``batch_size``, said to be replaced when it
                differs from the plan's micro-batch.
        """
        replaced = (
            ""
            if loader_batch in (None, plan.micro_batch)
            else f" (the training loader's batch_size {loader_batch} is replaced)"
        )
        return (
            f"global batch {plan.global_batch} on {plan.world_size} processes = micro-batch "
            f"{plan.micro_batch} x accumulation {plan.accumulation}{replaced}"
        )

    def gain_tracker(self) -> GainTracker:
        """A new tracker of the LR gain this rule measures while training (this base: none, gain 1)."""
        return GainTracker()

    @abstractmethod
    def adjust(
        self,
        reference: TrainingConfig,
        world_size: int,
        damping: float = 1.0,
        accumulation: int | None = None,
    ) -> TrainingConfig:
        """The configuration to train with on ``world_size`` processes.

        Args:
            reference: the configuration the run was planned with.
            world_size: the new number of processes.
            damping: exponent on the scale factor, in ``[0, 1]`` (0: no rescaling).
            accumulation: the gradient accumulation the new run was launched with (``None``: the
                reference's); part of the scale for every rule except :class:`KeepGlobalBatch`,
                which chooses its own. A larger scale can so be simulated on fewer processes.

        Raises:
            ValueError: if ``world_size`` or ``damping`` is out of range, or the rule cannot
                apply to ``reference`` (e.g. an Adam rule without betas).
        """

    @staticmethod
    def _factor(reference: TrainingConfig, world_size: int, accumulation: int, damping: float) -> float:
        check_int("world_size", world_size, minimum=1)
        check_real("damping", damping, minimum=0.0, maximum=1.0)
        k = world_size * reference.per_device_batch * accumulation / reference.global_batch
        return k**damping

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
