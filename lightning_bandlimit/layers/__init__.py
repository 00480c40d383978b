"""The layers: band-limited convolutions (:mod:`.band_limited`), their memory-lean twins and
neighbours (:mod:`.lean`), swapping them into a model in place (:mod:`.surgery`) and
BatchNorm statistics that follow the compression (:mod:`.batchnorm`).

Example:
    >>> from torch import nn
    >>> from lightning_bandlimit.layers import BandLimitedConv2d, bandlimit
    >>> model = bandlimit(nn.Sequential(nn.Conv2d(3, 8, 3)), compression=0.5)
    >>> isinstance(model[0], BandLimitedConv2d)
    True
"""

from lightning_bandlimit.layers.band_limited import (
    BANDLIMITED_TWINS,
    BandLimitedConv1d,
    BandLimitedConv2d,
    BandLimitedConvNd,
    swap_to_bandlimited,
    swap_to_plain,
)
from lightning_bandlimit.layers.batchnorm import RecentBatches, recalibrate_batchnorm
from lightning_bandlimit.layers.surgery import (
    bandlimit,
    bandlimited_layers,
    normalize_patterns,
    set_compression,
    unbandlimit,
)

__all__ = [
    "BANDLIMITED_TWINS",
    "BandLimitedConv1d",
    "BandLimitedConv2d",
    "BandLimitedConvNd",
    "RecentBatches",
    "bandlimit",
    "bandlimited_layers",
    "normalize_patterns",
    "recalibrate_batchnorm",
    "set_compression",
    "swap_to_bandlimited",
    "swap_to_plain",
    "unbandlimit",
]
