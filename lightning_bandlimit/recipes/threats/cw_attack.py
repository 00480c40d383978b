"""Minimum-norm Carlini-Wagner L2 over a grid of constants (torchattacks' ``CW`` keeps one ``c``)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torchattacks
from torch import nn
from torchattacks.attack import Attack

from lightning_bandlimit.utils.validation import check_int, check_real

__all__ = ["CWMinNorm"]


class CWMinNorm(Attack):
    """Minimum-norm Carlini-Wagner L2: torchattacks' ``CW`` at several ``c``, smallest L2 kept.

    For each constant in ``c`` it runs ``torchattacks.CW`` and keeps, per sample, the
    misclassified example of smallest L2 distance (the clean image where none was found), a
    grid stand-in for the original binary search over ``c``. See the module docstring for how
    a minimum-norm result is evaluated at a budget.

    Args:
        model: the model (images in ``[0, 1]``, logits out).
        c: one constant or a sequence of them (all positive).
        kappa: confidence margin.
        steps: Adam steps per constant.
        lr: Adam learning rate (in tanh space).

    Raises:
        TypeError: for a constant, ``kappa``, ``steps`` or ``lr`` of the wrong type.
        ValueError: for no constant, or a non-positive constant, steps or learning rate.

    Example:
        >>> model = nn.Sequential(nn.Flatten(), nn.Linear(12, 3)).eval()
        >>> attack = CWMinNorm(model, c=[1.0, 10.0], steps=5)
        >>> attack(torch.rand(2, 3, 2, 2), torch.tensor([0, 1])).shape
        torch.Size([2, 3, 2, 2])
    """

    def __init__(
        self,
        model: nn.Module,
        c: float | Sequence[float] = (0.1, 1.0, 10.0),
        kappa: float = 0.0,
        steps: int = 100,
        lr: float = 0.01,
    ) -> None:
        super().__init__("CWMinNorm", model)
        values = [c] if isinstance(c, (int, float)) else list(c)
        if not values:
            raise ValueError(f"c must be a positive constant or a non-empty list of them, got {c!r}")
        constants = [check_real("c", v, minimum=0, min_open=True) for v in values]
        self.c, self.kappa = tuple(constants), check_real("kappa", kappa)
        self.steps, self.lr = (
            check_int("steps", steps, minimum=1),
            check_real("lr", lr, minimum=0, min_open=True),
        )
        self.supported_mode = ["default"]

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        images = images.clone().detach().to(self.device)
        labels = labels.clone().detach().to(self.device)
        best = images.clone()
        best_l2 = torch.full((len(images),), math.inf, device=images.device)
        for constant in self.c:
            inner = torchattacks.CW(self.model, c=constant, kappa=self.kappa, steps=self.steps, lr=self.lr)
            adv = inner(images, labels)
            with torch.no_grad():
                fooled = self.get_logits(adv).argmax(1) != labels
                l2 = (adv - images).flatten(1).norm(dim=1)
                better = fooled & (l2 < best_l2)
                best[better] = adv[better]
                best_l2[better] = l2[better]
        return best
