"""Scaling rules: how hyperparameters follow a change in the number of devices.

A rule maps the *reference* configuration (the one the schedule was planned for, recorded in
the checkpoint) and a new world size to a new configuration. With ``k`` = new global batch /
reference global batch:

* :class:`LinearScaling` (SGD; Goyal et al. 2017): LR x k, with a re-warmup.
* :class:`SquareRootScaling` (Adam family; Malladi et al. 2022): LR x sqrt(k),
  beta_i <- 1 - k (1 - beta_i), eps <- eps / sqrt(k).
* :class:`KeepGlobalBatch` (DeepSpeed-style): change gradient accumulation so that the global
  batch stays the same; when no whole accumulation fits, take the nearest and rescale the LR
  linearly for the remaining factor.
* :class:`MomentumAwareScaling` (SGD; Smith & Le 2018): keep the SGD noise scale
  ``lr / (B (1 - m))`` by moving the momentum within bounds (B proportional to 1 / (1 - m)), and
  the LR for what the bounds do not allow.

* :class:`AdaScale` (Johnson et al. 2020): not a fixed factor. The resize keeps the reference
  hyperparameters; while training, the strategy multiplies each step's LR by the gain
  ``r = (s2 + m2) / (s2 / S + m2)`` estimated from gradient statistics across ranks, and
  advances the schedule by ``r`` reference steps per step (``adascale.py``).
* ``ExactGlobalBatch`` keeps the global batch exactly by choosing the micro-batch
  (``exact_global_batch.py``).

Each rule takes a ``damping`` in ``[0, 1]``: the factor actually applied is ``k ** damping``,
which the stability guard uses to retry a milder adjustment after a rollback.

What a rule needs from the strategy beyond :meth:`ScalingRule.adjust` it declares:
:meth:`ScalingRule.micro_batch_plan` (a rule that chooses the micro-batch, such as
``ExactGlobalBatch``) and :meth:`ScalingRule.gain_tracker` (a rule that measures an LR gain while
training, such as ``AdaScale``); the strategy asks, it never tests a rule's type.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from lightning_bandlimit.utils.validation import check_int, check_real

__all__ = [
    "GainTracker",
    "KeepGlobalBatch",
    "LinearScaling",
    "MicroBatchPlan",
    "MomentumAwareScaling",
    "NoScaling",
    "ScalingRule",
    "SquareRootScaling",
    "TrainingConfig",
    "default_rule",
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


class LinearScaling(ScalingRule):
    """LR x k (Goyal et al. 2017), re-warming up over ``warmup_steps`` new global batches.

    Args:
        warmup_steps: optimizer steps of the re-warmup after a resize that raises the LR.

    Example:
        >>> ref = TrainingConfig(world_size=2, per_device_batch=32, lr=0.1, momentum=0.9)
        >>> new = LinearScaling().adjust(ref, world_size=4)
        >>> new.lr, new.global_batch, new.warmup_samples
        (0.2, 128, 640)
    """

    name = "linear"

    def __init__(self, warmup_steps: int = 5) -> None:
        self.warmup_steps = check_int("warmup_steps", warmup_steps, minimum=0)

    def adjust(
        self,
        reference: TrainingConfig,
        world_size: int,
        damping: float = 1.0,
        accumulation: int | None = None,
    ) -> TrainingConfig:
        accumulation = accumulation or reference.accumulation
        k = self._factor(reference, world_size, accumulation, damping)
        new = replace(reference, world_size=world_size, accumulation=accumulation, lr=reference.lr * k)
        return replace(new, warmup_samples=self.warmup_steps * new.global_batch if k > 1 else 0)


class SquareRootScaling(ScalingRule):
    """LR x sqrt(k), beta_i <- 1 - k (1 - beta_i), eps <- eps / sqrt(k) (Malladi et al. 2022).

    Betas are kept in ``[0, max_beta]`` (a large ``k`` would otherwise drive them negative).

    Args:
        max_beta: upper bound for the rescaled betas.

    Example:
        >>> ref = TrainingConfig(world_size=1, per_device_batch=64, lr=1e-3, betas=(0.9, 0.999), eps=1e-8)
        >>> new = SquareRootScaling().adjust(ref, world_size=4)
        >>> round(new.lr, 6), tuple(round(b, 3) for b in new.betas), new.eps
        (0.002, (0.6, 0.996), 5e-09)
    """

    name = "sqrt"

    def __init__(self, max_beta: float = 0.9999) -> None:
        self.max_beta = check_real(
            "max_beta", max_beta, minimum=0.0, maximum=1.0, min_open=True, max_open=True
        )

    def adjust(
        self,
        reference: TrainingConfig,
        world_size: int,
        damping: float = 1.0,
        accumulation: int | None = None,
    ) -> TrainingConfig:
        if reference.betas is None:
            raise ValueError("the square-root rule rescales Adam betas, but the optimizer has none")
        accumulation = accumulation or reference.accumulation
        k = self._factor(reference, world_size, accumulation, damping)
        betas = tuple(min(self.max_beta, max(0.0, 1 - k * (1 - b))) for b in reference.betas)
        eps = None if reference.eps is None else reference.eps / math.sqrt(k)
        return replace(  # type: ignore[arg-type]
            reference,
            world_size=world_size,
            accumulation=accumulation,
            lr=reference.lr * math.sqrt(k),
            betas=betas,
            eps=eps,
        )


class KeepGlobalBatch(ScalingRule):
    """Keep the global batch by changing gradient accumulation; rescale the LR for any rest.

    The accumulation is the whole number (at least 1, at most ``max_accumulation``) that brings
    the global batch nearest to the reference; the remaining factor k is applied linearly to
    the LR.

    Args:
        max_accumulation: the most micro-batches per step to accept.

    Example:
        >>> ref = TrainingConfig(world_size=4, per_device_batch=32, accumulation=1, lr=0.1)
        >>> new = KeepGlobalBatch().adjust(ref, world_size=2)
        >>> new.accumulation, new.global_batch, new.lr
        (2, 128, 0.1)
        >>> round(KeepGlobalBatch().adjust(ref, world_size=3).lr, 6)  # 96 or 192 samples: 96 is nearer
        0.075
    """

    name = "keep-global-batch"
    chooses_accumulation = True

    def __init__(self, max_accumulation: int = 64) -> None:
        self.max_accumulation = check_int("max_accumulation", max_accumulation, minimum=1)

    def adjust(
        self,
        reference: TrainingConfig,
        world_size: int,
        damping: float = 1.0,
        accumulation: int | None = None,
    ) -> TrainingConfig:
        per_step = world_size * reference.per_device_batch
        exact = reference.global_batch / per_step
        candidates = {max(1, min(self.max_accumulation, n)) for n in (math.floor(exact), math.ceil(exact))}
        accumulation = min(candidates, key=lambda n: (abs(n * per_step - reference.global_batch), n))
        k = self._factor(reference, world_size, accumulation, damping)
        return replace(reference, world_size=world_size, accumulation=accumulation, lr=reference.lr * k)


class MomentumAwareScaling(ScalingRule):
    """Keep the SGD noise scale ``lr / (B (1 - m))`` by moving the momentum, then the LR.

    With the batch x k, ``1 - m`` is multiplied by ``1 / k`` (so B (1 - m) stays fixed) as far as
    ``[min_momentum, max_momentum]`` allows; the LR takes the remaining factor, so that
    ``lr / (B (1 - m))`` is unchanged either way.

    Args:
        min_momentum: lower bound for the momentum.
        max_momentum: upper bound for the momentum.

    Example:
        >>> ref = TrainingConfig(world_size=1, per_device_batch=64, lr=0.1, momentum=0.9)
        >>> new = MomentumAwareScaling().adjust(ref, world_size=2)
        >>> round(new.lr, 6), round(new.momentum, 3)
        (0.1, 0.95)
    """

    name = "momentum"

    def __init__(self, min_momentum: float = 0.0, max_momentum: float = 0.99) -> None:
        check_real("min_momentum", min_momentum, minimum=0.0, maximum=1.0, max_open=True)
        check_real("max_momentum", max_momentum, minimum=0.0, maximum=1.0, max_open=True)
        if min_momentum > max_momentum:
            raise ValueError(f"min_momentum must be <= max_momentum, got {min_momentum} and {max_momentum}")
        self.min_momentum, self.max_momentum = min_momentum, max_momentum

    def adjust(
        self,
        reference: TrainingConfig,
        world_size: int,
        damping: float = 1.0,
        accumulation: int | None = None,
    ) -> TrainingConfig:
        if reference.momentum is None:
            raise ValueError("the momentum-aware rule needs an SGD momentum, but the optimizer has none")
        accumulation = accumulation or reference.accumulation
        k = self._factor(reference, world_size, accumulation, damping)
        wanted = 1 - (1 - reference.momentum) / k
        momentum = min(self.max_momentum, max(self.min_momentum, wanted))
        # noise scale lr / (B (1 - m)) fixed: lr' = lr * k * (1 - m') / (1 - m)
        lr = reference.lr * k * (1 - momentum) / (1 - reference.momentum)
        return replace(reference, world_size=world_size, accumulation=accumulation, lr=lr, momentum=momentum)


class NoScaling(ScalingRule):
    """Keep every hyperparameter: only the data position and the schedule follow a resize.

    The baseline against which the other rules are measured (``benchmarks/elastic/elastic.py``), and a
    choice for users who rescale by hand.

    Example:
        >>> ref = TrainingConfig(world_size=1, per_device_batch=32, lr=0.1, momentum=0.9)
        >>> new = NoScaling().adjust(ref, world_size=4)
        >>> new.lr, new.momentum, new.global_batch
        (0.1, 0.9, 128)
    """

    name = "none"

    def adjust(
        self,
        reference: TrainingConfig,
        world_size: int,
        damping: float = 1.0,
        accumulation: int | None = None,
    ) -> TrainingConfig:
        accumulation = accumulation or reference.accumulation
        self._factor(reference, world_size, accumulation, damping)  # argument checks
        return replace(reference, world_size=world_size, accumulation=accumulation, warmup_samples=0)


def default_rule(optimizer: torch.optim.Optimizer) -> ScalingRule:
    """The rule for an optimizer family: square-root for Adam-like, linear for others.

    Adaptive methods (anything with ``betas``) follow the square-root SDE scaling of Malladi et
    al.; SGD follows the linear rule with warmup, validated up to large batches by Goyal et al.

    Example:
        >>> default_rule(torch.optim.AdamW([torch.zeros(1, requires_grad=True)])).name
        'sqrt'
        >>> default_rule(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)).name
        'linear'
    """
    return SquareRootScaling() if "betas" in optimizer.defaults else LinearScaling()
