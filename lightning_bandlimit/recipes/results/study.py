"""Several checkpoints per variant: mean +- std, paired differences, and the report's verdict.

A *variant* is one kind of model (e.g. ``band-limited``, ``full-spectrum``); its *replicates*
are checkpoints of it trained with different seeds. Every robustness record belongs to one
replicate. This module turns the records into

* per variant, attack and budget: the mean and standard deviation over replicates of the
  accuracy and of the **loss** (clean accuracy minus accuracy under attack);
* per pair of variants: the **paired** differences of the loss and of the accuracy under
  attack, replicate ``i`` of one against replicate ``i`` of the other (the same training seed,
  the same test samples and the same attack seed), each with a 95 % Student-t interval over the
  pairs;
* the **verdict**: per threat class and norm, which variant is more robust to it (loses less
  accuracy: the loss difference, whose interval must exclude 0), by how much, with that interval,
  and what each ends with (the accuracy difference), at a strength chosen by one fixed rule (the
  smallest budget that costs the full-spectrum variant at least 20 points, else the largest
  budget), and what the class does not cover. The loss, not the accuracy under attack, decides:
  the two variants' clean accuracies differ, and a threat should not be credited with that gap.
  The sentence also gives each variant's clean accuracy (a less accurate variant has less to
  lose, so a loss difference near the floor partly reflects the clean gap) and says which
  variant ends higher under the attack. Nothing here knows which answer is expected.

It reads record fields only (no tensors), so it can be tested on made-up records.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from lightning_bandlimit.utils.stats import mean_interval, paired_difference
from lightning_bandlimit.utils.tables import markdown_table

__all__ = [
    "DECISIVE_LOSS",
    "THREAT_CLASSES",
    "Aggregate",
    "Paired",
    "Verdict",
    "aggregate",
    "paired_differences",
    "study_markdown",
    "threat_class",
    "verdicts",
]

#: The loss of the full-spectrum variant (fraction of samples) that makes a strength decisive.
DECISIVE_LOSS = 0.20

#: Threat class -> what a result in it does not cover.
THREAT_CLASSES: dict[str, str] = {
    "dropped-band noise": (
        "adaptive attacks, noise with energy in the kept band, other strengths or distributions"
    ),
    "dropped-band adaptive": (
        "perturbations with any energy in the kept band; a white-box attack confined to what the "
        "band-limited model ignores cannot move it, so this class says nothing about adversarial robustness"
    ),
    "in-band noise": "adaptive attacks; noise outside the kept band",
    "in-band adaptive": "perturbations outside the kept band; attacks stronger than the ones run",
    "full-spectrum noise": "adaptive attacks; structured corruptions (blur, weather, JPEG)",
    "full-spectrum adaptive": (
        "attacks stronger than the ones run (more steps, restarts, other losses), black-box transfer, "
        "other data and training budgets"
    ),
}


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


@dataclass(frozen=True)
class Verdict:
    """The computed verdict of one threat class and norm (see the module docstring)."""

    threat_class: str
    norm: str | None
    attack: str
    eps: float
    decisive: bool  # the full-spectrum variant lost at least DECISIVE_LOSS there
    limited: Aggregate
    full: Aggregate
    difference: Paired  # band-limited minus full-spectrum accuracy
    not_covered: str

    @property
    def better(self) -> str | None:
        """The variant that loses less under this threat when the loss interval excludes 0, else ``None``."""
        if not self.difference.loss_resolved:
            return None
        return self.limited.variant if self.difference.loss_mean < 0 else self.full.variant

    def sentence(self) -> str:
        """The verdict in one sentence (points = percentage points of accuracy)."""
        d = self.difference

        def interval(mean: float, half: float) -> str:
            if math.isfinite(half):
                return f"{100 * mean:+.1f} +- {100 * half:.1f} points"
            return f"{100 * mean:+.1f} points"

        seeds = (
            f"95 % intervals over {d.pairs} paired seeds"
            if math.isfinite(d.half_width)
            else (f"{d.pairs} seed: no interval")
        )
        where = f"at {self.attack} eps {self.eps:.4g}"
        strength = (
            f"{where}, the smallest strength that cost {self.full.variant} >= {100 * DECISIVE_LOSS:.0f} "
            "points"
            if self.decisive
            else f"{where}, the largest strength run (none cost {self.full.variant} "
            f"{100 * DECISIVE_LOSS:.0f} points)"
        )
        losses = (
            f"{self.limited.variant} lost {_points(self.limited)} of {100 * self.limited.clean_mean:.1f}, "
            f"{self.full.variant} {_points(self.full)} of {100 * self.full.clean_mean:.1f}"
        )
        pair = f"{self.limited.variant} minus {self.full.variant}"
        loss = f"loss {pair} {interval(d.loss_mean, d.loss_half_width)}"
        accuracy = f"accuracy under attack {pair} {interval(d.mean, d.half_width)}"
        if self.better is None:
            outcome = f"no resolved difference in robustness: {loss}"
        else:
            outcome = f"**{self.better} is more robust** (loses less): {loss}"
        if d.resolved:
            higher = self.limited.variant if d.mean > 0 else self.full.variant
            ends = f"{higher} ends higher: {accuracy}"
        else:
            ends = f"neither ends resolvably higher: {accuracy}"
        return f"{strength}: {losses}; {outcome}; {ends} ({seeds})."


def _points(a: Aggregate) -> str:
    spread = f" +- {100 * a.loss_std:.1f}" if math.isfinite(a.loss_std) else ""
    return f"{100 * a.loss_mean:.1f}{spread} points"


def verdicts(records: Iterable[Any], limited: str, full: str) -> list[Verdict]:
    """One verdict per threat class and norm, band-limited variant ``limited`` against ``full``.

    Within a class and norm, the strength is the smallest budget above 0 at which ``full``
    lost at least :data:`DECISIVE_LOSS` (mean over replicates), else the largest budget; when
    several attacks of the class qualify, the one with the larger loss of ``full`` there.

    Args:
        records: attack records and worst-case records (the full-spectrum adaptive class reads
            the worst case) with ``variant`` and ``replicate``.
        limited: the band-limited variant.
        full: the full-spectrum variant.
    """
    records = list(records)
    means = {(g.variant, g.attack, g.norm, round(g.eps, 12)): g for g in aggregate(records)}
    diffs = {(p.attack, p.norm, round(p.eps, 12)): p for p in paired_differences(records, limited, full)}
    out = []
    for cls, not_covered in THREAT_CLASSES.items():
        candidates = [
            (means[(limited, *k)], means[(full, *k)], p)
            for k, p in diffs.items()
            if p.threat_class == cls and (limited, *k) in means and (full, *k) in means and p.eps > 0
        ]
        for norm in sorted({c[2].norm or "" for c in candidates}):
            rows = [c for c in candidates if (c[2].norm or "") == norm]
            decisive = [c for c in rows if c[1].loss_mean >= DECISIVE_LOSS]
            if decisive:
                smallest = min(c[2].eps for c in decisive)
                pick = max((c for c in decisive if c[2].eps == smallest), key=lambda c: c[1].loss_mean)
            else:
                largest = max(c[2].eps for c in rows)
                pick = max((c for c in rows if c[2].eps == largest), key=lambda c: c[1].loss_mean)
            lim, ful, diff = pick
            out.append(
                Verdict(cls, norm or None, diff.attack, diff.eps, bool(decisive), lim, ful, diff, not_covered)
            )
    return out


def _interval(mean: float, half: float) -> str:
    return f"{100 * mean:+.1f} +- {100 * half:.1f}" if math.isfinite(half) else f"{100 * mean:+.1f}"


def _pm(mean: float, std: float) -> str:
    return f"{100 * mean:.1f} +- {100 * std:.1f}" if math.isfinite(std) else f"{100 * mean:.1f}"


def study_markdown(
    records: Sequence[Any], worst_case: Sequence[Any], limited: str | None, full: str | None
) -> str:
    """The study's sections of ``summary.md``: per-variant table, paired differences, verdict.

    Args:
        records: attack records (with ``variant`` and ``replicate``).
        worst_case: worst-case records (likewise).
        limited: the band-limited variant, or ``None`` when the evaluation has none.
        full: the full-spectrum variant, or ``None``.
    """
    everything = [*records, *worst_case]
    groups = sorted(aggregate(everything), key=lambda g: (g.variant, g.threat_class or "~", g.attack, g.eps))
    replicates = {g.variant: g.replicates for g in groups}
    parts = [
        "## Per variant (accuracy in %, mean +- std over replicates)",
        "",
        "Replicates: " + ", ".join(f"{v} {n}" for v, n in sorted(replicates.items())) + ". Loss = clean "
        "accuracy minus accuracy under attack.",
        "",
        markdown_table(
            ["variant", "attack", "threat class", "norm", "eps", "clean", "under attack", "loss"],
            [
                [
                    g.variant,
                    g.attack,
                    g.threat_class or "-",
                    g.norm or "-",
                    f"{g.eps:.4g}",
                    f"{100 * g.clean_mean:.1f}",
                    _pm(g.accuracy_mean, g.accuracy_std),
                    _pm(g.loss_mean, g.loss_std),
                ]
                for g in groups
            ],
        ),
    ]
    if limited is None or full is None:
        parts += [
            "",
            "## Verdict",
            "",
            "No verdict: it needs one band-limited and one full-spectrum variant "
            f"(got band-limited {limited!r}, full-spectrum {full!r}).",
        ]
        return "\n".join(parts) + "\n"
    pairs = sorted(
        paired_differences(everything, limited, full), key=lambda p: (p.threat_class or "~", p.attack, p.eps)
    )
    parts += [
        "",
        f"## Paired differences: {limited} minus {full} (points, same seed index, 95 % t intervals)",
        "",
        "Loss: clean minus attacked accuracy (negative: the band-limited variant loses less). "
        "Resolved: the interval excludes 0.",
        "",
        markdown_table(
            [
                "attack",
                "threat class",
                "norm",
                "eps",
                "pairs",
                "loss difference",
                "resolved",
                "accuracy difference",
                "resolved",
            ],
            [
                [
                    p.attack,
                    p.threat_class or "-",
                    p.norm or "-",
                    f"{p.eps:.4g}",
                    p.pairs,
                    _interval(p.loss_mean, p.loss_half_width),
                    "yes" if p.loss_resolved else "no",
                    _interval(p.mean, p.half_width),
                    "yes" if p.resolved else "no",
                ]
                for p in pairs
            ],
        ),
        "",
        "## Verdict (computed from the tables above)",
        "",
    ]
    found = verdicts(everything, limited, full)
    if not found:
        parts.append(
            "No threat class of the verdict was run (model bands `dropped` / `kept`, full-spectrum noise "
            "or full-spectrum white-box attacks)."
        )
    for v in found:
        norm = f" ({v.norm})" if v.norm else ""
        parts.append(f"* **{v.threat_class}**{norm}: {v.sentence()} Not covered: {v.not_covered}.")
    missing = [c for c in THREAT_CLASSES if c not in {v.threat_class for v in found}]
    if missing:
        parts.append(f"* Not run, so no verdict: {', '.join(missing)}.")
    return "\n".join(parts) + "\n"
