"""Data modules yielding images in ``[0, 1]`` (normalisation belongs to the model)."""

from lightning_bandlimit.data.cifar10 import CIFAR10DataModule
from lightning_bandlimit.data.cifar10_batches import load_cifar10_batches, write_fake_cifar10
from lightning_bandlimit.data.synthetic import CLASSES, SyntheticImageDataModule, SyntheticImages, render

__all__ = [
    "CIFAR10DataModule",
    "CLASSES",
    "SyntheticImageDataModule",
    "SyntheticImages",
    "load_cifar10_batches",
    "render",
    "write_fake_cifar10",
]
