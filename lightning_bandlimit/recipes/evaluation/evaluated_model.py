"""The models of a robustness evaluation: each replicate of each variant, and what is known of it.

A variant is one entry of ``models`` (``"band-limited"``); given a list of sources, each is a
replicate (one per training seed) evaluated as ``variant#i``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from torch import nn

from lightning_bandlimit.recipes.evaluation.loading import LoadedClassifier, Source
from lightning_bandlimit.recipes.threats.input_band import InputBand

__all__ = ["EvaluatedModel", "replicates"]


@dataclass
class EvaluatedModel:
    """One evaluated model.

    Args:
        name: its name in the report (``variant`` or ``variant#i``).
        loaded: the classifier and where it came from.
        variant: the variant it is a replicate of.
        replicate: its index within the variant.
        num_classes: its number of logits (set by the probe).
        input_band: what its input layer keeps and drops (``None`` when it has none).
        input_band_error: why no input band could be derived (e.g. no ``nn.Conv2d``).
    """

    name: str
    loaded: LoadedClassifier
    variant: str = ""
    replicate: int = 0
    num_classes: int = 0
    input_band: InputBand | None = None
    input_band_error: str | None = None

    @property
    def module(self) -> nn.Module:
        """The model itself."""
        return self.loaded.module

    def note(self) -> str:
        """Its source, and the compression it was trained at, for the summary.

        Example:
            >>> from lightning_bandlimit.recipes.evaluation.loading import LoadedClassifier
            >>> EvaluatedModel("bl", LoadedClassifier(nn.Identity(), "bl.ckpt", compression=0.5)).note()
            'bl.ckpt, band-limited at compression 0.5'
        """
        compression = self.loaded.compression or 0.0
        return self.loaded.source + (
            f", band-limited at compression {compression:g}" if compression > 0 else ""
        )


def replicates(models: Mapping[str, Source | Sequence[Source]]) -> list[tuple[str, str, int, Source]]:
    """``(model name, variant, replicate, source)``: a list of sources is a variant's replicates.

    Raises:
        ValueError: for a variant given an empty list.

    Example:
        >>> [r[:3] for r in replicates({"a": "a.ckpt", "b": ["b0.ckpt", "b1.ckpt"]})]
        [('a', 'a', 0), ('b#0', 'b', 0), ('b#1', 'b', 1)]
    """
    out: list[tuple[str, str, int, Source]] = []
    for variant, sources in models.items():
        if isinstance(sources, (list, tuple)):
            if not sources:
                raise ValueError(
                    f"expected at least one checkpoint or module for variant {variant!r}, got none"
                )
            out += [(f"{variant}#{i}", variant, i, source) for i, source in enumerate(sources)]
        else:
            out.append((variant, variant, 0, sources))  # type: ignore[arg-type]
    return out
