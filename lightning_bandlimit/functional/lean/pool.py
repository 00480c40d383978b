"""Memory-lean max-pooling with exact gradients: the position of each maximum kept, not the input.

:func:`lean_max_pool2d` computes what ``F.max_pool2d`` computes and keeps for backward, per
output, the position of its maximum inside its window (one byte per output), not its input; the
backward pass scatters the gradient to those positions. Like the other lean ops (:mod:`.ops`),
it checks its arguments as ``F.max_pool2d`` does, with the same exception type and message,
takes any memory layout and returns a channels-last input's gradient channels-last.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from lightning_bandlimit.functional.autocast import autocast_off
from lightning_bandlimit.functional.lean.ops import batch_parts, memory_format_of

__all__ = ["MaxPool2dFunction", "lean_max_pool2d"]


def _window_origins(out_size: int, stride: int, pad: int, device: torch.device) -> torch.Tensor:
    return torch.arange(out_size, device=device) * stride - pad


class MaxPool2dFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, kernel, stride, padding, dilation, ceil_mode):  # type: ignore[override]
        out, index = torch.ops.aten.max_pool2d_with_indices(
            input, kernel, stride, padding, dilation, ceil_mode
        )
        height, width = input.shape[-2:]
        oh = _window_origins(out.shape[-2], stride[0], padding[0], out.device).view(-1, 1)
        ow = _window_origins(out.shape[-1], stride[1], padding[1], out.device)
        offset = (index.div(width, rounding_mode="floor") - oh).div_(dilation[0], rounding_mode="floor")
        offset.mul_(kernel[1]).add_((index.remainder(width) - ow).div_(dilation[1], rounding_mode="floor"))
        ctx.geometry = (input.shape, kernel, stride, padding, dilation)
        ctx.channels_last = memory_format_of(input) == torch.channels_last
        ctx.save_for_backward(offset.to(torch.uint8))
        return out

    @staticmethod
    @once_differentiable
    @autocast_off
    def backward(ctx, grad):  # type: ignore[override]
        (offsets,) = ctx.saved_tensors
        shape, kernel, stride, padding, dilation = ctx.geometry
        height, width = shape[-2:]
        out_h, out_w = grad.shape[-2:]
        # Positions are scattered along dim 1 of (P, H * W, Q): the planes (P = N * C, Q = 1), or,
        # channels-last, the batch (P = N) with the channels innermost (Q = C), as laid out in memory.
        if ctx.channels_last:
            planes, channels = shape[0], shape[1]
            grad, offsets = grad.permute(0, 2, 3, 1), offsets.permute(0, 2, 3, 1)
        else:
            planes, channels = math.prod(shape[:-2]), 1
        # reshape: a view when the layout already is (P, h, w, Q), else a copy
        grad_planes = grad.reshape(planes, out_h * out_w, channels)
        offsets = offsets.reshape(planes, out_h, out_w, channels)
        oh = _window_origins(out_h, stride[0], padding[0], grad.device).view(-1, 1, 1)
        ow = _window_origins(out_w, stride[1], padding[1], grad.device).view(-1, 1)
        grad_input = grad.new_zeros(planes, height * width, channels)
        for part in batch_parts(planes):  # int64 positions for a part of the planes at a time
            offset = offsets[part].long()
            row = offset.div(kernel[1], rounding_mode="floor").mul_(dilation[0]).add_(oh)
            index = row.mul_(width).add_(offset.remainder_(kernel[1]).mul_(dilation[1]).add_(ow))
            grad_input[part].scatter_add_(1, index.reshape(-1, out_h * out_w, channels), grad_planes[part])
        if ctx.channels_last:
            grad_input = grad_input.view(planes, height, width, channels).permute(0, 3, 1, 2)
        else:
            grad_input = grad_input.view(shape)
        return grad_input, None, None, None, None, None


def _pair(value: int | Sequence[int], name: str) -> tuple[int, int]:
    """``(value, value)`` or ``value`` as a pair, with ``F.max_pool2d``'s check of its length."""
    if isinstance(value, int):
        return value, value
    if len(value) not in (1, 2):
        raise RuntimeError(_PAIR_ERRORS[name])
    return int(value[0]), int(value[-1])


_PAIR_ERRORS = {
    "kernel_size": "max_pool2d: kernel_size must either be a single int, or a tuple of two ints",
    "stride": "max_pool2d: stride must either be omitted, a single int, or a tuple of two ints",
    "padding": "max_pool2d: padding must either be a single int, or a tuple of two ints",
    "dilation": "max_pool2d: dilation must be either a single int, or a tuple of two ints",
}


def lean_max_pool2d(
    input: torch.Tensor,
    kernel_size: int | Sequence[int],
    stride: int | Sequence[int] | None = None,
    padding: int | Sequence[int] = 0,
    dilation: int | Sequence[int] = 1,
    ceil_mode: bool = False,
) -> torch.Tensor:
    """``F.max_pool2d`` that keeps, per output, the position of the maximum in its window (a byte).

    Windows of more than 256 positions keep the plain op. Invalid arguments raise what
    ``F.max_pool2d`` raises (``RuntimeError``), before anything is computed.

    Example:
        >>> x = torch.randn(2, 3, 8, 8, requires_grad=True)
        >>> lean_max_pool2d(x, 3, 2, 1).sum().backward()
        >>> g = x.grad.clone(); x.grad = None
        >>> F.max_pool2d(x, 3, 2, 1).sum().backward()
        >>> torch.allclose(g, x.grad)
        True
    """
    kernel = _pair(kernel_size, "kernel_size")
    stride = kernel if stride is None or stride == [] or stride == () else _pair(stride, "stride")
    padding, dilation = _pair(padding, "padding"), _pair(dilation, "dilation")
    if kernel[0] * kernel[1] > 256:
        return F.max_pool2d(input, kernel, stride, padding, dilation, ceil_mode)
    return MaxPool2dFunction.apply(input, kernel, stride, padding, dilation, ceil_mode)
