"""Attacks in a model's own band: the input-band subspace each ``band: dropped | kept`` attack uses.

Such an attack perturbs every evaluated model inside one subspace: the part (``dropped`` or
``kept``) of the input band of its source variant (``band_of``, default: the one band-limited
variant), so that all models face the same perturbations. Replicates of the source must share
that input band.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lightning_bandlimit.recipes.evaluation.evaluated_model import EvaluatedModel
from lightning_bandlimit.recipes.threats import AttackSpec, spec_model_band
from lightning_bandlimit.recipes.threats.input_band import BandSubspace, input_band

__all__ = ["band_limited_variants", "derive_input_bands", "resolve_attack_subspaces"]


def derive_input_bands(evaluated: Sequence[EvaluatedModel], probe: torch.Tensor) -> None:
    """Set each model's input band (``None`` with the reason when it has none, e.g. no Conv2d)."""
    for model in evaluated:
        try:
            model.input_band = input_band(
                model.module, tuple(probe.shape[1:]), name=model.name, probe=probe[:2]
            )
        except ValueError as error:
            model.input_band, model.input_band_error = None, str(error)


def band_limited_variants(evaluated: Sequence[EvaluatedModel]) -> list[str]:
    """The variants whose input layer drops part of the image (in order of first appearance)."""
    variants: list[str] = []
    for model in evaluated:
        band = model.input_band
        if band is not None and not band.dropped.is_empty and model.variant not in variants:
            variants.append(model.variant)
    return variants


def _source_variant(spec: AttackSpec, part: str, evaluated: Sequence[EvaluatedModel]) -> str:
    variants = list(dict.fromkeys(m.variant for m in evaluated))
    source = spec.band_of
    if source is None:
        limited = band_limited_variants(evaluated)
        if len(limited) != 1:
            raise ValueError(
                f"attack {spec.key!r}: band {part!r} needs its source model; expected band_of: one of "
                f"{variants}, got no band_of and {len(limited)} band-limited variants {limited}"
            )
        source = limited[0]
    if source not in variants:
        raise ValueError(
            f"attack {spec.key!r}: expected band_of to name an evaluated model, one of {variants}, "
            f"got {source!r}"
        )
    return source


def _subspace(spec: AttackSpec, part: str, source: str, evaluated: Sequence[EvaluatedModel]) -> BandSubspace:
    members = [m for m in evaluated if m.variant == source]
    for m in members:
        if m.input_band is None:
            raise ValueError(
                f"attack {spec.key!r}: the band of {m.name!r} cannot be derived: {m.input_band_error}"
            )
    band = members[0].input_band
    assert band is not None
    different = [m.name for m in members[1:] if not band.same_as(m.input_band)]  # type: ignore[arg-type]
    if different:
        raise ValueError(
            f"attack {spec.key!r}: expected the replicates of {source!r} to share one input band, got "
            f"{different} differing from {members[0].name!r}"
        )
    subspace = band.part(part)
    if subspace.is_empty:
        raise ValueError(
            f"attack {spec.key!r}: the {part} band of {source!r} is empty ({band.describe()} keeps every "
            "frequency); name a band-limited model with band_of"
        )
    return subspace


def resolve_attack_subspaces(
    specs: Sequence[AttackSpec], evaluated: Sequence[EvaluatedModel]
) -> tuple[dict[str, BandSubspace], dict[str, str]]:
    """attack key -> the subspace of its ``band: dropped | kept`` (the same for every model), and
    attack key -> the variant whose input layer defines it.

    Raises:
        ValueError: when the source variant is ambiguous or unknown, its input band cannot be
            derived, its replicates disagree, or the part is empty.
    """
    subspaces: dict[str, BandSubspace] = {}
    sources: dict[str, str] = {}
    for spec in specs:
        part = spec_model_band(spec)
        if part is None:
            continue
        source = _source_variant(spec, part, evaluated)
        subspaces[spec.key], sources[spec.key] = _subspace(spec, part, source, evaluated), source
    return subspaces, sources
