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
  ``r = (s2 + m2) / (s2 / S + m2)`` estimated from gradient statistics across ranks (see
  :func:`adascale_gain`, :func:`gradient_noise_statistics`) and advances the schedule by ``r``
  reference steps per step.

Each rule takes a ``damping`` in ``[0, 1]``: the factor actually applied is ``k ** damping``,
which the stability guard uses to retry a milder adjustment after a rollback.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from typing import Any

import torch

from lightning_bandlimit.utils.validation import check_choice

__all__ = [
    "AdaScale",
    "KeepGlobalBatch",
    "LinearScaling",
    "MomentumAwareScaling",
    "NoScaling",
    "ScalingRule",
    "SquareRootScaling",
    "TrainingConfig",
    "adascale_gain",
    "apply_to_optimizer",
    "default_rule",
    "gradient_noise_statistics",
    "read_optimizer",
    "rule_from_name",
    "rule_names",
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
        if min(self.world_size, self.per_device_batch, self.accumulation) < 1 or self.lr <= 0:
            raise ValueError(
                "expected world_size, per_device_batch and accumulation >= 1 and lr > 0, got "
                f"{self.world_size}, {self.per_device_batch}, {self.accumulation}, {self.lr}"
            )

    @property
    def global_batch(self) -> int:
        """Samples per optimizer step across all processes."""
        return self.world_size * self.per_device_batch * self.accumulation


class ScalingRule(ABC):
    """Maps a reference configuration to one for a new world size (see the module docstring)."""

    name: str = "rule"
    #: whether :meth:`adjust` chooses the gradient accumulation (it then ignores ``accumulation``)
    chooses_accumulation: bool = False
    #: whether :meth:`adjust` chooses the per-device micro-batch (a resume may then change it)
    chooses_micro_batch: bool = False

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
        if world_size < 1:
            raise ValueError(f"world_size must be at least 1, got {world_size}")
        if not 0 <= damping <= 1:
            raise ValueError(f"damping must be in [0, 1], got {damping}")
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
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be non-negative, got {warmup_steps}")
        self.warmup_steps = warmup_steps

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
        if not 0 < max_beta < 1:
            raise ValueError(f"max_beta must be in (0, 1), got {max_beta}")
        self.max_beta = max_beta

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
        if max_accumulation < 1:
            raise ValueError(f"max_accumulation must be at least 1, got {max_accumulation}")
        self.max_accumulation = max_accumulation

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
        if not 0 <= min_momentum <= max_momentum < 1:
            raise ValueError(
                f"expected 0 <= min_momentum <= max_momentum < 1, got {min_momentum} and {max_momentum}"
            )
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

    The baseline against which the other rules are measured (``benchmarks/elastic.py``), and a
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


class AdaScale(NoScaling):
    """AdaScale (Johnson et al. 2020): the LR gain is measured while training, not fixed.

    :meth:`adjust` returns the reference hyperparameters at the new world size (LR, momentum and
    betas unchanged); :class:`~lightning_bandlimit.strategies.ElasticDDPStrategy` then, at every
    optimizer step, multiplies the scheduled LR by the gain ``r`` for the scale
    ``S = global batch / reference global batch`` (``r`` in ``[1, S]`` when ``S >= 1``, in
    ``[S, 1]`` when ``S < 1``) and advances a :class:`~lightning_bandlimit.strategies.SampleSchedule`
    by ``r`` reference batches, so the schedule ends after the same amount of *progress* at any
    scale. The gradient variance is estimated from the ranks' local gradients against the
    all-reduced one (a DDP communication hook); with a single process the last estimate saved in
    the checkpoint is used.

    Args:
        smoothing: weight of the newest estimate in the running averages of the gradient
            variance and squared mean, in ``(0, 1]``.

    Example:
        >>> ref = TrainingConfig(world_size=1, per_device_batch=32, lr=0.1, momentum=0.9)
        >>> new = AdaScale().adjust(ref, world_size=4)
        >>> new.lr, new.global_batch
        (0.1, 128)
    """

    name = "adascale"

    def __init__(self, smoothing: float = 0.1) -> None:
        if not 0 < smoothing <= 1:
            raise ValueError(f"smoothing must be in (0, 1], got {smoothing}")
        self.smoothing = smoothing


def _registry() -> dict[str, type[ScalingRule]]:
    rules = (NoScaling, LinearScaling, KeepGlobalBatch, MomentumAwareScaling, AdaScale, SquareRootScaling)
    return {rule.name: rule for rule in rules}


def rule_names() -> tuple[str, ...]:
    """The :attr:`ScalingRule.name` of every rule this module defines.

    Example:
        >>> rule_names()
        ('none', 'linear', 'keep-global-batch', 'momentum', 'adascale', 'sqrt')
    """
    return tuple(_registry())


def rule_from_name(name: str, **kwargs: Any) -> ScalingRule:
    """The rule whose :attr:`ScalingRule.name` is ``name``, constructed with ``kwargs``.

    Args:
        name: one of :func:`rule_names`.
        **kwargs: the rule's arguments (e.g. ``warmup_steps`` for ``"linear"``).

    Raises:
        ValueError: for an unknown name.

    Example:
        >>> rule_from_name("linear", warmup_steps=0)
        LinearScaling()
    """
    return _registry()[check_choice("rule", name, rule_names())](**kwargs)


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


def read_optimizer(
    optimizer: torch.optim.Optimizer,
    world_size: int,
    per_device_batch: int,
    accumulation: int,
    lr: float | None = None,
) -> TrainingConfig:
    """The :class:`TrainingConfig` of a running optimizer (its first parameter group).

    ``lr`` overrides the group's LR (e.g. with a schedule's base LR while the group's is mid-warmup).

    Raises:
        ValueError: for an optimizer without parameter groups or a non-positive LR.
    """
    if not optimizer.param_groups:
        raise ValueError("the optimizer has no parameter groups")
    group = optimizer.param_groups[0]
    betas = group.get("betas")
    return TrainingConfig(
        world_size=world_size,
        per_device_batch=per_device_batch,
        accumulation=accumulation,
        lr=float(group["lr"]) if lr is None else float(lr),
        momentum=group.get("momentum"),
        betas=tuple(float(b) for b in betas) if betas is not None else None,  # type: ignore[arg-type]
        eps=group.get("eps"),
    )


def apply_to_optimizer(optimizer: torch.optim.Optimizer, old: TrainingConfig, new: TrainingConfig) -> None:
    """Write ``new`` into every parameter group, keeping each group's LR ratio to the first.

    Example:
        >>> p = torch.zeros(1, requires_grad=True)
        >>> opt = torch.optim.SGD([{"params": [p]}, {"params": [], "lr": 0.01}], lr=0.1, momentum=0.9)
        >>> old = read_optimizer(opt, 1, 32, 1)
        >>> apply_to_optimizer(opt, old, LinearScaling().adjust(old, 2))
        >>> [g["lr"] for g in opt.param_groups]
        [0.2, 0.02]
    """
    ratio = new.lr / old.lr
    for group in optimizer.param_groups:
        group["lr"] = group["lr"] * ratio
        if "initial_lr" in group:
            group["initial_lr"] = group["initial_lr"] * ratio
        if new.momentum is not None and "momentum" in group:
            group["momentum"] = new.momentum
        if new.betas is not None and "betas" in group:
            group["betas"] = tuple(new.betas)
        if new.eps is not None and "eps" in group:
            group["eps"] = new.eps


def gradient_noise_statistics(local_sq_norm: float, global_sq_norm: float, scale: int) -> tuple[float, float]:
    """Unbiased ``(sigma2, mu2)`` from gradient norms at two batch sizes (McCandlish et al. 2018).

    ``local_sq_norm`` is the mean over ranks of ``|g_local|^2`` (batch b each), ``global_sq_norm``
    is ``|g|^2`` of the all-reduced gradient (batch S b). With ``E|g_B|^2 = |G|^2 + tr(Sigma) / B``:
    ``mu2 = |G|^2`` and ``sigma2 = tr(Sigma) / b``, the variance of one rank's gradient. The
    gradient noise scale is ``B_simple = b * sigma2 / mu2``.

    Args:
        local_sq_norm: mean squared norm of the per-rank gradients.
        global_sq_norm: squared norm of their mean.
        scale: number of gradients averaged (ranks x micro-batches), at least 2.

    Raises:
        ValueError: if ``scale < 2``.

    Example:
        >>> gradient_noise_statistics(local_sq_norm=5.0, global_sq_norm=2.0, scale=4)
        (4.0, 1.0)
    """
    if scale < 2:
        raise ValueError(f"need gradients from at least 2 ranks or micro-batches, got scale={scale}")
    mu2 = (scale * global_sq_norm - local_sq_norm) / (scale - 1)
    sigma2 = (local_sq_norm - global_sq_norm) * scale / (scale - 1)
    return sigma2, mu2


def adascale_gain(sigma2: float, mu2: float, scale: float) -> float:
    """AdaScale's gain ``r = (sigma2 + mu2) / (sigma2 / S + mu2)``, clipped between 1 and ``S``.

    ``sigma2`` is the gradient variance at the *reference* batch, ``S`` the new global batch over
    the reference one (below 1 for a smaller batch, giving a gain in ``[S, 1]``). Noisy estimates
    can make either statistic negative; a non-positive ``mu2`` (all noise) gives the full gain
    ``S``, a non-positive ``sigma2`` (no noise) gives 1.

    Raises:
        ValueError: if ``scale`` is not positive.

    Example:
        >>> adascale_gain(sigma2=4.0, mu2=1.0, scale=4)
        2.5
        >>> adascale_gain(sigma2=0.0, mu2=1.0, scale=4), adascale_gain(sigma2=1.0, mu2=0.0, scale=4)
        (1.0, 4.0)
        >>> adascale_gain(sigma2=1.0, mu2=1.0, scale=0.5)
        0.6666666666666666
    """
    if not scale > 0:
        raise ValueError(f"scale must be positive, got {scale}")
    if sigma2 <= 0:
        return 1.0
    if mu2 <= 0:
        return float(scale)
    low, high = min(1.0, float(scale)), max(1.0, float(scale))
    return min(high, max(low, (sigma2 + mu2) / (sigma2 / scale + mu2)))
