"""Swap a model's convolutions for band-limited twins, and back, in place.

The swap changes the class of each selected ``nn.Conv1d`` / ``nn.Conv2d`` module object to its
band-limited subclass; the objects themselves stay. So parameters, buffers, hooks (and the
handles that remove them), device, dtype, train/eval mode, ``state_dict`` keys, an optimizer
built earlier and any reference the user holds all stay valid, and :func:`unbandlimit` is an
exact inverse.

Which convolutions are converted: modules whose type is exactly ``nn.Conv1d`` or ``nn.Conv2d``
(subclasses may override ``forward`` and are left alone; transposed convolutions are not
convolutions of this kind), selected by ``include`` / ``exclude`` glob patterns over their
qualified names. **1x1 convolutions are skipped by default** (``pointwise=False``): they have no
spatial extent, so in the frequency domain they cost the same channel mixing as directly plus
two transforms, and band-limiting one only low-passes its input. ResNet's 1x1 downsampling
shortcuts therefore stay plain unless ``pointwise=True``.

**Memory-lean training** (``memory_lean=True``, the default): the selected ``nn.BatchNorm1d/2d``,
``nn.ReLU``, ``nn.MaxPool2d`` and the convolutions left plain (1x1) become their memory-lean twins
(:mod:`lightning_bandlimit.layers.lean`), swapped the same way, and the band-limited layers keep
the smallest exact form of their input. Together they keep for backward, per conv-BN-ReLU, the
kept spectrum of the convolution's output and a bit mask instead of three full-size tensors;
gradients are unchanged (to round-off). ``unbandlimit`` turns them back as well.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterator, Sequence

from torch import nn

from lightning_bandlimit.layers.band_limited import (
    BANDLIMITED_TWINS,
    BandLimitedConvNd,
    swap_to_bandlimited,
    swap_to_plain,
)
from lightning_bandlimit.layers.lean import LEAN_TWINS, LeanModule
from lightning_bandlimit.utils.validation import check_bool, check_compression

__all__ = ["bandlimit", "bandlimited_layers", "normalize_patterns", "set_compression", "unbandlimit"]


Patterns = str | Sequence[str] | None


def normalize_patterns(name: str, value: Patterns) -> tuple[str, ...] | None:
    """Check an ``include`` / ``exclude`` argument and return it as a tuple (or ``None``).

    Args:
        name: the argument's name, for the error message.
        value: ``None``, a glob pattern, or a sequence of them.

    Raises:
        TypeError: for anything else.

    Example:
        >>> normalize_patterns("include", "layer1.*")
        ('layer1.*',)
    """
    if value is None:
        return None
    if isinstance(value, str):
        return (value,)
    if isinstance(value, Sequence) and all(isinstance(p, str) for p in value):
        return tuple(value)
    raise TypeError(f"{name} must be a glob pattern or a sequence of them, got {value!r}")


def _selected(qualified_name: str, include: tuple[str, ...] | None, exclude: tuple[str, ...] | None) -> bool:
    if include is not None and not any(fnmatch.fnmatchcase(qualified_name, p) for p in include):
        return False
    return not (exclude and any(fnmatch.fnmatchcase(qualified_name, p) for p in exclude))


def bandlimited_layers(
    model: nn.Module, *, include: Patterns = None, exclude: Patterns = None
) -> Iterator[tuple[str, BandLimitedConvNd]]:
    """Iterate over ``(qualified_name, layer)`` for the band-limited layers of ``model``.

    Args:
        model: any module (the model itself counts when it is a band-limited layer).
        include: glob patterns over qualified names; only matching layers are yielded.
        exclude: glob patterns over qualified names; matching layers are skipped.

    Raises:
        TypeError: if a pattern argument is not a string or a sequence of strings.

    Example:
        >>> model = bandlimit(nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3)), 0.5)
        >>> [name for name, _ in bandlimited_layers(model)]
        ['0', '2']
    """
    inc, exc = normalize_patterns("include", include), normalize_patterns("exclude", exclude)
    for name, module in model.named_modules():
        if isinstance(module, BandLimitedConvNd) and _selected(name, inc, exc):
            yield name, module


def bandlimit(
    model: nn.Module,
    compression: float = 0.0,
    *,
    include: Patterns = None,
    exclude: Patterns = None,
    pointwise: bool = False,
    memory_lean: bool = True,
) -> nn.Module:
    """Band-limit ``model``'s convolutions in place (see the module docstring for which).

    Args:
        model: the model to convert; it is modified in place and returned.
        compression: the compression of the converted layers, in ``[0, 1)``. Layers that were
            band-limited already keep theirs (use :func:`set_compression`).
        include: glob patterns over qualified module names (``"layer1.*"``); only matching
            convolutions are converted.
        exclude: glob patterns; matching convolutions are not converted.
        pointwise: also convert 1x1 convolutions.
        memory_lean: also swap the selected BatchNorm, ReLU, max-pool and remaining plain
            convolution modules for their memory-lean twins, and make the converted layers keep
            the smallest exact form of their input (module docstring). ``False`` changes the
            convolutions only.

    Returns:
        ``model``.

    Raises:
        ValueError: if ``compression`` is outside ``[0, 1)``.
        TypeError: if ``compression`` is not a real number, a pattern argument is not a string
            or a sequence of strings, or ``pointwise`` / ``memory_lean`` is not a bool.

    Example:
        >>> model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 4, 1))
        >>> bandlimit(model, 0.5)
        Sequential(
          (0): BandLimitedConv2d(3, 8, kernel_size=(3, 3), stride=(1, 1), compression=0.5)
          (1): LeanReLU()
          (2): LeanConv2d(8, 4, kernel_size=(1, 1), stride=(1, 1))
        )
        >>> unbandlimit(model)
        Sequential(
          (0): Conv2d(3, 8, kernel_size=(3, 3), stride=(1, 1))
          (1): ReLU()
          (2): Conv2d(8, 4, kernel_size=(1, 1), stride=(1, 1))
        )
        >>> bandlimit(model, 0.5, memory_lean=False)[1]
        ReLU()
    """
    compression = check_compression(compression)
    check_bool("pointwise", pointwise)
    check_bool("memory_lean", memory_lean)
    inc, exc = normalize_patterns("include", include), normalize_patterns("exclude", exclude)
    selected = [module for name, module in model.named_modules() if _selected(name, inc, exc)]
    chosen = [
        module
        for module in selected
        if type(module) in BANDLIMITED_TWINS and (pointwise or any(k != 1 for k in module.kernel_size))  # type: ignore[union-attr]
    ]
    converted = {id(m) for m in chosen}
    companions = [m for m in selected if memory_lean and type(m) in LEAN_TWINS and id(m) not in converted]
    for module in chosen:
        swap_to_bandlimited(module, compression, memory_lean)
    for module in companions:
        module.__class__ = LEAN_TWINS[type(module)]  # type: ignore[assignment]
    return model


def unbandlimit(model: nn.Module) -> nn.Module:
    """Turn every band-limited layer and memory-lean module of ``model`` back into its plain class.

    The exact inverse of :func:`bandlimit`: the same module objects, parameters and hooks.

    Args:
        model: the model to convert; it is modified in place and returned.

    Returns:
        ``model``.

    Example:
        >>> model = bandlimit(nn.Sequential(nn.Conv1d(2, 2, 3)), 0.25)
        >>> type(unbandlimit(model)[0]).__name__
        'Conv1d'
    """
    chosen = [module for _, module in bandlimited_layers(model)]
    lean = [module for module in model.modules() if isinstance(module, LeanModule)]
    for module in chosen:
        swap_to_plain(module)
    for module in lean:
        module.__class__ = module._plain  # type: ignore[assignment]
    return model


def set_compression(
    model: nn.Module, compression: float, *, include: Patterns = None, exclude: Patterns = None
) -> int:
    """Set the compression of ``model``'s band-limited layers (all, or the selected ones).

    Args:
        model: a model with band-limited layers.
        compression: the new compression, in ``[0, 1)``.
        include: glob patterns over qualified names; only matching layers are set.
        exclude: glob patterns; matching layers are left alone.

    Returns:
        The number of layers set (0 when the model has no band-limited layers).

    Raises:
        ValueError: if ``compression`` is outside ``[0, 1)``.
        TypeError: if a pattern argument is not a string or a sequence of strings.

    Example:
        >>> model = bandlimit(nn.Sequential(nn.Conv2d(3, 8, 3), nn.Conv2d(8, 8, 3)))
        >>> set_compression(model, 0.5, exclude="0")
        1
    """
    compression = check_compression(compression)
    layers = [layer for _, layer in bandlimited_layers(model, include=include, exclude=exclude)]
    for layer in layers:
        layer.compression = compression
    return len(layers)
