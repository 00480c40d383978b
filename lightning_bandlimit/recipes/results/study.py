"""Several checkpoints per variant: each record's threat class, mean +- std, paired differences.

A *variant* is one kind of model (e.g. ``band-limited``, ``full-spectrum``); its *replicates*
are checkpoints of it trained with different seeds. Every robustness record belongs to one
replicate. This module turns the records into

* per variant, attack and budget: the mean and standard deviation over replicates of the
  accuracy and of the **loss** (clean accuracy minus accuracy under attack);
* per pair of variants: the **paired** differences of the loss and of the accuracy under
  attack, replicate ``i`` of one against replicate ``i`` of the other (the same training seed,
  the same test samples and the same attack seed), each with a 95 % Student-t interval over the
  pairs;

and names each record's threat class (:func:`threat_class`). The verdict read from these numbers
is :mod:`~lightning_bandlimit.recipes.results.verdict`'s.

It reads record fields only (no tensors), so it can be tested on made-up records.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from lightning_bandlimit.utils.stats import mean_interval, paired_difference

__all__ = [
    "Aggregate",
    "Paired",
    "aggregate",
    "paired_differences",
    "threat_class",
]


def threat_class(record: Any) -> str | None:
    """The verdict's threat class of a record (or worst-case record), ``None`` when it has none.

    Classes: dropped-band / in-band (a model's ``dropped`` / ``kept`` band) noise and adaptive
    attacks, full-spectrum noise (``gaussian_noise``, ``band_noise`` on the full radial band) and
    full-spectrum adaptive (the per-sample worst case over full-spectrum white-box attacks).

    Example:
        >>> from types import SimpleNamespace as R
        >>> threat_class(R(attack_name="band_noise", band_name="dropped", band=None, threat="random noise"))
        'dropped-band noise'
    """
    name, band_name = getattr(record, "attack_name", None), getattr(record, "band_name", None)
    threat = getattr(record, "threat", "")
    if name is None:  # a worst-case record
        return "full-spectrum adaptive" if threat == "full-spectrum white-box" else None
    noise = threat == "random noise"
    if band_name in ("dropped", "kept"):
        where = "dropped-band" if band_name == "dropped" else "in-band"
        return f"{where} {'noise' if noise else 'adaptive'}"
    if noise and (getattr(record, "band", None) in (None, [0.0, 1.0], (0.0, 1.0))):
        return "full-spectrum noise"
    return None


@dataclass(frozen=True)
class Aggregate:
    """One variant under one attack at one budget, over its replicates (fractions, not points).

    ``loss_half_width`` is that of the loss's 95 % Student-t interval (nan with one replicate).
    """

    variant: str
    attack: str
    norm: str | None
    eps: float
    threat_class: str | None
    replicates: int
    clean_mean: float
    accuracy_mean: float
    accuracy_std: float
    loss_mean: float
    loss_std: float
    loss_half_width: float


@dataclass(frozen=True)
class Paired:
    """Variant ``a`` minus variant ``b`` under one attack and budget, paired by replicate.

    ``mean`` / ``std`` / ``half_width``: of the accuracy under attack; ``loss_*``: of the loss
    (clean minus attacked accuracy; negative: ``a`` loses less). ``half_width`` is that of the 95 %
    Student-t interval, nan with fewer than 2 pairs.
    """

    attack: str
    norm: str | None
    eps: float
    threat_class: str | None
    a: str
    b: str
    pairs: int
    mean: float
    std: float
    half_width: float
    loss_mean: float = math.nan
    loss_std: float = math.nan
    loss_half_width: float = math.nan

    @property
    def resolved(self) -> bool:
        """Whether the accuracy difference's 95 % interval excludes 0."""
        return math.isfinite(self.half_width) and abs(self.mean) > self.half_width

    @property
    def loss_resolved(self) -> bool:
        """Whether the loss difference's 95 % interval excludes 0."""
        return math.isfinite(self.loss_half_width) and abs(self.loss_mean) > self.loss_half_width


def _key(record: Any) -> tuple[str, str | None, float]:
    label = getattr(record, "attack", None) or "worst case (" + ", ".join(record.attacks) + ")"
    return label, record.norm, round(float(record.eps), 12)


def _by_variant(records: Iterable[Any]) -> dict[tuple[str, tuple[str, str | None, float]], dict[int, Any]]:
    grouped: dict[tuple[str, tuple[str, str | None, float]], dict[int, Any]] = {}
    for record in records:
        grouped.setdefault((record.variant, _key(record)), {})[record.replicate] = record
    return grouped


def aggregate(records: Iterable[Any]) -> list[Aggregate]:
    """Mean and standard deviation over replicates, per variant, attack and budget.

    Args:
        records: records with ``variant``, ``replicate``, ``attack`` (or worst-case ``attacks``),
            ``norm``, ``eps``, ``clean_accuracy`` and ``robust_accuracy``.

    Example:
        >>> from types import SimpleNamespace as R
        >>> rows = [R(variant="v", replicate=i, attack="pgd", attack_name="pgd", threat="x", band=None,
        ...           band_name=None, norm="Linf", eps=0.1, clean_accuracy=0.9, robust_accuracy=a)
        ...         for i, a in enumerate([0.5, 0.7])]
        >>> a = aggregate(rows)[0]
        >>> a.replicates, round(a.accuracy_mean, 3), round(a.loss_mean, 3), round(a.accuracy_std, 3)
        (2, 0.6, 0.3, 0.141)
    """
    out = []
    for (variant, (attack, norm, eps)), members in _by_variant(records).items():
        rows = [members[i] for i in sorted(members)]
        accuracy = [r.robust_accuracy for r in rows]
        loss = [r.clean_accuracy - r.robust_accuracy for r in rows]
        losses = mean_interval(loss)
        out.append(
            Aggregate(
                variant,
                attack,
                norm,
                eps,
                threat_class(rows[0]),
                len(rows),
                statistics.fmean(r.clean_accuracy for r in rows),
                statistics.fmean(accuracy),
                mean_interval(accuracy).std,
                losses.mean,
                losses.std,
                losses.half_width,
            )
        )
    return out


def paired_differences(records: Iterable[Any], a: str, b: str) -> list[Paired]:
    """Accuracy of variant ``a`` minus ``b``, replicate by replicate, with a 95 % t interval.

    Only replicates present in both variants are paired.

    Example:
        >>> from types import SimpleNamespace as R
        >>> rows = [R(variant=v, replicate=i, attack="pgd", attack_name="pgd", threat="x", band=None,
        ...           band_name=None, norm="Linf", eps=0.1, clean_accuracy=0.9, robust_accuracy=acc)
        ...         for v, accs in (("a", [0.5, 0.6, 0.7]), ("b", [0.4, 0.5, 0.6]))
        ...         for i, acc in enumerate(accs)]
        >>> p = paired_differences(rows, "a", "b")[0]
        >>> p.pairs, round(p.mean, 3), p.std, p.resolved
        (3, 0.1, 0.0, True)
    """
    grouped = _by_variant(records)
    out = []
    for (variant, key), left in grouped.items():
        if variant != a or (b, key) not in grouped:
            continue
        right = grouped[(b, key)]
        common = sorted(set(left) & set(right))
        if not common:
            continue
        accuracy = paired_difference(
            [left[i].robust_accuracy for i in common], [right[i].robust_accuracy for i in common]
        )
        loss = paired_difference(
            [left[i].clean_accuracy - left[i].robust_accuracy for i in common],
            [right[i].clean_accuracy - right[i].robust_accuracy for i in common],
        )
        attack, norm, eps = key
        out.append(
            Paired(
                attack,
                norm,
                eps,
                threat_class(left[common[0]]),
                a,
                b,
                accuracy.n,
                accuracy.mean,
                accuracy.std,
                accuracy.half_width,
                loss.mean,
                loss.std,
                loss.half_width,
            )
        )
    return out
