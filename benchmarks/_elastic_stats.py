"""The elastic benchmark's statistics: paired differences, a 95 % Student-t interval, the verdict.

A resized run is compared with the fixed run of the same seed (same data, same initialisation), so
seed-to-seed spread cancels in the paired difference. With ``n`` seeds the interval is
``mean +- t(0.975, n - 1) * std / sqrt(n)``. The verdict against a target of ``+-T`` points never
rests on the point estimate: "within" only when the whole interval lies inside ``[-T, T]``,
"outside" when it lies entirely beyond one end, and "unresolved" otherwise (or with fewer than 2
seeds).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

# two-sided 95 % quantiles t(0.975, df) for df = 1..30 (scipy.stats.t.ppf, rounded to 3 digits)
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def t_quantile(df: int) -> float:
    """The two-sided 95 % Student-t quantile ``t(0.975, df)``: scipy's when installed, else a table.

    Args:
        df: degrees of freedom, ``>= 1``.

    Raises:
        ValueError: if ``df < 1``, or ``df > 30`` without scipy.

    Example:
        >>> round(t_quantile(4), 3), round(t_quantile(1), 3)
        (2.776, 12.706)
        >>> round(_table_quantile(4), 3)
        2.776
    """
    if df < 1:
        raise ValueError(f"df must be >= 1, got {df}")
    try:
        from scipy.stats import t
    except ImportError:
        return _table_quantile(df)
    return float(t.ppf(0.975, df))


def _table_quantile(df: int) -> float:
    if not 1 <= df <= len(_T975):
        raise ValueError(f"without scipy the t table covers df = 1..{len(_T975)}, got {df}")
    return _T975[df - 1]


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
        n = len(differences)
        if n == 0:
            return cls(0, math.nan, math.nan, -math.inf, math.inf, target)
        mean = statistics.fmean(differences)
        if n == 1:
            return cls(1, mean, math.nan, -math.inf, math.inf, target)
        std = statistics.stdev(differences)
        half = t_quantile(n - 1) * std / math.sqrt(n)
        return cls(n, mean, std, mean - half, mean + half, target)

    @property
    def verdict(self) -> str:
        """ "within T", "outside" or "unresolved", from the interval only."""
        if -self.target <= self.low and self.high <= self.target:
            return f"within {self.target:g}"
        if self.high < -self.target or self.low > self.target:
            return "outside"
        return "unresolved"
