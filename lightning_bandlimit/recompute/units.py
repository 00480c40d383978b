"""Which modules of a model are checkpointing units: one generic rule, per-family knowledge as data.

The rule (:func:`find_units`): the smallest modules (not the model itself, nor containers such as
``nn.Sequential``) whose subtree holds at least two convolution or linear layers, one of them a
convolution with a kernel larger than 1 (ResNet's basic and bottleneck blocks, MobileNet's and
EfficientNet's inverted residuals, ConvNeXt's blocks of one depthwise convolution and two linear
layers, DenseNet's layers, Inception's modules); plain chains (VGG, AlexNet) split into
segments at their pooling layers (:mod:`.segments`). What the rule cannot see is kept as data,
as timm keeps it per family:

* :data:`UNIT_CLASSES`: classes that are units as a whole, though a part of them would match
  the rule (torchvision RegNet's block: its residual sum lies outside its transform);
* :data:`SELF_CHECKPOINTING`: attributes by which a module says it checkpoints itself
  (torchvision DenseNet's ``memory_efficient``, timm's ``set_grad_checkpointing``): nothing in
  it is checkpointed a second time.

A candidate holding every spatial convolution of the model is the whole network, not a unit.
"""

from __future__ import annotations

from torch import nn

from lightning_bandlimit.recompute.segments import Segment, chain_segments, own_class

__all__ = ["SELF_CHECKPOINTING", "UNIT_CLASSES", "Unit", "find_units"]

Unit = nn.Module | Segment

#: qualified class names of modules that are units as a whole
UNIT_CLASSES: frozenset[str] = frozenset(
    {
        "torchvision.models.regnet.ResBottleneckBlock",  # the rule alone finds its transform `f`
    }
)

#: attribute name -> who sets it; a module whose attribute is ``True`` checkpoints itself
SELF_CHECKPOINTING: dict[str, str] = {
    "memory_efficient": "torchvision DenseNet (memory_efficient=True)",
    "grad_checkpointing": "timm (model.set_grad_checkpointing())",
}

_CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)
_CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _is_spatial(m: nn.Module) -> bool:
    return isinstance(m, _CONVS) and max(m.kernel_size) > 1


def _matches_rule(module: nn.Module) -> bool:
    cls = own_class(module)
    if issubclass(cls, _CONTAINERS) or issubclass(cls, (*_CONVS, nn.Linear)):
        return False
    if next(module.children(), None) is None:
        return False
    layers = [m for m in module.modules() if isinstance(m, (*_CONVS, nn.Linear))]
    return len(layers) >= 2 and any(_is_spatial(m) for m in layers)


def _self_checkpointing(module: nn.Module) -> bool:
    return any(getattr(module, attribute, False) is True for attribute in SELF_CHECKPOINTING)


def find_units(model: nn.Module) -> list[tuple[str, Unit]]:
    """The units of ``model`` by the rule and the data above, in module order.

    Args:
        model: the model (never a unit itself).

    Example:
        >>> import torchvision
        >>> names = [n for n, _ in find_units(torchvision.models.vgg11())]
        >>> names
        ['features[0:3]', 'features[3:6]', 'features[6:11]', 'features[11:16]', 'features[16:21]']
        >>> [n for n, _ in find_units(torchvision.models.regnet_y_400mf())][:2]
        ['trunk_output.block1.block1-0', 'trunk_output.block2.block2-0']
    """
    skip: list[str] = []  # modules that checkpoint themselves, with everything inside them
    named = []
    for name, module in model.named_modules():
        if not name:
            continue
        if any(name == s or name.startswith(s + ".") for s in skip):
            continue
        if _self_checkpointing(module):
            skip.append(name)
            continue
        named.append((name, module))
    inside = lambda name, outer: name.startswith(outer + ".")  # noqa: E731
    listed = {n for n, m in named if _qualified(own_class(m)) in UNIT_CLASSES}
    blocks = [
        (n, m)
        for n, m in named
        if n in listed or (_matches_rule(m) and not any(inside(n, o) for o in listed))
    ]
    blocks = [(n, m) for n, m in blocks if not any(inside(o, n) for o, _ in blocks)]
    segments: list[tuple[str, Unit]] = []
    for name, module in named:
        if any(inside(b, name) or b == name for b, _ in blocks):
            continue  # a chain of blocks: the blocks are its units
        for start, stop in chain_segments(module):
            label = f"{name}[{start}:{stop}]"
            segments.append((label, Segment(module, start, stop, name=label)))  # type: ignore[arg-type]
    # a block that holds segments (VGG inside a user's module) is not the smallest unit
    blocks = [(n, m) for n, m in blocks if not any(s.startswith(n + ".") for s, _ in segments)]
    units: list[tuple[str, Unit]] = [*blocks, *segments]
    spatial = {id(m) for m in model.modules() if _is_spatial(m)}
    whole = [n for n, u in units if spatial and spatial <= {id(m) for m in u.modules() if _is_spatial(m)}]
    order = {name: i for i, (name, _) in enumerate(model.named_modules())}
    units = [(n, u) for n, u in units if n not in whole]
    # a segment sorts at its chain's place, by its first layer
    return sorted(
        units, key=lambda nu: (order[nu[0].split("[")[0]], nu[1].start if isinstance(nu[1], Segment) else -1)
    )
