"""Student-t intervals of a mean and of paired differences (``scipy.stats``).

With ``n`` values, the interval of their mean is ``mean +- t(q, n - 1) * std / sqrt(n)`` where
``std`` is the sample standard deviation (``n - 1`` in the denominator) and ``q = (1 + confidence)
/ 2``. One value has a mean but no spread and no interval: ``std`` and ``half_width`` are NaN and
the interval is the whole real line; no value has a NaN mean too. A paired difference is the
interval of ``a[i] - b[i]``: the spread that the pairs share (e.g. one training seed) cancels.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from lightning_bandlimit.utils.validation import check_int, check_real

__all__ = ["Interval", "mean_interval", "paired_difference", "t_quantile"]


def t_quantile(df: int, confidence: float = 0.95) -> float:
    """The two-sided Student-t quantile ``t((1 + confidence) / 2, df)``.

    Args:
        df: degrees of freedom, ``>= 1``.
        confidence: the interval's coverage, in ``(0, 1)``.

    Raises:
        TypeError: for a ``df`` that is not an int or a ``confidence`` that is not a number.
        ValueError: for ``df < 1`` or a ``confidence`` outside ``(0, 1)``.

    Example:
        >>> round(t_quantile(4), 3), round(t_quantile(1), 3), round(t_quantile(10, 0.90), 3)
        (2.776, 12.706, 1.812)
    """
    from scipy import stats  # imported here: scipy is slow to import and few callers need it

    check_int("df", df, minimum=1)
    check_real("confidence", confidence, minimum=0, maximum=1, min_open=True, max_open=True)
    return float(stats.t.ppf((1 + confidence) / 2, df))


@dataclass(frozen=True)
class Interval:
    """The mean of ``n`` values with its Student-t interval (see the module docstring).

    Args:
        n: how many values.
        mean: their mean (NaN for none).
        std: their sample standard deviation (NaN for fewer than 2).
        half_width: the interval's half width (NaN for fewer than 2; 0 when every value is equal).
        confidence: the interval's coverage.
    """

    n: int
    mean: float
    std: float
    half_width: float
    confidence: float = 0.95

    @property
    def low(self) -> float:
        """The interval's lower end; ``-inf`` without an interval."""
        return self.mean - self.half_width if math.isfinite(self.half_width) else -math.inf

    @property
    def high(self) -> float:
        """The interval's upper end; ``inf`` without an interval."""
        return self.mean + self.half_width if math.isfinite(self.half_width) else math.inf

    @property
    def excludes_zero(self) -> bool:
        """Whether the interval lies entirely on one side of 0 (never without an interval)."""
        return math.isfinite(self.half_width) and abs(self.mean) > self.half_width


def mean_interval(values: Sequence[float], confidence: float = 0.95) -> Interval:
    """The mean of ``values`` with its Student-t interval.

    Args:
        values: the values (any number of them).
        confidence: the interval's coverage, in ``(0, 1)``.

    Example:
        >>> iv = mean_interval([1.0, 2.0, 3.0, 4.0, 5.0])
        >>> iv.mean, round(iv.std, 4), round(iv.half_width, 4), round(iv.low, 4)
        (3.0, 1.5811, 1.9632, 1.0368)
        >>> mean_interval([0.5])
        Interval(n=1, mean=0.5, std=nan, half_width=nan, confidence=0.95)
    """
    values = [float(v) for v in values]
    n = len(values)
    if n < 2:
        return Interval(n, values[0] if values else math.nan, math.nan, math.nan, confidence)
    std = statistics.stdev(values)
    half = t_quantile(n - 1, confidence) * std / math.sqrt(n) if std > 0 else 0.0
    return Interval(n, statistics.fmean(values), std, half, confidence)


def paired_difference(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> Interval:
    """The mean of ``a[i] - b[i]`` with its Student-t interval.

    Args:
        a: one value per pair.
        b: the other value of each pair, in the same order.
        confidence: the interval's coverage, in ``(0, 1)``.

    Raises:
        ValueError: if ``a`` and ``b`` differ in length.

    Example:
        >>> iv = paired_difference([0.5, 0.6, 0.7], [0.4, 0.5, 0.6])
        >>> iv.n, round(iv.mean, 3), round(iv.std, 3), iv.excludes_zero
        (3, 0.1, 0.0, True)
    """
    if len(a) != len(b):
        raise ValueError(f"expected one b per a, got {len(a)} and {len(b)} values")
    return mean_interval([x - y for x, y in zip(a, b)], confidence)
