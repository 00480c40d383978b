"""Models: backbones by name and the ``ImageClassifier`` LightningModule."""

from lightning_bandlimit.models.backbones import BACKBONES, build_backbone, cifar_resnet18, small_cnn
from lightning_bandlimit.models.classifier import CIFAR10_MEAN, CIFAR10_STD, ImageClassifier, Normalize

__all__ = [
    "BACKBONES",
    "CIFAR10_MEAN",
    "CIFAR10_STD",
    "ImageClassifier",
    "Normalize",
    "build_backbone",
    "cifar_resnet18",
    "small_cnn",
]
