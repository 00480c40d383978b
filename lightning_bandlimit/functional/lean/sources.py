"""Exact, compact descriptions of activations: how an activation is rebuilt from what is kept anyway.

Autograd keeps, per op, the tensors its backward needs. In a conv -> BatchNorm -> ReLU -> conv
chain most of them are recomputable exactly from something smaller that is kept anyway: a
band-limited convolution's output from its kept spectrum, a BatchNorm output from its input and
two per-channel vectors, a ReLU output from the BatchNorm output it was computed from. A
:class:`Source` is such a recipe: a frozen description plus the tensors it reads, and
:meth:`Source.rebuild` recomputes the activation: with the very same operations the forward pass
used (a convolution's output from its spectrum, bit for bit on a deterministic backend), or with
the same formula in another kernel (a BatchNorm output, equal to round-off; what must be exact,
the ReLU mask, is kept from the forward pass itself).

This module holds the recipes of the lean ops (:class:`Saved`, :class:`Affine`, :class:`Relu`;
a band-limited convolution's are in :mod:`lightning_bandlimit.functional.spectral_kernel`) and
:func:`rebuild`. How a recipe travels from the op that makes an activation to the op that saves
it is :mod:`.handoff`; a rebuilt input shared by the two backward ops that need it is
:mod:`.shared_rebuild`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from lightning_bandlimit.functional.lean.shared_rebuild import sharing

__all__ = ["Affine", "Relu", "Saved", "Source", "affine", "rebuild"]


class Source:
    """Recipe for recomputing one activation exactly from the tensors it lists.

    Subclasses are frozen dataclasses holding only static information; the tensors travel
    beside them (``tensors`` at publication, ``ctx.saved_tensors`` in the backward pass), in the
    order :meth:`rebuild` consumes them.
    """

    #: whether :meth:`rebuild` returns a new tensor (``False``: one of the saved tensors itself)
    fresh: bool = True

    def rebuild(self, tensors: Iterator[torch.Tensor]) -> torch.Tensor:
        """Recompute the activation, taking its tensors from ``tensors`` in order."""
        raise NotImplementedError


@dataclass(frozen=True)
class Saved(Source):
    """The activation is kept as itself."""

    fresh = False

    def rebuild(self, tensors: Iterator[torch.Tensor]) -> torch.Tensor:
        return next(tensors)


def affine(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``(x * scale + shift)`` per channel (dim 1), computed in ``scale``'s dtype, returned in ``dtype``.

    How a BatchNorm output in training mode is recomputed from its input.

    Example:
        >>> x = torch.ones(2, 3, 4)
        >>> affine(x, torch.tensor([1.0, 2.0, 3.0]), torch.zeros(3), torch.float32)[0, :, 0]
        tensor([1., 2., 3.])
    """
    shape = (1, -1) + (1,) * (x.dim() - 2)
    return torch.addcmul(shift.view(shape), x.to(scale.dtype), scale.view(shape)).to(dtype)


@dataclass(frozen=True)
class Affine(Source):
    """``affine(source, scale, shift, dtype)``: a BatchNorm output in training mode."""

    source: Source
    dtype: torch.dtype

    def rebuild(self, tensors: Iterator[torch.Tensor]) -> torch.Tensor:
        # The BatchNorm that produced this output rebuilds the same input next in the backward
        # pass (after the ReLU between them): a fresh input is left for it (:func:`~.shared_rebuild.reuse`).
        with sharing(self.source.fresh):
            x = self.source.rebuild(tensors)
        scale, shift = next(tensors), next(tensors)
        return affine(x, scale, shift, self.dtype)


@dataclass(frozen=True)
class Relu(Source):
    """``relu(source)``."""

    source: Source

    def rebuild(self, tensors: Iterator[torch.Tensor]) -> torch.Tensor:
        x = self.source.rebuild(tensors)
        return x.relu_() if self.source.fresh else x.relu()


def rebuild(source: Source, tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Recompute the activation ``source`` describes from exactly ``tensors``.

    Raises:
        ValueError: if ``tensors`` are more or fewer than the source reads.

    Example:
        >>> y = torch.randn(2, 3, 4)
        >>> scale, shift = torch.rand(3), torch.rand(3)
        >>> z = affine(y, scale, shift, y.dtype)
        >>> torch.equal(rebuild(Relu(Affine(Saved(), y.dtype)), [y, scale, shift]), z.relu())
        True
    """
    it = iter(tensors)
    out = source.rebuild(it)
    if next(it, None) is not None:
        raise ValueError(f"{type(source).__name__} was given more tensors than it reads")
    return out
