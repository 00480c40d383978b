"""The per-sample worst case over attacks: robust accuracy (RobustBench's definition).

For each norm and budget, a sample is robust when it is classified correctly on the clean image
*and* under **every** full-spectrum white-box attack at that norm and budget. Band-restricted
attacks get their own worst case per band (reported apart: it does not measure robustness);
random noise is in no worst case.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from lightning_bandlimit.recipes.results.records import WorstCaseRecord
from lightning_bandlimit.recipes.threats import ATTACKS, AttackSpec, Threat, spec_band, spec_model_band

__all__ = ["AttackOutcome", "worst_case"]


@dataclass(frozen=True)
class AttackOutcome:
    """Which samples one attack run left correctly classified, at one budget.

    Args:
        spec: the attack.
        norm: its threat norm (``None`` for Gaussian noise).
        eps: the budget.
        correct: per sample, whether it stayed correct (bool, ``(n,)``).
    """

    spec: AttackSpec
    norm: str | None
    eps: float
    correct: torch.Tensor


def _group_key(outcome: AttackOutcome, band_sources: Mapping[str, str]) -> tuple | None:
    threat = ATTACKS[outcome.spec.name].threat
    if threat not in (Threat.FULL, Threat.BAND) or outcome.norm is None:
        return None
    part = spec_model_band(outcome.spec)
    band = (part, band_sources[outcome.spec.key]) if part else spec_band(outcome.spec)
    return (threat != Threat.FULL, outcome.norm, round(outcome.eps, 12), band)


def worst_case(
    model: str,
    clean: torch.Tensor,
    outcomes: Sequence[AttackOutcome],
    band_sources: Mapping[str, str],
    *,
    variant: str = "",
    replicate: int = 0,
) -> list[WorstCaseRecord]:
    """One record per (full-spectrum or band-restricted, norm, budget, band) group of outcomes.

    Args:
        model: the model's name.
        clean: per sample, whether it is correct on the clean image (bool, ``(n,)``).
        outcomes: the model's attack outcomes.
        band_sources: attack key -> the variant whose input band a model-band attack uses.
        variant: the model's variant.
        replicate: its replicate index.

    Example:
        >>> spec = AttackSpec("pgd", eps=[0.1])
        >>> outcome = AttackOutcome(spec, "Linf", 0.1, torch.tensor([True, False]))
        >>> records = worst_case("m", torch.tensor([True, True]), [outcome], {})
        >>> [(w.attacks, w.robust_correct) for w in records]
        [(['pgd'], 1)]
    """
    groups: dict[tuple, list[AttackOutcome]] = {}
    for outcome in outcomes:
        key = _group_key(outcome, band_sources)
        if key is not None:
            groups.setdefault(key, []).append(outcome)
    clean_accuracy = float(clean.double().mean())
    records = []
    for (banded, norm, _, band), members in sorted(
        groups.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2], tuple(map(str, kv[0][3] or ())))
    ):
        robust = clean.clone()
        for member in members:
            robust &= member.correct
        model_band = band is not None and isinstance(band[0], str)
        records.append(
            WorstCaseRecord(
                model=model,
                threat=Threat.BAND if banded else Threat.FULL,
                norm=norm,
                eps=members[0].eps,
                band=list(band) if band and not model_band else None,
                attacks=[m.spec.key for m in members],
                n=len(clean),
                clean_accuracy=clean_accuracy,
                robust_correct=int(robust.sum()),
                robust_accuracy=float(robust.double().mean()),
                variant=variant,
                replicate=replicate,
                band_name=band[0] if model_band else None,
                band_source=band[1] if model_band else None,
            )
        )
    return records
