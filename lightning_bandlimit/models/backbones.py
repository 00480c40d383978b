"""Image classification backbones, chosen by name.

``cifar_resnet18``: the ResNet-18 for 32x32 inputs used by the band-limited-training paper (3x3
stem, no max-pool, stages of 64/128/256/512 channels; ``width`` scales them). ``small_cnn``: a
three-block CNN for tests and quick runs. Any other name is looked up in ``torchvision.models``
(e.g. ``"resnet18"``, ``"mobilenet_v3_small"``), built without pretrained weights.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from lightning_bandlimit.utils.validation import check_int

__all__ = ["BACKBONES", "build_backbone", "cifar_resnet18", "small_cnn"]


class _BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(
                nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out)
            )

    def forward(self, x):  # type: ignore[no-untyped-def]
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


def cifar_resnet18(num_classes: int = 10, width: int = 64) -> nn.Module:
    """ResNet-18 for 32x32 images (He et al. 2016, CIFAR variant).

    Args:
        num_classes: number of output logits.
        width: channels of the first stage (64 in the paper; the others are 2x, 4x, 8x).

    Raises:
        TypeError: if ``num_classes`` or ``width`` is not an int.
        ValueError: if ``num_classes`` or ``width`` is not positive.

    Example:
        >>> import torch
        >>> cifar_resnet18(10, width=8)(torch.rand(2, 3, 32, 32)).shape
        torch.Size([2, 10])
    """
    check_int("num_classes", num_classes, minimum=1)
    check_int("width", width, minimum=1)
    widths = [width, 2 * width, 4 * width, 8 * width]
    layers: list[nn.Module] = [
        nn.Conv2d(3, width, 3, 1, 1, bias=False),
        nn.BatchNorm2d(width),
        nn.ReLU(inplace=True),
    ]
    c_in = width
    for stage, c_out in enumerate(widths):
        for block in range(2):
            layers.append(_BasicBlock(c_in, c_out, 2 if stage > 0 and block == 0 else 1))
            c_in = c_out
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c_in, num_classes)]
    return nn.Sequential(*layers)


def small_cnn(num_classes: int = 10, width: int = 32) -> nn.Module:
    """A three-block CNN (conv-BN-ReLU, two max-pools, global average pooling).

    Args:
        num_classes: number of output logits.
        width: channels of the first block (the others are 2x).

    Raises:
        TypeError: if ``num_classes`` or ``width`` is not an int.
        ValueError: if ``num_classes`` or ``width`` is not positive.

    Example:
        >>> import torch
        >>> small_cnn(10, width=8)(torch.rand(2, 3, 32, 32)).shape
        torch.Size([2, 10])
    """
    check_int("num_classes", num_classes, minimum=1)
    check_int("width", width, minimum=1)

    def block(c_in: int, c_out: int) -> list[nn.Module]:
        return [
            nn.Conv2d(c_in, c_out, 3, padding=1, bias=False),
            nn.BatchNorm2d(c_out),
            nn.ReLU(inplace=True),
        ]

    return nn.Sequential(
        *block(3, width),
        nn.MaxPool2d(2),
        *block(width, 2 * width),
        nn.MaxPool2d(2),
        *block(2 * width, 2 * width),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(2 * width, num_classes),
    )


BACKBONES: dict[str, Callable[..., nn.Module]] = {"cifar_resnet18": cifar_resnet18, "small_cnn": small_cnn}


def build_backbone(name: str, num_classes: int, width: int | None = None) -> nn.Module:
    """Build a backbone by name: one of :data:`BACKBONES`, or a ``torchvision.models`` name.

    Args:
        name: ``"cifar_resnet18"``, ``"small_cnn"`` or a torchvision model name.
        num_classes: number of output logits.
        width: base width for our own backbones (their default when ``None``); torchvision
            models take no width.

    Raises:
        ValueError: for an unknown name, or a width given to a torchvision model.

    Example:
        >>> build_backbone("small_cnn", 10, width=4)[0]
        Conv2d(3, 4, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1), bias=False)
    """
    if name in BACKBONES:
        kwargs = {} if width is None else {"width": width}
        return BACKBONES[name](num_classes, **kwargs)
    import torchvision

    available = torchvision.models.list_models(module=torchvision.models)
    if name not in available:
        raise ValueError(
            f"unknown backbone {name!r}: expected one of {sorted(BACKBONES)} or a torchvision "
            f"classification model such as 'resnet18' ({len(available)} available)"
        )
    if width is not None:
        raise ValueError(f"width applies to {sorted(BACKBONES)} only, not to torchvision's {name!r}")
    return torchvision.models.get_model(name, weights=None, num_classes=num_classes)
