"""Band-limited perturbations kept exactly in the band, in the eps ball and in the pixel box.

How the constraints are kept exactly. The band is a linear subspace ``S``; the eps ball and the
pixel box ``0 <= images + delta <= 1`` are convex and contain 0, but clipping to them leaves
``S``. Scalar multiples and segments stay in ``S``, so every update ends with an exact line
search: from the previous (feasible) perturbation ``p`` towards a band-limited candidate ``c``,
the attack moves to ``p + t * (c - p)`` with the largest ``t`` in ``[0, 1]`` that keeps the box
(closed form, per sample; ``t = 0`` is always feasible). For L2 the candidate is first scaled by
``min(1, eps / ||c||)``, which is the exact projection onto ``S`` intersected with the ball, and
the segment between two points of the ball stays in it; for Linf the ball is a box and is
handled together with the pixel box. Before the line search, ``projection_rounds`` alternations
of clipping to a slightly shrunk box and projecting back to ``S`` bring the candidate close to
the feasible set, so that ``t`` is close to 1 and most of the budget is used. The result is
feasible but not the Euclidean projection onto the feasible set, so the attack is somewhat weaker
than one with an exact projection: the price of an exactly band-limited perturbation.

:class:`BandConstraints` holds one batch's constraints; the per-sample helpers (norms, scaling,
the largest feasible scalar) are what the band-restricted attacks
(:mod:`lightning_bandlimit.recipes.threats.band_attacks`) build their steps from.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

__all__ = ["BandConstraints", "box_scale", "per_sample", "sample_norms", "scale_to"]

# Inward margin of the box that the alternating projections aim at, as a fraction of a typical
# per-pixel perturbation (Linf: eps; L2: eps / sqrt(pixels per sample)). Aiming strictly inside
# the box lets the exact line search accept (t ~ 1) the small leftover violations; 0.2 was the
# best of 0.02..0.4 on random and clipped-smooth 16x16 and 32x32 images for all three bands.
_BOX_MARGIN = 0.2


def per_sample(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Reshape ``(N,)`` values to broadcast against ``like`` of shape ``(N, ...)``."""
    return values.view(-1, *([1] * (like.dim() - 1)))


def sample_norms(delta: torch.Tensor, norm: str) -> torch.Tensor:
    """Each sample's ``norm`` (``"L2"`` or ``"Linf"``) of ``delta`` of shape ``(N, ...)``, as ``(N,)``.

    Example:
        >>> sample_norms(torch.tensor([[3.0, -4.0], [0.5, 0.0]]), "L2")
        tensor([5.0000, 0.5000])
    """
    flat = delta.flatten(1)
    return flat.norm(p=2, dim=1) if norm == "L2" else flat.abs().amax(dim=1)


def scale_to(delta: torch.Tensor, norm: str, radius: torch.Tensor | float) -> torch.Tensor:
    """Scale each sample to the given norm (all-zero samples stay zero)."""
    size = sample_norms(delta, norm)
    factor = torch.where(size > 0, radius / size.clamp_min(torch.finfo(delta.dtype).tiny), 0.0)
    return delta * per_sample(factor, delta)


def _scale_into_ball(delta: torch.Tensor, norm: str, eps: float) -> torch.Tensor:
    """``delta * min(1, eps / ||delta||)`` per sample: band-preserving."""
    size = sample_norms(delta, norm)
    factor = torch.where(size > eps, eps / size.clamp_min(torch.finfo(delta.dtype).tiny), 1.0)
    return delta * per_sample(factor, delta)


def box_scale(delta: torch.Tensor, lower: torch.Tensor, upper: torch.Tensor) -> torch.Tensor:
    """Largest ``t`` in ``[0, 1]`` per sample with ``lower <= t * delta <= upper`` (``lower <= 0 <= upper``).

    A ``t < 1`` is shrunk by a few ulps so that rounding in ``t * delta`` cannot cross the bounds.
    """
    inf = torch.full_like(delta, math.inf)
    ratio = torch.where(delta > 0, upper / delta, inf)
    ratio = torch.where(delta < 0, lower / delta, ratio)
    t = ratio.flatten(1).amin(dim=1).clamp(0.0, 1.0)
    return torch.where(t < 1.0, t * (1.0 - 4.0 * torch.finfo(delta.dtype).eps), t)


def _line_search(
    candidate: torch.Tensor, previous: torch.Tensor, lower: torch.Tensor, upper: torch.Tensor
) -> torch.Tensor:
    """``previous + t * (candidate - previous)`` with the largest ``t`` in ``[0, 1]`` inside the box.

    ``previous`` must lie in the box ``[lower, upper]``. Exact in the band: a segment between two
    band-limited perturbations is band-limited.
    """
    step = candidate - previous
    t = box_scale(step, (lower - previous).clamp(max=0.0), (upper - previous).clamp(min=0.0))
    return previous + step * per_sample(t, step)


class BandConstraints:
    """The element-wise box of one batch and the shrunk box the alternating projections aim at.

    ``lower <= delta <= upper`` is the pixel box ``0 <= images + delta <= 1``, intersected with the
    eps ball for ``Linf``; the L2 ball is handled by scaling. The target box is shrunk by a margin
    on the pixel-box sides only (not on the eps-ball sides), and not at all for the full band,
    whose projection is exact.

    Args:
        images: the batch, values in ``[0, 1]``.
        eps: the budget in ``norm``.
        norm: ``"Linf"`` or ``"L2"``.
        project: the band's exact projection.
        full: whether the band is the whole spectrum.
    """

    def __init__(
        self,
        images: torch.Tensor,
        eps: float,
        norm: str,
        project: Callable[[torch.Tensor], torch.Tensor],
        full: bool,
    ) -> None:
        self.eps, self.norm, self.project = eps, norm, project
        if norm == "Linf":
            self.lower, self.upper = -images.clamp(max=eps), (1.0 - images).clamp(max=eps)
            margin = 0.0 if full else _BOX_MARGIN * min(eps, 1.0)
            self.target_lower = self.lower + margin * (images < eps)
            self.target_upper = self.upper - margin * (images > 1.0 - eps)
        else:
            self.lower, self.upper = -images, 1.0 - images
            margin = 0.0 if full else min(_BOX_MARGIN * eps / math.sqrt(images[0].numel()), 0.25)
            self.target_lower, self.target_upper = self.lower + margin, self.upper - margin

    def alternate(self, delta: torch.Tensor, rounds: int) -> torch.Tensor:
        """Alternate clipping to the target box and projecting to the band (and the L2 ball)."""
        for _ in range(rounds):
            delta = self.project(torch.maximum(torch.minimum(delta, self.target_upper), self.target_lower))
            if self.norm == "L2":
                delta = _scale_into_ball(delta, "L2", self.eps)
        return delta

    def feasible_step(self, candidate: torch.Tensor, previous: torch.Tensor, rounds: int) -> torch.Tensor:
        """From a feasible ``previous`` towards a band-limited ``candidate``, ending feasible exactly."""
        delta = self.alternate(candidate, rounds)
        if self.norm == "L2":  # the segment between two points of the ball stays in it
            delta = _scale_into_ball(delta, "L2", self.eps)
        return _line_search(delta, previous, self.lower, self.upper)
