"""Seed-paired statistics (``elastic/``, ``tenants/multitenant.py``): differences, 95 % interval, verdict.

A resized run is compared with the fixed run of the same seed (same data, same initialisation), so
seed-to-seed spread cancels in the paired difference. With ``n`` seeds the interval is
``mean +- t(0.975, n - 1) * std / sqrt(n)``. The verdict against a target of ``+-T`` points never
rests on the point estimate: "within" only when the whole interval lies inside ``[-T, T]``,
"outside" when it lies entirely beyond one end, and "unresolved" otherwise (or with fewer than 2
seeds). The interval comes from :mod:`lightning_bandlimit.utils.stats`.
"""

from __future__ import annotations

from dataclasses import dataclass

from lightning_bandlimit.utils.stats import mean_interval

__all__ = ["PairedDifference"]


@dataclass(frozen=True)
class PairedDifference:
    """Mean, std and 95 % interval of per-seed differences (points), and the verdict against ``target``.

    Example:
        >>> d = PairedDifference.of([0.1, -0.2, 0.0, 0.2, -0.1], target=0.5)
        >>> d.n, round(d.mean, 2), [round(x, 2) for x in (d.low, d.high)], d.verdict
        (5, 0.0, [-0.2, 0.2], 'within 0.5')
        >>> PairedDifference.of([-1.2, -0.9, -1.0, -1.1, -0.8], target=0.5).verdict
        'outside'
        >>> PairedDifference.of([0.1, -0.9, 0.4], target=0.5).verdict
        'unresolved'
        >>> PairedDifference.of([0.1], target=0.5).verdict
        'unresolved'
    """

    n: int
    mean: float
    std: float
    low: float
    high: float
    target: float

    @classmethod
    def of(cls, differences: list[float], target: float) -> PairedDifference:
        interval = mean_interval(differences)  # already paired: resized minus fixed, per seed
        return cls(interval.n, interval.mean, interval.std, interval.low, interval.high, target)

    @property
    def verdict(self) -> str:
        """ "within T", "outside" or "unresolved", from the interval only."""
        if -self.target <= self.low and self.high <= self.target:
            return f"within {self.target:g}"
        if self.high < -self.target or self.low > self.target:
            return "outside"
        return "unresolved"
