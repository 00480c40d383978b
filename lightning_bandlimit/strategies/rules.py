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

The protocol every rule follows (:class:`ScalingRule`, :class:`TrainingConfig`) is
``scaling_rule.py``'s. What a rule needs from the strategy beyond :meth:`ScalingRule.adjust` it declares:
:meth:`ScalingRule.micro_batch_plan` (a rule that chooses the micro-batch, such as
``ExactGlobalBatch``) and :meth:`ScalingRule.gain_tracker` (a rule that measures an LR gain while
training, such as ``AdaScale``); the strategy asks, it never tests a rule's type.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from lightning_bandlimit.strategies.scaling_rule import ScalingRule, TrainingConfig
from lightning_bandlimit.utils.validation import check_int, check_real

__all__ = [
    "KeepGlobalBatch",
    "LinearScaling",
    "MomentumAwareScaling",
    "NoScaling",
    "SquareRootScaling",
    "default_rule",
]


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
