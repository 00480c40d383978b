"""Band-restricted threat models as torchattacks attacks: PGD and random noise in a frequency band.

:class:`BandPGD` and :class:`BandNoise` subclass :class:`torchattacks.attack.Attack`, so they run the
model in eval mode, honour ``set_normalization_used`` and targeted modes like the stock attacks,
and compose with :class:`torchattacks.MultiAttack`. Their perturbation ``adv - images`` lies in a
radial frequency band (see :mod:`lightning_bandlimit.recipes.threats.frequency_band`), in the eps ball, and
keeps the image in ``[0, 1]``, all three exactly (up to floating-point rounding): every step ends
with the exact line search of :mod:`lightning_bandlimit.recipes.threats.band_constraints`.

Limitation: a pixel that is exactly 0 or 1 admits no outward change, and a band that cannot
vanish on a large saturated region (typically the high band) then leaves such images (nearly)
unperturbed (``t = 0``). Check ``(adv - images).flatten(1).norm(dim=1)`` when images saturate,
and always report full-spectrum attacks next to band-restricted ones: a model that discards a
band is trivially "robust" to attacks confined to it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import nn
from torchattacks.attack import Attack

from lightning_bandlimit.recipes.threats.band_constraints import (
    BandConstraints,
    box_scale,
    per_sample,
    sample_norms,
    scale_to,
)
from lightning_bandlimit.recipes.threats.frequency_band import band_project, resolve_band
from lightning_bandlimit.recipes.threats.input_band import BandSubspace
from lightning_bandlimit.utils.validation import check_choice, check_int, check_real

__all__ = ["BandNoise", "BandPGD"]

#: A radial band (name or ``(low, high)``) or a model-derived :class:`BandSubspace`.
Band = str | tuple[float, float] | BandSubspace

NORMS = ("Linf", "L2")
DISTRIBUTIONS = ("gaussian", "uniform")
FULL_BAND = (0.0, 1.0)


def _resolve(
    band: Band,
) -> tuple[tuple[float, float] | BandSubspace, Callable[[torch.Tensor], torch.Tensor], bool]:
    """(the band as recorded, its exact projection, whether it is the whole spectrum)."""
    if isinstance(band, BandSubspace):
        return band, band.project, band.is_full
    resolved = resolve_band(band)
    return resolved, functools.partial(band_project, band=resolved), resolved == FULL_BAND


def _check_images(images: torch.Tensor) -> None:
    if not isinstance(images, torch.Tensor) or not images.is_floating_point() or images.dim() < 3:
        detail = (
            f"dtype {images.dtype} and shape {tuple(images.shape)}"
            if isinstance(images, torch.Tensor)
            else type(images).__name__
        )
        raise ValueError(f"images must be a floating tensor of shape (N, ..., H, W), got {detail}")
    if images.numel() == 0:
        return
    low, high = images.min().item(), images.max().item()
    if not (0.0 <= low and high <= 1.0):  # also rejects NaN
        raise ValueError(f"images must lie in [0, 1], got values in [{low}, {high}]")


class BandPGD(Attack):
    """Projected gradient descent whose perturbation lies in a radial frequency band.

    Each step projects the loss gradient onto the band, takes a sign step (``Linf``; the sign
    pattern is projected back onto the band, which keeps it an ascent direction because
    ``<P sign(g), g> = ||g||_1`` for a band-limited ``g``) or a normalised-gradient step (``L2``),
    then makes the perturbation feasible: ``projection_rounds`` alternations of clipping to the
    constraints and projecting back to the band, followed by an exact per-sample line search
    from the previous iterate (see :mod:`.band_constraints`). The final ``adv - images`` therefore
    has no energy outside the band (up to rounding), lies in the eps ball, and ``adv`` stays in
    ``[0, 1]``. A projected gradient below floating-point noise (``< 100 * finfo.eps`` of the full
    gradient) is treated as zero, so a model blind to the band gets no steps at all. With the full
    band ``(0, 1)`` and ``Linf`` the steps are exactly those of :class:`torchattacks.PGD` (only
    the random start differs).

    Args:
        model: classifier mapping images in ``[0, 1]`` to ``(N, classes)`` logits.
        eps: perturbation budget in ``norm``; 0 returns the inputs unchanged.
        alpha: step size (``Linf``: of the projected sign step; ``L2``: L2 length of the step).
        steps: number of gradient steps (0 returns the random start, or the inputs without one).
        band: ``(low, high)`` in normalised radial frequency, a name in
            :data:`~lightning_bandlimit.recipes.threats.frequency_band.BANDS`, or a model's
            :class:`~lightning_bandlimit.recipes.threats.input_band.BandSubspace` (``band.dropped``:
            what its input layer ignores); recorded as :attr:`band`.
        norm: ``"Linf"`` or ``"L2"``.
        random_start: start from band-limited noise scaled to a uniform random fraction of eps.
        projection_rounds: clip/band-project alternations per step before the exact line
            search; 0 uses the line search alone (still feasible, but uses far less of the
            budget). Each round costs one FFT pair on the batch.

    Raises:
        TypeError: on an argument of the wrong type.
        ValueError: on an invalid argument (the message gives the expected and the given value),
            or, when called, on images that are not floating tensors of shape ``(N, ..., H, W)``
            with values in ``[0, 1]``.

    Example:
        >>> from torch import nn
        >>> from lightning_bandlimit.recipes.threats.frequency_band import band_project
        >>> model = nn.Sequential(nn.Flatten(), nn.Linear(64, 3))
        >>> images, labels = torch.rand(4, 1, 8, 8), torch.tensor([0, 1, 2, 0])
        >>> attack = BandPGD(model, eps=8 / 255, alpha=2 / 255, steps=5, band="high")
        >>> adv = attack(images, labels)
        >>> delta = adv - images
        >>> bool(delta.abs().max() <= 8 / 255 + 1e-6), bool(adv.min() >= 0), bool(adv.max() <= 1)
        (True, True, True)
        >>> torch.allclose(band_project(delta, "high"), delta, atol=1e-6)
        True
        >>> attack.band
        (0.5, 1.0)
    """

    def __init__(
        self,
        model: nn.Module,
        eps: float = 8 / 255,
        alpha: float = 2 / 255,
        steps: int = 10,
        band: str | tuple[float, float] = (0.5, 1.0),
        norm: str = "Linf",
        random_start: bool = True,
        projection_rounds: int = 20,
    ) -> None:
        eps = check_real("eps", eps, minimum=0)
        alpha = check_real("alpha", alpha, minimum=0, min_open=True)
        steps = check_int("steps", steps, minimum=0)
        resolved, project, full = _resolve(band)
        norm = check_choice("norm", norm, NORMS)
        if not isinstance(random_start, bool):
            raise TypeError(f"random_start must be a bool, got {random_start!r}")
        projection_rounds = check_int("projection_rounds", projection_rounds, minimum=0)
        super().__init__("BandPGD", model)
        self._project, self._full = project, full
        self.eps = eps
        self.alpha = alpha
        self.steps = steps
        self.band = resolved
        self.norm = norm
        self.random_start = random_start
        self.projection_rounds = projection_rounds
        self.supported_mode = ["default", "targeted"]

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Return band-limited adversarial examples for ``images`` (values in ``[0, 1]``)."""
        _check_images(images)
        device = self.device if self.device is not None else images.device
        images = images.clone().detach().to(device)
        labels = labels.clone().detach().to(device)
        if self.eps == 0.0 or len(images) == 0:
            return images
        if self.targeted:
            target_labels = self.get_target_label(images, labels)
        constraints = BandConstraints(images, self.eps, self.norm, self._project, self._full)
        loss = nn.CrossEntropyLoss()

        delta = torch.zeros_like(images)
        if self.random_start:
            noise = torch.rand_like(images) * 2 - 1 if self.norm == "Linf" else torch.randn_like(images)
            radius = torch.rand(len(images), device=device, dtype=images.dtype) * self.eps
            candidate = scale_to(self._project(noise), self.norm, radius)
            delta = constraints.feasible_step(candidate, delta, self.projection_rounds)

        noise_floor = 100.0 * torch.finfo(images.dtype).eps
        for _ in range(self.steps):
            adv = (images + delta).requires_grad_(True)
            outputs = self.get_logits(adv)
            cost = -loss(outputs, target_labels) if self.targeted else loss(outputs, labels)
            grad = torch.autograd.grad(cost, adv, retain_graph=False, create_graph=False)[0]
            projected = self._project(grad)
            size = sample_norms(projected, "L2")
            signal = size > noise_floor * sample_norms(grad, "L2")
            projected = projected * per_sample(signal, projected)
            if self.norm == "Linf":
                step = self._project(projected.sign())
            else:
                step = scale_to(projected, "L2", 1.0)
            delta = constraints.feasible_step(delta + self.alpha * step, delta, self.projection_rounds)
        # The clamp only absorbs rounding in the addition.
        return (images + delta).clamp(0.0, 1.0).detach()


class BandNoise(Attack):
    """Random noise in a radial frequency band at exactly the eps budget (a non-adaptive baseline).

    Gaussian or uniform noise is projected onto the band and scaled per sample to norm exactly
    ``eps`` (``L2``: ``||delta||_2 = eps``; ``Linf``: ``max |delta| = eps``). Where that noise
    fits (``0 <= images + delta <= 1``) it is used as is. Otherwise it is reshaped by
    ``projection_rounds`` alternations of clipping to the (slightly shrunk) box and projecting back
    to the band, rescaled to norm ``eps``, and shrunk by the largest scalar ``t`` in ``[0, 1]``
    that fits the box; of the two, the larger perturbation is kept. Every sample therefore stays
    exactly in the band and in ``[0, 1]``, at norm ``eps`` unless the box forces less (see the
    module docstring for saturated pixels).

    With a ``seed``, the attack owns a :class:`torch.Generator` per device, seeded once, so two
    attacks built with the same seed produce the same sequence of perturbations; successive calls
    draw fresh noise. Without one it draws from torch's global RNG.

    Args:
        model: classifier (only used by torchattacks' bookkeeping, e.g. its device).
        eps: noise budget in ``norm``; 0 returns the inputs unchanged.
        band: ``(low, high)`` in normalised radial frequency, a name in
            :data:`~lightning_bandlimit.recipes.threats.frequency_band.BANDS`, or a model's
            :class:`~lightning_bandlimit.recipes.threats.input_band.BandSubspace` (``band.dropped``:
            what its input layer ignores); recorded as :attr:`band`.
        norm: ``"Linf"`` or ``"L2"``.
        distribution: ``"gaussian"`` (standard normal) or ``"uniform"`` (on ``[-1, 1]``) before the
            band projection.
        seed: seed of the attack's own generator, or ``None`` for the global RNG.
        projection_rounds: clip/band-project alternations for samples whose noise would leave
            ``[0, 1]``.

    Raises:
        TypeError: on an argument of the wrong type.
        ValueError: on an invalid argument (the message gives the expected and the given value),
            or, when called, on images that are not floating tensors of shape ``(N, ..., H, W)``
            with values in ``[0, 1]``.

    Example:
        >>> from torch import nn
        >>> model = nn.Sequential(nn.Flatten(), nn.Linear(64, 3))
        >>> images = torch.full((2, 1, 8, 8), 0.5)
        >>> noise = BandNoise(model, eps=0.5, band="mid", norm="L2", seed=0)
        >>> delta = noise(images) - images
        >>> delta.flatten(1).norm(dim=1)
        tensor([0.5000, 0.5000])
        >>> torch.equal(BandNoise(model, eps=0.5, band="mid", norm="L2", seed=0)(images), images + delta)
        True
    """

    def __init__(
        self,
        model: nn.Module,
        eps: float = 8 / 255,
        band: str | tuple[float, float] = (0.5, 1.0),
        norm: str = "Linf",
        distribution: str = "gaussian",
        seed: int | None = None,
        projection_rounds: int = 20,
    ) -> None:
        eps = check_real("eps", eps, minimum=0)
        resolved, project, full = _resolve(band)
        norm = check_choice("norm", norm, NORMS)
        distribution = check_choice("distribution", distribution, DISTRIBUTIONS)
        if seed is not None:
            seed = check_int("seed", seed, minimum=0)
        projection_rounds = check_int("projection_rounds", projection_rounds, minimum=0)
        super().__init__("BandNoise", model)
        self._project, self._full = project, full
        self.eps = eps
        self.band = resolved
        self.norm = norm
        self.distribution = distribution
        self.seed = seed
        self.projection_rounds = projection_rounds
        self._generators: dict[torch.device, torch.Generator] = {}
        self.supported_mode = ["default"]

    def _generator(self, device: torch.device) -> torch.Generator | None:
        if self.seed is None:
            return None
        if device not in self._generators:
            self._generators[device] = torch.Generator(device=device).manual_seed(self.seed)
        return self._generators[device]

    def forward(self, images: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        """Return ``images`` plus band-limited noise of norm ``eps`` (shrunk only to stay in ``[0, 1]``)."""
        _check_images(images)
        device = self.device if self.device is not None else images.device
        images = images.clone().detach().to(device)
        if self.eps == 0.0 or len(images) == 0:
            return images
        generator = self._generator(images.device)
        shape, dtype = images.shape, images.dtype
        if self.distribution == "gaussian":
            noise = torch.randn(shape, generator=generator, device=images.device, dtype=dtype)
        else:
            noise = torch.rand(shape, generator=generator, device=images.device, dtype=dtype) * 2 - 1
        raw = scale_to(self._project(noise), self.norm, self.eps)
        constraints = BandConstraints(images, self.eps, self.norm, self._project, self._full)
        fit = box_scale(raw, constraints.lower, constraints.upper)
        delta = raw * per_sample(fit, raw)
        if bool((fit < 1.0).any()):
            reshaped = constraints.alternate(raw, self.projection_rounds)
            reshaped = scale_to(reshaped, self.norm, self.eps)
            reshaped = reshaped * per_sample(
                box_scale(reshaped, constraints.lower, constraints.upper), reshaped
            )
            better = sample_norms(reshaped, self.norm) > sample_norms(delta, self.norm)
            delta = torch.where(per_sample(better, delta), reshaped, delta)
        # The clamp only absorbs rounding in the addition.
        return (images + delta).clamp(0.0, 1.0)
