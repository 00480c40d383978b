"""Functional band-limited FFT convolutions."""

from lightning_bandlimit.functional.band import SpectralBand, check_compression, spectral_band
from lightning_bandlimit.functional.fft_conv import fft_conv1d, fft_conv2d

__all__ = ["SpectralBand", "check_compression", "fft_conv1d", "fft_conv2d", "spectral_band"]
