"""Student-t intervals (:mod:`lightning_bandlimit.utils.stats`) against textbook values."""

from __future__ import annotations

import math

import pytest

from lightning_bandlimit.utils.stats import Interval, mean_interval, paired_difference, t_quantile


def test_t_quantiles_match_the_table() -> None:
    # two-sided 95 % quantiles of any printed t table
    for df, expected in ((1, 12.706), (2, 4.303), (4, 2.776), (9, 2.262), (30, 2.042)):
        assert t_quantile(df) == pytest.approx(expected, abs=5e-4)
    assert t_quantile(10, 0.99) == pytest.approx(3.169, abs=5e-4)
    assert t_quantile(100_000) == pytest.approx(1.960, abs=5e-4)  # the normal quantile in the limit


@pytest.mark.parametrize(
    ("args", "error", "name"),
    [((0,), ValueError, "df"), ((1.5,), TypeError, "df"), ((3, 1.0), ValueError, "confidence")],
)
def test_t_quantile_rejects_bad_arguments(args: tuple, error: type[Exception], name: str) -> None:
    with pytest.raises(error, match=name):
        t_quantile(*args)


def test_textbook_interval() -> None:
    # 1, 2, 3, 4, 5: mean 3, s = sqrt(2.5) = 1.5811, t(0.975, 4) = 2.776: 3 +- 1.963
    iv = mean_interval([1, 2, 3, 4, 5])
    assert (iv.n, iv.mean, iv.std) == (5, 3.0, pytest.approx(math.sqrt(2.5)))
    assert iv.half_width == pytest.approx(2.776 * math.sqrt(2.5) / math.sqrt(5), abs=1e-3)
    assert (iv.low, iv.high) == (pytest.approx(1.037, abs=1e-3), pytest.approx(4.963, abs=1e-3))
    assert iv.excludes_zero and iv.confidence == 0.95
    assert mean_interval([1, 2, 3, 4, 5], confidence=0.99).half_width > iv.half_width


def test_one_value_has_a_mean_and_no_interval() -> None:
    iv = mean_interval([0.25])
    assert (iv.n, iv.mean) == (1, 0.25)
    assert math.isnan(iv.std) and math.isnan(iv.half_width)
    assert (iv.low, iv.high) == (-math.inf, math.inf) and not iv.excludes_zero
    empty = mean_interval([])
    assert empty.n == 0 and math.isnan(empty.mean) and (empty.low, empty.high) == (-math.inf, math.inf)


def test_equal_values_have_a_zero_width_interval() -> None:
    iv = mean_interval([0.3, 0.3, 0.3])
    assert (iv.std, iv.half_width, iv.low, iv.high) == (0.0, 0.0, 0.3, 0.3)


def test_paired_difference_is_the_interval_of_the_differences() -> None:
    a, b = [10.0, 12.0, 9.0, 11.0], [9.0, 10.5, 8.5, 9.0]
    iv = paired_difference(a, b)
    assert iv == mean_interval([1.0, 1.5, 0.5, 2.0])
    # mean 1.25, s = 0.6455, t(0.975, 3) = 3.182: half width 1.027
    assert (iv.mean, iv.std, iv.half_width) == (
        1.25,
        pytest.approx(0.6455, abs=1e-4),
        pytest.approx(1.027, abs=1e-3),
    )
    # the pairs' shared spread cancels: unpaired, the same values give a far wider interval
    assert iv.half_width < mean_interval(a).half_width
    with pytest.raises(ValueError, match="got 4 and 3"):
        paired_difference(a, b[:3])
    assert isinstance(iv, Interval)
