"""A bad compression is refused the same way by every entry point that takes one.

Each compression-like argument (``compression``, ``min_compression``, ``max_compression``) is
checked once, where the user passes it, by ``utils.validation.check_compression``: a value that
is not a real number raises ``TypeError``, a real number outside ``[0, 1)`` (or NaN, or infinite)
raises ``ValueError``; either message names the argument and shows the value.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from lightning_bandlimit import (
    BandLimitedConv1d,
    BandLimitedConv2d,
    bandlimit,
    fft_conv1d,
    fft_conv2d,
    set_compression,
    spectral_band,
)
from lightning_bandlimit.callbacks import AdaptiveBandLimit, BandLimit
from lightning_bandlimit.ladder import LadderController
from lightning_bandlimit.utils.validation import check_compression

BAD: list[tuple[Any, type[Exception]]] = [
    (1.5, ValueError),
    (1.0, ValueError),
    (-0.1, ValueError),
    (float("nan"), ValueError),
    (float("inf"), ValueError),
    ("0.5", TypeError),
    (True, TypeError),
    (None, TypeError),
]


def _set(obj: Any, value: Any) -> None:
    obj.compression = value


def _model() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 1, 3))


# (entry point, the argument's name, a call passing it the value)
ENTRIES: list[tuple[str, str, Callable[[Any], Any]]] = [
    ("BandLimit", "compression", lambda c: BandLimit(compression=c)),
    ("BandLimit.compression=", "compression", lambda c: _set(BandLimit(compression=0.5), c)),
    ("AdaptiveBandLimit", "compression", lambda c: AdaptiveBandLimit(compression=c)),
    ("AdaptiveBandLimit min", "min_compression", lambda c: AdaptiveBandLimit(min_compression=c)),
    ("AdaptiveBandLimit max", "max_compression", lambda c: AdaptiveBandLimit(max_compression=c)),
    (
        "AdaptiveBandLimit max, exact levers",
        "max_compression",
        lambda c: AdaptiveBandLimit(max_compression=c, levers=["checkpoint"]),
    ),
    ("LadderController min", "min_compression", lambda c: LadderController(min_compression=c)),
    ("LadderController max", "max_compression", lambda c: LadderController(max_compression=c)),
    ("bandlimit", "compression", lambda c: bandlimit(_model(), c)),
    ("set_compression", "compression", lambda c: set_compression(bandlimit(_model(), 0.5), c)),
    ("set_compression, no layers", "compression", lambda c: set_compression(nn.Linear(1, 1), c)),
    ("BandLimitedConv2d", "compression", lambda c: BandLimitedConv2d(1, 1, 3, compression=c)),
    ("BandLimitedConv1d", "compression", lambda c: BandLimitedConv1d(1, 1, 3, compression=c)),
    ("layer.compression=", "compression", lambda c: _set(BandLimitedConv2d(1, 1, 3), c)),
    ("from_conv", "compression", lambda c: BandLimitedConv2d.from_conv(nn.Conv2d(1, 1, 3), c)),
    (
        "fft_conv2d",
        "compression",
        lambda c: fft_conv2d(torch.ones(1, 1, 4, 4), torch.ones(1, 1, 3, 3), compression=c),
    ),
    (
        "fft_conv1d",
        "compression",
        lambda c: fft_conv1d(torch.ones(1, 1, 4), torch.ones(1, 1, 3), compression=c),
    ),
    ("spectral_band", "compression", lambda c: spectral_band((8, 8), c)),
    ("check_compression", "compression", check_compression),
]


@pytest.mark.parametrize(("value", "error"), BAD, ids=[repr(v) for v, _ in BAD])
@pytest.mark.parametrize(("entry", "name", "call"), ENTRIES, ids=[e for e, _, _ in ENTRIES])
def test_every_entry_point_refuses_a_bad_compression_alike(
    entry: str, name: str, call: Callable[[Any], Any], value: Any, error: type[Exception]
) -> None:
    if entry.startswith("spectral_band") or entry == "check_compression":
        # valid rates equal to some invalid ones (0 == False) in the band cache first: a cached
        # result must not let an invalid rate through
        spectral_band((8, 8), 0.0), spectral_band((8, 8), 0)
    with pytest.raises((TypeError, ValueError)) as info:
        call(value)
    assert info.type is error, f"{entry}: {info.type.__name__}: {info.value}"
    message = str(info.value)
    assert re.match(rf"{name} must be ", message), f"{entry}: {message}"
    if error is TypeError or value in (1.5, 1.0, -0.1):
        assert "in [0, 1)" in message, f"{entry}: {message}"  # the range allowed is named
    assert message.endswith(
        f"got {value!r}" if error is ValueError else f"got {value!r} ({type(value).__name__})"
    )


def test_a_valid_compression_is_taken_as_a_float_everywhere() -> None:
    assert BandLimit(compression=0).compression == 0.0
    assert AdaptiveBandLimit(compression=0.25).compression == 0.25
    assert isinstance(BandLimitedConv2d(1, 1, 3, compression=0).compression, float)


def test_adaptive_band_limit_clamps_a_valid_compression_into_its_bounds() -> None:
    # the documented clamp of a compression in [0, 1): into [min_compression, max_compression]
    assert AdaptiveBandLimit(compression=0.95, max_compression=0.8).compression == 0.8
    assert AdaptiveBandLimit(compression=0.0, min_compression=0.2).compression == 0.2
