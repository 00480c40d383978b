"""The built-in attacks: torchattacks builders at full strength, listed in :data:`BUILT_IN_ATTACKS`.

See :mod:`~lightning_bandlimit.recipes.threats` for the table of attacks and their
full-strength defaults.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torchattacks
from torch import nn
from torchattacks.attack import Attack

from lightning_bandlimit.recipes.threats.attack_info import AttackInfo, Builder, Threat
from lightning_bandlimit.recipes.threats.cw_attack import CWMinNorm
from lightning_bandlimit.utils.validation import check_int

__all__ = ["BUILT_IN_ATTACKS"]


def _alpha(eps: float, options: Mapping[str, Any]) -> float:
    alpha = options.get("alpha")
    return 2.5 * eps / options["steps"] if alpha is None else float(alpha)


class _PGDL2(torchattacks.PGDL2):
    """torchattacks' PGD-L2, except at ``eps = 0``: there its projection computes ``0 / 0`` and
    returns NaN images, so the zero-radius ball's only point (the clean image) is returned."""

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if self.eps == 0:
            return images.clone().detach().to(self.device)
        return super().forward(images, labels)


def _build_fgsm(model: nn.Module, eps: float, **_: Any) -> Attack:
    return torchattacks.FGSM(model, eps=eps)


def _build_pgd(model: nn.Module, eps: float, *, options: Mapping[str, Any], **_: Any) -> Attack:
    return torchattacks.PGD(
        model,
        eps=eps,
        alpha=_alpha(eps, options),
        steps=int(options["steps"]),
        random_start=bool(options["random_start"]),
    )


def _build_pgd_l2(model: nn.Module, eps: float, *, options: Mapping[str, Any], **_: Any) -> Attack:
    return _PGDL2(
        model,
        eps=eps,
        alpha=_alpha(eps, options),
        steps=int(options["steps"]),
        random_start=bool(options["random_start"]),
        eps_for_division=float(options["eps_for_division"]),
    )


def _build_cw(model: nn.Module, eps: float, *, options: Mapping[str, Any], **_: Any) -> Attack:
    return CWMinNorm(model, c=options["c"], kappa=options["kappa"], steps=options["steps"], lr=options["lr"])


def _build_autoattack(
    model: nn.Module, eps: float, *, num_classes: int, seed: int, options: Mapping[str, Any], **_: Any
) -> Attack:
    attack = torchattacks.AutoAttack(
        model,
        norm=options["norm"],
        eps=eps,
        version=options["version"],
        n_classes=num_classes,
        seed=seed,
    )
    steps = check_int("autoattack steps", options["steps"], minimum=1)
    queries = check_int("autoattack n_queries", options["n_queries"], minimum=1)
    targets = options["n_target_classes"]
    targets = num_classes - 1 if targets is None else targets
    targets = check_int("autoattack n_target_classes", targets, minimum=1, maximum=num_classes - 1)
    for inner in attack._autoattack.attacks:
        inner.seed = seed
        if isinstance(inner, (torchattacks.APGD, torchattacks.APGDT, torchattacks.FAB)):
            inner.steps = steps  # the reference implementation's 100 (torchattacks: 10)
        if isinstance(inner, (torchattacks.APGDT, torchattacks.FAB)):
            inner.n_target_classes = targets
        if isinstance(inner, torchattacks.Square):
            inner.n_queries = queries
    return attack


def _build_gaussian_noise(model: nn.Module, eps: float, **_: Any) -> Attack:
    return torchattacks.GN(model, std=eps)


def _build_band_pgd(norm: str) -> Builder:
    def build(
        model: nn.Module, eps: float, *, band: tuple[float, float], options: Mapping[str, Any], **_: Any
    ) -> Attack:
        from lightning_bandlimit.recipes.threats.band_attacks import BandPGD

        alpha = _alpha(eps, options)
        if eps == 0 and alpha == 0:
            alpha = 1.0  # BandPGD requires alpha > 0; at eps = 0 it returns the images unchanged
        return BandPGD(
            model,
            eps=eps,
            alpha=alpha,
            steps=int(options["steps"]),
            band=band,
            norm=norm,
            random_start=bool(options["random_start"]),
            projection_rounds=int(options["projection_rounds"]),
        )

    return build


def _build_band_noise(
    model: nn.Module,
    eps: float,
    *,
    seed: int,
    band: tuple[float, float],
    options: Mapping[str, Any],
    **_: Any,
) -> Attack:
    from lightning_bandlimit.recipes.threats.band_attacks import BandNoise

    return BandNoise(
        model, eps=eps, band=band, norm=options["norm"], distribution=options["distribution"], seed=seed
    )


_PGD_DEFAULTS = {"steps": 50, "alpha": None, "random_start": True}
_BAND_PGD_DEFAULTS = {**_PGD_DEFAULTS, "projection_rounds": 10}

#: The built-in attacks, in the order of the table in :mod:`~lightning_bandlimit.recipes.threats`;
#: the registry (:mod:`~lightning_bandlimit.recipes.threats.attack_registry`) starts with them.
BUILT_IN_ATTACKS: tuple[AttackInfo, ...] = (
    AttackInfo(
        "fgsm",
        _build_fgsm,
        norm="Linf",
        threat=Threat.FULL,
        iterative=False,
        eps_meaning="L-inf step size (= radius), one gradient-sign step",
    ),
    AttackInfo(
        "pgd",
        _build_pgd,
        norm="Linf",
        threat=Threat.FULL,
        iterative=True,
        eps_meaning="L-inf radius",
        defaults=_PGD_DEFAULTS,
    ),
    AttackInfo(
        "pgd_l2",
        _build_pgd_l2,
        norm="L2",
        threat=Threat.FULL,
        iterative=True,
        eps_meaning="L2 radius over all pixels and channels",
        defaults={**_PGD_DEFAULTS, "eps_for_division": 1e-10},
    ),
    AttackInfo(
        "cw",
        _build_cw,
        norm="L2",
        threat=Threat.FULL,
        iterative=True,
        eps_meaning="L2 budget: a minimum-norm example counts only if its L2 norm is at most eps",
        defaults={"c": (0.1, 1.0, 10.0), "kappa": 0.0, "steps": 100, "lr": 0.01},
        minimum_norm=True,
    ),
    AttackInfo(
        "autoattack",
        _build_autoattack,
        norm="Linf",
        threat=Threat.FULL,
        iterative=True,
        eps_meaning="radius in the norm option (L-inf by default)",
        defaults={
            "norm": "Linf",
            "version": "standard",
            "steps": 100,
            "n_queries": 5000,
            "n_target_classes": None,
        },
    ),
    AttackInfo(
        "gaussian_noise",
        _build_gaussian_noise,
        norm=None,
        threat=Threat.NOISE,
        iterative=False,
        eps_meaning="standard deviation of the noise",
    ),
    AttackInfo(
        "band_pgd",
        _build_band_pgd("Linf"),
        norm="Linf",
        threat=Threat.BAND,
        iterative=True,
        eps_meaning="L-inf radius of a perturbation restricted to the band",
        defaults=_BAND_PGD_DEFAULTS,
        banded=True,
    ),
    AttackInfo(
        "band_pgd_l2",
        _build_band_pgd("L2"),
        norm="L2",
        threat=Threat.BAND,
        iterative=True,
        eps_meaning="L2 radius of a perturbation restricted to the band",
        defaults=_BAND_PGD_DEFAULTS,
        banded=True,
    ),
    AttackInfo(
        "band_noise",
        _build_band_noise,
        norm="Linf",
        threat=Threat.NOISE,
        iterative=False,
        eps_meaning="amplitude of random noise restricted to the band, in the norm option (L-inf by default)",
        defaults={"norm": "Linf", "distribution": "gaussian"},
        banded=True,
    ),
)
