"""The native convolution, memory-lean: it keeps its input as a recipe when it has one (e.g.
``relu(bn(y))``, where ``y`` is kept by the BatchNorm anyway, :mod:`.sources`), else as itself;
a strided 1x1 convolution keeps only the pixels it reads. Its backward calls the same ATen
kernel as autograd's (``convolution_backward``) on the recomputed input.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from lightning_bandlimit.functional.autocast import autocast_off
from lightning_bandlimit.functional.lean.handoff import lookup
from lightning_bandlimit.functional.lean.ops import memory_format_of
from lightning_bandlimit.functional.lean.sources import Saved, Source, rebuild

__all__ = ["conv_dtype", "conv_function", "lean_conv", "stride_grid"]


def conv_function(spatial_dims: int):
    """``F.conv1d`` or ``F.conv2d``."""
    return F.conv1d if spatial_dims == 1 else F.conv2d


def stride_grid(x: torch.Tensor, stride: Sequence[int]) -> torch.Tensor:
    """The view of ``x`` at the pixels a 1x1 convolution with ``stride`` reads."""
    index = (Ellipsis, *(slice(None, None, s) for s in stride))
    return x[index]


def conv_dtype(input: torch.Tensor) -> torch.dtype:
    """The dtype ``F.conv2d`` of ``input`` runs in and returns: autocast's, if it applies."""
    device = input.device.type
    if input.dtype != torch.float64 and torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return input.dtype


class _NativeConv(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx,
        input: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        stride: tuple[int, ...],
        padding: tuple[int, ...],
        dilation: tuple[int, ...],
        groups: int,
        subsample: tuple[int, ...] | None,
        source: Source | None,
        *source_tensors: torch.Tensor,
    ) -> torch.Tensor:
        dtype = conv_dtype(input)
        spatial_dims = weight.dim() - 2
        ctx.extra = len(source_tensors)  # tensor arguments after the nine fixed ones
        memory_format = memory_format_of(input)
        x = (
            input
            if subsample is None
            else stride_grid(input, subsample).contiguous(memory_format=memory_format)
        )
        # Cast where autocast would (conv_dtype's condition), else F.conv2d checks the dtypes.
        cast = input.dtype != torch.float64 and torch.is_autocast_enabled(input.device.type)
        with torch.autocast(input.device.type, enabled=False):
            out = conv_function(spatial_dims)(
                x.to(dtype) if cast else x,
                weight.to(dtype) if cast else weight,
                bias.to(dtype) if cast and bias is not None else bias,
                stride,
                padding,
                dilation,
                groups,
            )
        if source is None:
            source, source_tensors = Saved(), (x,)
            ctx.subsample_saved = None  # what is kept is already subsampled
        else:
            ctx.subsample_saved = subsample
        ctx.source, ctx.dtype, ctx.input_shape, ctx.input_dtype = source, dtype, input.shape, input.dtype
        ctx.memory_format = memory_format
        ctx.args = (stride, padding, dilation, groups, subsample)
        ctx.has_bias = bias is not None
        ctx.save_for_backward(weight, *source_tensors)
        return out

    @staticmethod
    @once_differentiable
    @autocast_off
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        weight, *kept = ctx.saved_tensors
        stride, padding, dilation, groups, subsample = ctx.args
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        x = rebuild(ctx.source, kept)
        if ctx.subsample_saved is not None:
            x = stride_grid(x, ctx.subsample_saved)
        grad_x, grad_w, grad_b = torch.ops.aten.convolution_backward(
            grad.to(ctx.dtype),
            x.to(ctx.dtype),
            weight.to(ctx.dtype),
            [weight.shape[0]] if ctx.has_bias else None,
            list(stride),
            list(padding),
            list(dilation),
            False,
            [0] * len(stride),
            groups,
            [need_x, need_w, need_b],
        )
        if grad_x is not None:
            if subsample is not None:
                full = grad_x.new_zeros(ctx.input_shape).contiguous(memory_format=ctx.memory_format)
                stride_grid(full, subsample).copy_(grad_x)
                grad_x = full
            grad_x = grad_x.to(ctx.input_dtype)
        return (
            grad_x,
            None if grad_w is None else grad_w.to(weight.dtype),
            None if grad_b is None else grad_b.to(weight.dtype),
            *(None for _ in range(6 + ctx.extra)),
        )


def lean_conv(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    groups: int,
) -> torch.Tensor:
    """``F.conv1d`` / ``F.conv2d`` (batched, explicit zero padding) that keeps its input lean.

    The input is kept as the recipe an earlier op published for it (nothing new when that
    recipe's tensors are kept anyway), else as itself; a 1x1 convolution with stride and no
    padding keeps only the pixels it reads. Under autocast it computes in autocast's dtype, as the
    plain op would.

    Args:
        input: ``(N, C, L)`` or ``(N, C, H, W)``.
        weight, bias: as ``F.conv2d``.
        stride, padding, dilation: one int per spatial dim, or one for all (padding: zeros,
            symmetric).
        groups: as ``F.conv2d``.

    Raises:
        RuntimeError: what ``F.conv1d`` / ``F.conv2d`` raises for invalid arguments (it runs
            first, on the unchanged arguments, wherever they are not known to be valid).

    Example:
        >>> x = torch.randn(2, 4, 9, 9, requires_grad=True)
        >>> w = torch.randn(6, 4, 1, 1, requires_grad=True)
        >>> torch.allclose(lean_conv(x, w, None, (2, 2), (0, 0), (1, 1), 1), F.conv2d(x, w, stride=2))
        True
    """
    spatial_dims = weight.dim() - 2
    # one value for all spatial dims, as F.conv2d expands it
    stride, padding, dilation = (
        tuple(v) * spatial_dims if len(v) == 1 else tuple(v) for v in (stride, padding, dilation)
    )
    if input.dim() != weight.dim():  # unbatched, or invalid: the plain op (and its checks)
        return conv_function(spatial_dims)(input, weight, bias, stride, padding, dilation, groups)
    pointwise = all(k == 1 for k in weight.shape[2:]) and not any(padding)
    # Subsampling first changes what F.conv2d checks: only for a stride and an input shape it
    # would accept; any other invalid argument it sees unchanged.
    subsample = (
        stride
        if pointwise
        and any(s > 1 for s in stride)
        and len(stride) == spatial_dims
        and all(s > 0 for s in stride)
        and groups > 0
        and input.shape[1] == weight.shape[1] * groups
        else None
    )
    conv_stride = (1,) * len(stride) if subsample is not None else stride
    found = lookup(input)
    source, tensors = found if found is not None else (None, ())
    return _NativeConv.apply(
        input, weight, bias, conv_stride, padding, dilation, groups, subsample, source, *tensors
    )
