"""lightning-bandlimit: band-limited FFT convolutions for PyTorch Lightning.

Example:
    >>> import torch
    >>> from torch import nn
    >>> from lightning_bandlimit import bandlimit, set_compression
    >>> model = bandlimit(nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU()), compression=0.5)
    >>> model(torch.rand(1, 3, 32, 32)).shape
    torch.Size([1, 8, 32, 32])
    >>> set_compression(model, 0.25)
    1
"""

from lightning_bandlimit.functional import fft_conv1d, fft_conv2d, fft_grid, spectral_band
from lightning_bandlimit.layers import (
    BandLimitedConv1d,
    BandLimitedConv2d,
    BandLimitedConvNd,
    bandlimit,
    bandlimited_layers,
    set_compression,
    unbandlimit,
)
from lightning_bandlimit.recompute.saved_tensors import SavedTensorMeter

__version__ = "0.1.0"

__all__ = [
    "BandLimitedConv1d",
    "BandLimitedConv2d",
    "BandLimitedConvNd",
    "SavedTensorMeter",
    "bandlimit",
    "bandlimited_layers",
    "fft_conv1d",
    "fft_conv2d",
    "fft_grid",
    "set_compression",
    "spectral_band",
    "unbandlimit",
]
