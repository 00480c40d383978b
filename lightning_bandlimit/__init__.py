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
from lightning_bandlimit.utils.moved import install_moved_modules

MOVED_MODULES = {
    f"lightning_bandlimit.{old}": f"lightning_bandlimit.{new}"
    for old, new in {
        "batchnorm": "layers.batchnorm",
        "lean_layers": "layers.lean",
        "surgery": "layers.surgery",
        "checkpointing": "recompute.stages",
        "spectral_checkpoint": "recompute.spectral",
        "saved_tensors": "recompute.saved_tensors",
        "memory.ladder": "ladder.controller",
        "memory.memory_model": "ladder.memory_model",
        "memory.controller": "ladder.compression_only",
        "cli": "jobs.cli",
        "main_job": "jobs.main_job",
        "multitenant": "jobs.multitenant",
        "recipe_files": "utils.recipe_files",
        "main_summary": "utils.main_run",
        "callbacks.checkpoint_rungs": "callbacks.ladder_stages",
    }.items()
}
"""Modules of earlier releases' layout -> where they are now (the old paths still import)."""
install_moved_modules(MOVED_MODULES)

__version__ = "0.1.0"

__all__ = [
    "MOVED_MODULES",
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
