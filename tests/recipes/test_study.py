"""Replicates per variant: aggregates, paired differences with a t interval, and the computed verdict."""

from __future__ import annotations

import math
import statistics

import pytest
from scipy import stats

from lightning_bandlimit.recipes.results.records import RobustnessRecord, WorstCaseRecord
from lightning_bandlimit.recipes.results.study import aggregate, paired_differences, threat_class
from lightning_bandlimit.recipes.results.verdict import study_markdown, verdicts

NOISE = "random noise"


def record(
    variant: str, replicate: int, attack: str, eps: float, robust: int, *, clean: int = 90, **kw
) -> RobustnessRecord:
    return RobustnessRecord.fabricate(
        f"{variant}#{replicate}",
        attack,
        eps,
        n=100,
        clean_correct=clean,
        robust_correct=robust,
        variant=variant,
        replicate=replicate,
        **kw,
    )


def dropped_noise(variant: str, replicate: int, eps: float, robust: int, **kw) -> RobustnessRecord:
    return record(
        variant,
        replicate,
        "band_noise[dropped]",
        eps,
        robust,
        attack_name="band_noise",
        threat=NOISE,
        band_name="dropped",
        band_source="bl",
        **kw,
    )


def test_threat_classes() -> None:
    assert threat_class(dropped_noise("bl", 0, 0.1, 80)) == "dropped-band noise"
    pgd_kept = record(
        "bl",
        0,
        "band_pgd[kept]",
        0.1,
        80,
        attack_name="band_pgd",
        threat="band-restricted white-box",
        band_name="kept",
    )
    assert threat_class(pgd_kept) == "in-band adaptive"
    assert (
        threat_class(
            record("bl", 0, "gaussian_noise", 0.1, 80, attack_name="gaussian_noise", threat=NOISE, norm=None)
        )
        == "full-spectrum noise"
    )
    high = record(
        "bl", 0, "band_noise[high]", 0.1, 80, attack_name="band_noise", threat=NOISE, band=[0.5, 1.0]
    )
    assert threat_class(high) is None  # a radial band is not a class of the verdict
    assert threat_class(record("bl", 0, "pgd", 0.1, 80)) is None  # single attacks: the worst case speaks
    worst = WorstCaseRecord("bl#0", "full-spectrum white-box", "Linf", 0.1, None, ["pgd"], 100, 0.9, 50, 0.5)
    assert threat_class(worst) == "full-spectrum adaptive"


def test_aggregate_and_paired_interval() -> None:
    bl, fs = [88, 85, 90], [60, 50, 58]
    rows = [dropped_noise("bl", i, 0.2, a) for i, a in enumerate(bl)] + [
        dropped_noise("fs", i, 0.2, a) for i, a in enumerate(fs)
    ]
    groups = {g.variant: g for g in aggregate(rows)}
    assert groups["fs"].replicates == 3
    assert groups["fs"].accuracy_mean == pytest.approx(statistics.fmean(fs) / 100)
    assert groups["fs"].loss_mean == pytest.approx(0.9 - statistics.fmean(fs) / 100)
    assert groups["fs"].accuracy_std == pytest.approx(statistics.stdev(fs) / 100)
    (pair,) = paired_differences(rows, "bl", "fs")
    diffs = [(a - b) / 100 for a, b in zip(bl, fs)]
    assert pair.mean == pytest.approx(statistics.fmean(diffs))
    expected = stats.t.ppf(0.975, 2) * statistics.stdev(diffs) / math.sqrt(3)
    assert pair.half_width == pytest.approx(expected) and pair.resolved
    # equal clean accuracy: the loss difference is minus the accuracy difference
    assert pair.loss_mean == pytest.approx(-pair.mean) and pair.loss_half_width == pytest.approx(expected)


def test_robustness_is_judged_by_the_loss_not_by_the_clean_gap() -> None:
    """A weaker model that loses the same under attack is not "less robust"."""
    rows = []
    for i in range(3):
        rows += [dropped_noise("bl", i, 0.2, 50 - i, clean=70), dropped_noise("fs", i, 0.2, 70 + i, clean=90)]
    (pair,) = paired_differences(rows, "bl", "fs")
    assert pair.resolved and pair.mean < 0  # it ends lower ...
    assert not pair.loss_resolved  # ... but loses the same: 20 + i vs 20 - i points
    (verdict,) = verdicts(rows, "bl", "fs")
    assert verdict.better is None and "no resolved difference in robustness" in verdict.sentence()


def test_unmatched_replicates_are_not_paired() -> None:
    rows = [dropped_noise("bl", i, 0.2, 80) for i in (0, 1, 2)] + [
        dropped_noise("fs", i, 0.2, 50 + i) for i in (1, 2)
    ]
    (pair,) = paired_differences(rows, "bl", "fs")
    assert pair.pairs == 2


def test_one_replicate_has_no_interval() -> None:
    rows = [dropped_noise("bl", 0, 0.2, 88), dropped_noise("fs", 0, 0.2, 50)]
    (pair,) = paired_differences(rows, "bl", "fs")
    assert math.isnan(pair.half_width) and not pair.resolved
    (verdict,) = verdicts(rows, "bl", "fs")
    assert verdict.better is None
    assert "no resolved difference in robustness" in verdict.sentence()
    assert "1 seed: no interval" in verdict.sentence()


def test_the_verdict_uses_the_smallest_strength_that_costs_the_full_model_20_points() -> None:
    rows = []
    for i in range(3):
        for eps, fs in ((0.05, 85), (0.1, 68), (0.2, 40)):  # losses 5, 22, 50 points
            rows += [dropped_noise("bl", i, eps, 90 - i), dropped_noise("fs", i, eps, fs + i)]
    (verdict,) = verdicts(rows, "bl", "fs")
    assert verdict.eps == 0.1 and verdict.decisive
    assert verdict.better == "bl"
    assert "the smallest strength that cost fs >= 20 points" in verdict.sentence()
    assert "**bl is more robust** (loses less)" in verdict.sentence()


def test_without_a_decisive_strength_the_largest_is_used_and_said() -> None:
    rows = []
    for i in range(3):
        for eps, fs in ((0.05, 88), (0.1, 85)):
            rows += [dropped_noise("bl", i, eps, 89 - 2 * i), dropped_noise("fs", i, eps, fs + i)]
    (verdict,) = verdicts(rows, "bl", "fs")
    assert verdict.eps == 0.1 and not verdict.decisive
    assert "none cost fs 20 points" in verdict.sentence()


def test_an_interval_across_zero_is_no_resolved_difference() -> None:
    rows = []
    for i, (b, f) in enumerate(((30, 20), (20, 30), (26, 24))):
        rows += [
            WorstCaseRecord(
                f"{v}#{i}",
                "full-spectrum white-box",
                "Linf",
                0.03,
                None,
                ["pgd"],
                100,
                0.9,
                r,
                r / 100,
                variant=v,
                replicate=i,
            )
            for v, r in (("bl", b), ("fs", f))
        ]
    (verdict,) = verdicts(rows, "bl", "fs")
    assert verdict.threat_class == "full-spectrum adaptive"
    assert verdict.better is None and "no resolved difference" in verdict.sentence()


def test_markdown_lists_the_classes_that_were_not_run() -> None:
    rows = [dropped_noise(v, i, 0.2, 80 if v == "bl" else 40 + i) for v in ("bl", "fs") for i in range(2)]
    text = study_markdown(rows, [], "bl", "fs")
    assert "## Verdict (computed from the tables above)" in text
    assert "* **dropped-band noise** (Linf):" in text
    assert "Not run, so no verdict: dropped-band adaptive, in-band noise" in text
    assert "No verdict: it needs one band-limited and one full-spectrum variant" in study_markdown(
        rows, [], None, "fs"
    )
