"""Which units of a model are checkpointed: those the unit rule finds, or those glob patterns name.

:func:`checkpoint_units` is what :class:`~lightning_bandlimit.callbacks.AdaptiveBandLimit` (its
``checkpoint_units`` argument) and the benchmarks call: without patterns it takes the block-like
units and plain-chain segments of :func:`~lightning_bandlimit.recompute.units.find_units` (one
rule, per-family knowledge as data), with them every module whose qualified name matches; either
way ``exclude`` patterns leave modules out.
"""

from __future__ import annotations

import fnmatch

from torch import nn

from lightning_bandlimit.layers.surgery import Patterns, normalize_patterns
from lightning_bandlimit.recompute.units import Unit, find_units

__all__ = ["checkpoint_units"]


def checkpoint_units(
    model: nn.Module, include: Patterns = None, exclude: Patterns = None
) -> list[tuple[str, Unit]]:
    """The units of ``model`` worth checkpointing, as ``(qualified_name, unit)`` in module order.

    Without ``include``: the block-like units of
    :func:`~lightning_bandlimit.recompute.units.find_units`, i.e. the smallest modules (not
    ``model`` itself, nor containers such as ``nn.Sequential``) whose subtree holds at least two
    convolution or linear layers, one of them a convolution with a kernel larger than 1x1
    (ResNet's, MobileNet's, EfficientNet's, RegNet's and ConvNeXt's blocks, DenseNet's layers,
    Inception's modules), and the segments of plain chains (VGG's ``features`` split at its
    pooling layers, named ``features[0:3]``); modules that checkpoint themselves are left out,
    and so is a candidate that would be the whole network. With ``include``: every module whose
    qualified name matches one of its glob patterns (no nesting: a match inside another match is
    left out). ``exclude`` removes matches either way.

    Args:
        model: the model.
        include: glob patterns over qualified module names (``"backbone.3"``, ``"layer1.*"``).
        exclude: glob patterns of modules to leave out.

    Returns:
        The units, outermost first where patterns nest.

    Raises:
        TypeError: if a pattern argument is not a string or a sequence of strings.

    Example:
        >>> from lightning_bandlimit.models import cifar_resnet18
        >>> units = checkpoint_units(cifar_resnet18(width=4))
        >>> len(units), units[0][0]
        (8, '3')
        >>> [name for name, _ in checkpoint_units(cifar_resnet18(width=4), include="[34]")]
        ['3', '4']
    """
    include_t = normalize_patterns("include", include)
    exclude_t = normalize_patterns("exclude", exclude)

    def matches(name: str, patterns: tuple[str, ...] | None) -> bool:
        return bool(patterns) and any(fnmatch.fnmatchcase(name, p) for p in patterns)  # type: ignore[union-attr]

    named = [(n, m) for n, m in model.named_modules() if n and not matches(n, exclude_t)]
    if include_t is not None:
        chosen = [(n, m) for n, m in named if matches(n, include_t)]
        return [(n, m) for n, m in chosen if not any(n.startswith(o + ".") for o, _ in chosen)]
    # a segment is named ``chain[start:stop]``: excluding the chain excludes its segments
    return [
        (n, u)
        for n, u in find_units(model)
        if not (matches(n, exclude_t) or matches(n.split("[")[0], exclude_t))
    ]
