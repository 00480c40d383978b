"""Between a :class:`~lightning_bandlimit.strategies.TrainingConfig` and a running torch optimizer:
read one from the optimizer's first parameter group, write one into every group."""

from __future__ import annotations

import torch

from lightning_bandlimit.strategies.scaling_rule import TrainingConfig

__all__ = ["apply_to_optimizer", "read_optimizer"]


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
        >>> from lightning_bandlimit.strategies import LinearScaling
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
