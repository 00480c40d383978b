"""Memory-lean twins of the modules around convolutions: BatchNorm, ReLU, max-pool, plain convs.

Each subclasses the ``torch.nn`` module it replaces (same parameters, buffers, ``state_dict``
keys, ``repr``) and only changes what autograd keeps for backward, through the ops of
:mod:`lightning_bandlimit.functional.lean.ops`: a ReLU keeps a bit mask, a BatchNorm keeps its
input as the spectrum a band-limited convolution handed over, a convolution after
``BatchNorm -> ReLU`` keeps nothing new, a max-pool keeps one byte per output. The results and
gradients equal those of the plain modules (to round-off). Outside training with gradients
(``eval()`` (e.g. attacks that need input gradients), ``torch.no_grad()``, inference) they run
the plain module's forward. They also run it on activations that carry no recipe, i.e. that do
not descend from a band-limited convolution at a compression above 0 (every activation at
``compression=0``; see ``_band_limited``): there the plain module keeps no more and runs faster.
While every band-limited layer of the process sits at its full band, that is decided by one global
test, not per activation (``_plain_forward``).
Inside ``torch.compile`` they run the plain module's forward too (see ``_plain_forward``): the
hand-off between lean ops goes through Python-side state that cannot be traced.

:func:`~lightning_bandlimit.layers.surgery.bandlimit` swaps them in (``memory_lean=True``, the default)
and :func:`~lightning_bandlimit.layers.surgery.unbandlimit` swaps them back.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn

from lightning_bandlimit.functional.lean.conv import lean_conv
from lightning_bandlimit.functional.lean.handoff import lookup, quiet
from lightning_bandlimit.functional.lean.ops import (
    BatchNormFunction,
    ReluFunction,
    lean_batch_norm,
    lean_relu,
    lean_wanted,
)
from lightning_bandlimit.functional.lean.pool import MaxPool2dFunction, lean_max_pool2d
from lightning_bandlimit.functional.spatial_conv import SpatialConvFunction
from lightning_bandlimit.functional.spectral_kernel import FFTConvFunction


def _plain_forward(training: bool, input: torch.Tensor, *params: torch.Tensor | None) -> bool:
    """Whether a lean module runs its plain module's forward: outside training with gradients,
    inside ``torch.compile``, or on an activation that is not band-limited.

    While no band-limited op is engaged (:func:`~lightning_bandlimit.functional.lean.handoff.quiet`:
    every band-limited layer at its full band, e.g. ``compression=0``), no activation is
    band-limited: one global test, the input is not looked at."""
    return (
        not training
        or torch.compiler.is_compiling()
        or quiet()
        or not lean_wanted(input, *params)
        or not _band_limited(input)
    )


def _band_limited(input: torch.Tensor) -> bool:
    """Whether ``input`` descends from a band-limited convolution at a compression above 0.

    True when an op published a recipe for it, or when it is the output of a memory-lean op or
    was computed directly from one (a residual sum after a lean BatchNorm); at
    ``compression=0`` none of these happens and the lean modules run the plain ones.
    """
    if lookup(input) is not None:
        return True
    node, lean = input.grad_fn, _lean_nodes()
    return node is not None and (
        type(node) in lean or any(type(fn) in lean for fn, _ in node.next_functions if fn is not None)
    )


@functools.cache
def _lean_nodes() -> frozenset[type]:
    """Autograd node types of the ops that run only at a compression above 0."""
    functions = (FFTConvFunction, SpatialConvFunction, BatchNormFunction, ReluFunction, MaxPool2dFunction)
    return frozenset(f._backward_cls for f in functions)


__all__ = [
    "LEAN_TWINS",
    "LeanBatchNorm1d",
    "LeanBatchNorm2d",
    "LeanConv1d",
    "LeanConv2d",
    "LeanMaxPool2d",
    "LeanModule",
    "LeanReLU",
]


class LeanModule:
    """Marks a memory-lean twin; ``_plain`` is the ``torch.nn`` class it replaces."""

    _plain: type[nn.Module]


class LeanReLU(LeanModule, nn.ReLU):
    """``nn.ReLU`` that keeps a bit mask of its output for backward (1/32 of a float32 tensor).

    Example:
        >>> relu = LeanReLU(inplace=True)
        >>> x = torch.randn(4, 8, requires_grad=True)
        >>> relu(x * 1.0).sum().backward()
        >>> torch.equal(x.grad, (x > 0).float())
        True
    """

    _plain = nn.ReLU

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if _plain_forward(self.training, input):
            return super().forward(input)
        return lean_relu(input, self.inplace)


class _LeanBatchNorm(LeanModule):
    def forward(self, input: torch.Tensor) -> torch.Tensor:
        bn: Any = self
        if _plain_forward(bn.training, input, bn.weight, bn.bias):
            return super().forward(input)  # type: ignore[misc]
        bn._check_input_dim(input)
        # The bookkeeping of torch.nn.modules.batchnorm._BatchNorm.forward in training mode.
        factor = 0.0 if bn.momentum is None else bn.momentum
        if bn.track_running_stats and bn.num_batches_tracked is not None:
            bn.num_batches_tracked.add_(1)
            factor = 1.0 / float(bn.num_batches_tracked) if bn.momentum is None else bn.momentum
        tracked = bn.track_running_stats
        return lean_batch_norm(
            input,
            bn.running_mean if tracked else None,
            bn.running_var if tracked else None,
            bn.weight,
            bn.bias,
            factor,
            bn.eps,
        )


class LeanBatchNorm2d(_LeanBatchNorm, nn.BatchNorm2d):
    """``nn.BatchNorm2d`` that, in training, keeps its input in the smallest exact form.

    After a memory-lean band-limited convolution that is the convolution's kept spectrum; its
    output is offered to the next op as ``affine(input)``, so a following ReLU and convolution
    keep nothing of their own but a bit mask.

    Example:
        >>> bn = LeanBatchNorm2d(3)
        >>> x = torch.randn(8, 3, 5, 5, requires_grad=True)
        >>> bn(x).shape
        torch.Size([8, 3, 5, 5])
    """

    _plain = nn.BatchNorm2d


class LeanBatchNorm1d(_LeanBatchNorm, nn.BatchNorm1d):
    """``nn.BatchNorm1d`` counterpart of :class:`LeanBatchNorm2d`."""

    _plain = nn.BatchNorm1d


class LeanMaxPool2d(LeanModule, nn.MaxPool2d):
    """``nn.MaxPool2d`` that keeps, per output, the position of its maximum in the window (a byte).

    Example:
        >>> pool = LeanMaxPool2d(3, 2, 1)
        >>> pool(torch.randn(2, 4, 8, 8, requires_grad=True)).shape
        torch.Size([2, 4, 4, 4])
    """

    _plain = nn.MaxPool2d

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if self.return_indices or _plain_forward(self.training, input):
            return super().forward(input)
        return lean_max_pool2d(
            input, self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode
        )


def _zero_padding(conv: nn.Module) -> tuple[int, ...] | None:
    """Explicit symmetric zero padding of ``conv``, or ``None`` where it has none."""
    if conv.padding_mode != "zeros":
        return None
    if conv.padding == "valid":
        return (0,) * len(conv.kernel_size)
    if conv.padding == "same":
        totals = [d * (k - 1) for d, k in zip(conv.dilation, conv.kernel_size)]
        return None if any(t % 2 for t in totals) else tuple(t // 2 for t in totals)
    return tuple(conv.padding)


class _LeanConv(LeanModule):
    def _conv_forward(
        self, input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        conv: Any = self
        padding = _zero_padding(conv)
        if (
            padding is None
            or input.dim() != weight.dim()
            or _plain_forward(conv.training, input, weight, bias)
        ):
            return super()._conv_forward(input, weight, bias)  # type: ignore[misc]
        return lean_conv(input, weight, bias, conv.stride, padding, conv.dilation, conv.groups)


class LeanConv2d(_LeanConv, nn.Conv2d):
    """``nn.Conv2d`` (computed natively) that keeps its input lean for backward.

    Used for the convolutions a model keeps plain (1x1 by default): after ``BatchNorm -> ReLU``
    it keeps nothing new; a 1x1 strided one (a ResNet shortcut) keeps only the pixels it reads.

    Example:
        >>> conv = LeanConv2d(4, 8, 1, stride=2)
        >>> conv(torch.randn(2, 4, 8, 8, requires_grad=True)).shape
        torch.Size([2, 8, 4, 4])
    """

    _plain = nn.Conv2d


class LeanConv1d(_LeanConv, nn.Conv1d):
    """``nn.Conv1d`` counterpart of :class:`LeanConv2d`."""

    _plain = nn.Conv1d


#: plain module class -> its memory-lean twin
LEAN_TWINS: dict[type[nn.Module], type[nn.Module]] = {
    nn.ReLU: LeanReLU,
    nn.BatchNorm1d: LeanBatchNorm1d,
    nn.BatchNorm2d: LeanBatchNorm2d,
    nn.MaxPool2d: LeanMaxPool2d,
    nn.Conv1d: LeanConv1d,
    nn.Conv2d: LeanConv2d,
}
