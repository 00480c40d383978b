"""The study's verdict: per threat class and norm, which variant is more robust, and summary.md's sections.

It reads :mod:`~lightning_bandlimit.recipes.results.study`'s aggregates and paired differences
of several checkpoints per variant and gives

* the **verdict**: per threat class and norm, which variant is more robust to it (loses less
  accuracy: the loss difference, whose interval must exclude 0), by how much, with that interval,
  and what each ends with (the accuracy difference), at a strength chosen by one fixed rule (the
  smallest budget that costs the full-spectrum variant at least 20 points, else the largest
  budget), and what the class does not cover. The loss, not the accuracy under attack, decides:
  the two variants' clean accuracies differ, and a threat should not be credited with that gap.
  The sentence also gives each variant's clean accuracy (a less accurate variant has less to
  lose, so a loss difference near the floor partly reflects the clean gap) and says which
  variant ends higher under the attack. Nothing here knows which answer is expected.
* the study's sections of ``summary.md`` (:func:`study_markdown`): the per-variant table, the
  paired differences and the verdict.

It reads record fields only (no tensors), so it can be tested on made-up records.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from lightning_bandlimit.recipes.results.study import Aggregate, Paired, aggregate, paired_differences
from lightning_bandlimit.utils.tables import markdown_table

__all__ = [
    "DECISIVE_LOSS",
    "THREAT_CLASSES",
    "Verdict",
    "study_markdown",
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
