"""Segments of a plain chain (VGG's, AlexNet's ``features``) checkpointed as units.

A plain ``nn.Sequential`` chain of layers has no block to checkpoint; like
``torch.utils.checkpoint.checkpoint_sequential`` (which splits by count) it is split here, at its
pooling layers, into segments that each end at a change of resolution. A :class:`Segment` names
children ``[start, stop)`` of the chain; checkpointing one changes the chain's class to a
subclass whose ``forward`` runs that range under ``torch.utils.checkpoint`` (made once per class,
as :mod:`lightning_bandlimit.recompute.switch` does for modules), so the chain object, its
children, hooks and ``state_dict`` keys stay, and the last segment switched off gives it its
own class back.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.nn.modules import pooling

from lightning_bandlimit.recompute.arguments import checkpoint_call
from lightning_bandlimit.recompute.pointwise import pointwise_contexts
from lightning_bandlimit.recompute.running_stats import running_stats_kept

__all__ = ["POOLS", "Segment", "chain_segments", "own_class"]

#: layers that end a segment (a change of resolution)
POOLS = (
    pooling._MaxPoolNd,
    pooling._AvgPoolNd,
    pooling._AdaptiveAvgPoolNd,
    pooling._AdaptiveMaxPoolNd,
    pooling._LPPoolNd,
)
_CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)


class Segment:
    """Children ``[start, stop)`` of a plain ``nn.Sequential`` chain, as one checkpointing unit.

    It quacks like a module where the checkpointing code looks: :meth:`modules`, ``training``
    and the two forward hooks (on its first and last child).

    Args:
        chain: the ``nn.Sequential`` (its class must not override ``forward``).
        start: first child.
        stop: one past the last child.
        name: the unit's name in messages (default: its ``repr``).

    Raises:
        TypeError: if ``chain`` is not a plain ``nn.Sequential``.
        ValueError: for an empty or out-of-range ``[start, stop)``.

    Example:
        >>> chain = nn.Sequential(nn.Conv2d(1, 2, 3), nn.MaxPool2d(2), nn.Conv2d(2, 2, 3))
        >>> segment = Segment(chain, 0, 2)
        >>> segment.checkpoint(); type(chain).__name__, segment.is_checkpointed()
        ('SegmentedSequential', True)
        >>> chain(torch.rand(2, 1, 12, 12, requires_grad=True)).sum().backward()
        >>> segment.uncheckpoint(); type(chain).__name__
        'Sequential'
    """

    def __init__(self, chain: nn.Sequential, start: int, stop: int, name: str | None = None) -> None:
        if not isinstance(chain, nn.Sequential) or own_class(chain).forward is not nn.Sequential.forward:
            raise TypeError(f"a segment needs a plain nn.Sequential, got {type(chain).__name__}")
        if not 0 <= start < stop <= len(chain):
            raise ValueError(f"segment [{start}, {stop}) is empty or outside a chain of {len(chain)}")
        self.chain, self.start, self.stop = chain, start, stop
        self.mode = "full"  # how it runs while checkpointed
        self.name = name if name is not None else repr(self)

    def __repr__(self) -> str:
        return f"Segment({own_class(self.chain).__name__}[{self.start}:{self.stop}])"

    def __call__(self, input: Any) -> Any:
        """Run the segment's layers as its chain runs them (checkpointed while it is, in training)."""
        if self.is_checkpointed() and self.training and torch.is_grad_enabled():
            pointwise = self.mode == "pointwise"
            return checkpoint_call(self._run, (input,), {}, self._context, self.name, pointwise)
        return self._run(input)

    def _run(self, input: Any) -> Any:
        for layer in self.layers():
            input = layer(input)
        return input

    def _context(self) -> tuple[Any, Any]:
        kept = lambda: running_stats_kept(list(self.modules()))  # noqa: E731
        if self.mode == "pointwise":
            return pointwise_contexts(kept)
        return contextlib.nullcontext(), kept()

    def layers(self) -> list[nn.Module]:
        """The children in the segment."""
        return list(self.chain)[self.start : self.stop]

    def modules(self) -> Iterator[nn.Module]:
        """Every module in the segment (its children and theirs)."""
        for layer in self.layers():
            yield from layer.modules()

    def children(self) -> Iterator[nn.Module]:
        """The children in the segment."""
        yield from self.layers()

    @property
    def training(self) -> bool:
        return self.chain.training

    def register_forward_pre_hook(self, hook: Callable[..., Any]) -> Any:
        """``hook(segment, args)`` before the segment's first child runs."""
        return self.layers()[0].register_forward_pre_hook(lambda _, args: hook(self, args))

    def register_forward_hook(self, hook: Callable[..., Any]) -> Any:
        """``hook(segment, args, output)`` after its last child ran."""
        return self.layers()[-1].register_forward_hook(lambda _, args, out: hook(self, args, out))

    def is_checkpointed(self) -> bool:
        return (self.start, self.stop) in getattr(self.chain, "_checkpointed_segments", {})

    def checkpoint(self, mode: str = "full") -> None:
        """Run the segment checkpointed from the chain's next training forward on, in ``mode``
        (``"full"`` or ``"pointwise"``, as :func:`~lightning_bandlimit.recompute.switch.checkpoint`).

        Raises:
            ValueError: ``mode`` is neither.
        """
        if mode not in ("pointwise", "full"):
            raise ValueError(f"mode must be one of ['pointwise', 'full'], got {mode!r}")
        self.mode = mode
        if not isinstance(self.chain, _Segmented):
            self.chain.__class__ = _segmented_class(type(self.chain))
            self.chain._checkpointed_segments = {}  # type: ignore[assignment]
        self.chain._checkpointed_segments[(self.start, self.stop)] = self  # type: ignore[index]

    def uncheckpoint(self) -> None:
        """The exact inverse of :meth:`checkpoint`."""
        if not self.is_checkpointed():
            return
        segments = self.chain._checkpointed_segments  # type: ignore[attr-defined]
        del segments[(self.start, self.stop)]
        if not segments:
            del self.chain._checkpointed_segments
            self.chain.__class__ = self.chain._base_class  # type: ignore[attr-defined]


class _Segmented:
    """Mixin of the segmented chains: the checkpointed segments run themselves (:meth:`Segment.__call__`)."""

    _base_class: type[nn.Sequential]
    _checkpointed_segments: dict[tuple[int, int], Segment]

    def forward(self, input: Any) -> Any:
        chain: Any = self
        if not (chain.training and torch.is_grad_enabled()):
            return super().forward(input)  # type: ignore[misc]
        layers = list(chain)
        starts = {segment.start: segment for segment in self._checkpointed_segments.values()}
        i = 0
        while i < len(layers):
            segment = starts.get(i)
            if segment is None:
                input = layers[i](input)
                i += 1
            else:
                input = segment(input)
                i = segment.stop
        return input


_SUBCLASSES: dict[type[nn.Module], type[nn.Module]] = {}


def _segmented_class(cls: type[nn.Module]) -> type[nn.Module]:
    sub = _SUBCLASSES.get(cls)
    if sub is None:
        sub = type(f"Segmented{cls.__name__}", (_Segmented, cls), {"_base_class": cls})
        sub.__module__ = cls.__module__
        _SUBCLASSES[cls] = sub
    return sub


def own_class(module: nn.Module) -> type[nn.Module]:
    """The module's own class, under a checkpointing or segmenting subclass (``_base_class``)."""
    return getattr(type(module), "_base_class", type(module))


def _has_spatial_conv(modules: list[nn.Module]) -> bool:
    return any(isinstance(m, _CONVS) and max(m.kernel_size) > 1 for layer in modules for m in layer.modules())


def chain_segments(chain: nn.Module) -> list[tuple[int, int]]:
    """The ranges a plain chain splits into: each ends at a pooling layer (or the chain's end) and
    holds a convolution with a kernel larger than 1; none unless there are at least two.

    Args:
        chain: any module; only a plain ``nn.Sequential`` (``forward`` not overridden) splits.

    Example:
        >>> from lightning_bandlimit.models import small_cnn
        >>> chain_segments(small_cnn(width=4))
        [(0, 4), (4, 8), (8, 12)]
        >>> chain_segments(nn.Sequential(nn.Conv2d(1, 1, 3), nn.ReLU()))
        []
    """
    if not isinstance(chain, nn.Sequential) or own_class(chain).forward is not nn.Sequential.forward:
        return []
    layers = list(chain)
    ranges, start = [], 0
    for i, layer in enumerate(layers):
        if isinstance(layer, POOLS):
            ranges.append((start, i + 1))
            start = i + 1
    if start < len(layers):
        ranges.append((start, len(layers)))
    ranges = [(a, b) for a, b in ranges if _has_spatial_conv(layers[a:b])]
    return ranges if len(ranges) >= 2 else []
