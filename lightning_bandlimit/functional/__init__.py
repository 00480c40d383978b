"""Functional band-limited convolutions computed in the frequency domain."""

from lightning_bandlimit.functional.band import SpectralBand, spectral_band
from lightning_bandlimit.functional.fft_conv import fft_conv1d, fft_conv2d
from lightning_bandlimit.functional.geometry import PADDING_MODES, fft_grid

__all__ = [
    "PADDING_MODES",
    "SpectralBand",
    "fft_conv1d",
    "fft_conv2d",
    "fft_grid",
    "spectral_band",
]
