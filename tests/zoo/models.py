"""The model zoo of the conformance suite: one table for ``tests/zoo`` and ``benchmarks/zoo/zoo_matrix.py``.

Each entry builds a fresh, randomly initialised classifier (``num_classes`` outputs, nothing
downloaded): the smallest torchvision model of each classification family, and a few timm CNN
families. ``size`` is the input's side (Inception v3 needs at least 75 pixels).

VGG's and AlexNet's classifier heads are shrunk (global average pooling and a 256-wide hidden
layer instead of 7x7 / 6x6 pooling into 4096 units): at 32x32 or 64x64 inputs their pooling
only repeats a 1x1 / 1x1 map, and the 57-129M-parameter heads would cost most of the suite's
time while no convolution is in them. The convolutional features, which the levers act on, are
torchvision's.

The last model built is kept (seeded) and handed out as deep copies, so each caller gets its own
fresh model; building another one drops it (the suite runs a model's cells one after another, and
32 models kept alive would hold gigabytes across the run).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

NUM_CLASSES = 10


@dataclass(frozen=True)
class ZooModel:
    """How to build one zoo model, and what it needs."""

    family: str
    build: Callable[[], nn.Module]
    size: int = 32
    source: str = "torchvision"
    min_size: int = 32  # the smallest input side it runs on (``benchmarks/zoo/zoo_matrix.py --size``)


def _tv(name: str, **kwargs: object) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import torchvision.models as tvm

        return getattr(tvm, name)(weights=None, num_classes=NUM_CLASSES, **kwargs)

    return build


def _timm(name: str, **kwargs: object) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import timm

        return timm.create_model(name, pretrained=False, num_classes=NUM_CLASSES, **kwargs)

    return build


def _small_head(build: Callable[[], nn.Module], features: int) -> Callable[[], nn.Module]:
    def small() -> nn.Module:
        model = build()
        model.avgpool = nn.AdaptiveAvgPool2d(1)  # type: ignore[assignment]
        model.classifier = nn.Sequential(  # type: ignore[assignment]
            nn.Dropout(0.5), nn.Linear(features, 256), nn.ReLU(inplace=True), nn.Linear(256, NUM_CLASSES)
        )
        return model

    return small


_NO_AUX = {"aux_logits": False, "init_weights": False}

#: name -> how to build it; torchvision first, then timm (``timm/<name>``), grouped by family.
MODELS: dict[str, ZooModel] = {
    "resnet18": ZooModel("ResNet", _tv("resnet18")),
    "resnet50": ZooModel("ResNet", _tv("resnet50")),
    "resnext50_32x4d": ZooModel("ResNeXt", _tv("resnext50_32x4d")),
    "wide_resnet50_2": ZooModel("Wide-ResNet", _tv("wide_resnet50_2")),
    "densenet121": ZooModel("DenseNet", _tv("densenet121")),
    "vgg11": ZooModel("VGG", _small_head(_tv("vgg11"), 512)),
    "vgg11_bn": ZooModel("VGG", _small_head(_tv("vgg11_bn"), 512)),
    "alexnet": ZooModel("AlexNet", _small_head(_tv("alexnet"), 256), size=64, min_size=64),
    "mobilenet_v2": ZooModel("MobileNet", _tv("mobilenet_v2")),
    "mobilenet_v3_small": ZooModel("MobileNet", _tv("mobilenet_v3_small")),
    "efficientnet_b0": ZooModel("EfficientNet", _tv("efficientnet_b0")),
    "efficientnet_v2_s": ZooModel("EfficientNet v2", _tv("efficientnet_v2_s")),
    "regnet_x_400mf": ZooModel("RegNet", _tv("regnet_x_400mf")),
    "regnet_y_400mf": ZooModel("RegNet", _tv("regnet_y_400mf")),
    "mnasnet0_5": ZooModel("MNASNet", _tv("mnasnet0_5")),
    "shufflenet_v2_x0_5": ZooModel("ShuffleNet", _tv("shufflenet_v2_x0_5")),
    "squeezenet1_1": ZooModel("SqueezeNet", _tv("squeezenet1_1")),
    "googlenet": ZooModel("Inception", _tv("googlenet", **_NO_AUX)),
    "inception_v3": ZooModel("Inception", _tv("inception_v3", **_NO_AUX), size=80, min_size=75),
    "convnext_tiny": ZooModel("ConvNeXt", _tv("convnext_tiny")),
    "timm/resnet18": ZooModel("ResNet", _timm("resnet18"), source="timm"),
    "timm/convnext_atto": ZooModel("ConvNeXt", _timm("convnext_atto"), source="timm"),
    "timm/efficientnet_b0": ZooModel("EfficientNet", _timm("efficientnet_b0"), source="timm"),
    "timm/regnetx_002": ZooModel("RegNet", _timm("regnetx_002"), source="timm"),
    "timm/densenet121": ZooModel("DenseNet", _timm("densenet121"), source="timm"),
    "timm/dla46_c": ZooModel("DLA", _timm("dla46_c"), source="timm"),
    "timm/cspresnet50": ZooModel("CSPNet", _timm("cspresnet50"), source="timm"),
    "timm/mobilenetv3_small_050": ZooModel("MobileNet", _timm("mobilenetv3_small_050"), source="timm"),
    "timm/mixnet_s": ZooModel("MixNet", _timm("mixnet_s"), source="timm"),
    "timm/ghostnet_050": ZooModel("GhostNet", _timm("ghostnet_050"), source="timm"),
    "timm/repvgg_a0": ZooModel("RepVGG", _timm("repvgg_a0"), source="timm"),
    "timm/nf_resnet26": ZooModel("NF-ResNet", _timm("nf_resnet26"), source="timm"),
}


_PROTOTYPES: dict[str, nn.Module] = {}  # at most one: the model last built


def build(name: str, dtype: torch.dtype = torch.float32) -> nn.Module:
    """A fresh ``name`` model in training mode (a deep copy of one seeded build, so equal ones)."""
    if name not in _PROTOTYPES:
        _PROTOTYPES.clear()
        state = torch.random.get_rng_state()
        torch.manual_seed(0)
        _PROTOTYPES[name] = MODELS[name].build()
        torch.random.set_rng_state(state)
    return copy.deepcopy(_PROTOTYPES[name]).to(dtype).train()


def batch(name: str, n: int = 2, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """A seeded random batch of images and labels for ``name``."""
    g = torch.Generator().manual_seed(1)
    size = MODELS[name].size
    x = torch.randn(n, 3, size, size, generator=g, dtype=dtype)
    return x, torch.randint(0, NUM_CLASSES, (n,), generator=g)


__all__ = ["MODELS", "NUM_CLASSES", "ZooModel", "batch", "build"]
