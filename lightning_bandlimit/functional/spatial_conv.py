"""The spatial algorithm of a band-limited convolution: project the input onto the band, then
convolve natively.

Exact (to round-off) for the same band semantics as the frequency-domain algorithm
(:mod:`.band_projection` explains why). It costs the native convolution plus two small matrix
products per input channel, so it wins where the frequency-domain channel mixing does not pay:
few input channels (a stem), strided layers, and maps so small that the kept spectrum is larger
than the kernel. Saved for backward: the input's band coefficients (or, memory-lean, the smaller
of its published recipe, its coefficients and itself); the projected input is rebuilt in
backward for the weight gradient.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from lightning_bandlimit.functional.autocast import autocast_off
from lightning_bandlimit.functional.band_projection import (
    ProjectionPlan,
    band_input,
    band_input_adjoint,
    reduce_input,
)
from lightning_bandlimit.functional.dft_plan import batch_slices
from lightning_bandlimit.functional.lean.regions import held
from lightning_bandlimit.functional.lean.sources import Saved, Source, rebuild

__all__ = ["SpatialConvFunction", "spatial_conv"]

KEEP_COEFFICIENTS = "coefficients"
_BACKWARD_BYTES = 16 << 20  # the backward's temporaries per batch slice
KEEP_SMALLER = "smaller"


class SpatialConvFunction(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx,
        input: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        plan: ProjectionPlan,
        conv_dtype: torch.dtype,
        keep: str,
        source: Source | None,
        *source_tensors: torch.Tensor,
    ) -> torch.Tensor:
        compute = plan.analysis_h.dtype
        z = reduce_input(input.to(compute), plan)
        x_band = band_input(z, plan).to(conv_dtype)
        g = plan.geometry
        out = F.conv2d(
            x_band,
            weight.to(conv_dtype),
            None if bias is None else bias.to(conv_dtype),
            plan.conv_stride,
            0,
            g.dilation,
            g.groups,
        )
        ctx.extra = len(source_tensors)  # tensor arguments after the eight fixed ones
        if not ctx.needs_input_grad[1]:
            source, kept = None, ()
        elif keep == KEEP_SMALLER and source is not None:
            kept = source_tensors
        elif keep == KEEP_SMALLER and (input.nbytes <= z.nbytes or held(input)):
            source, kept = Saved(), (input,)
        else:
            source, kept = None, (z,)
        ctx.plan, ctx.source, ctx.conv_dtype = plan, source, conv_dtype
        ctx.input_shape, ctx.input_dtype, ctx.has_bias = input.shape, input.dtype, bias is not None
        ctx.save_for_backward(weight, *kept)
        return out

    @staticmethod
    @once_differentiable
    @autocast_off
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        plan: ProjectionPlan = ctx.plan
        weight, *kept = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        compute, dtype = plan.analysis_h.dtype, ctx.conv_dtype
        n, c = ctx.input_shape[:2]
        grid = (plan.synthesis_h.shape[0], plan.synthesis_w.shape[0])
        source = None
        if need_w:
            if ctx.source is None:
                source = kept[0]
            else:  # a recipe published for the caller's (N, C, L) tensor rebuilds in that shape
                source = rebuild(ctx.source, kept).reshape(ctx.input_shape)
        g = plan.geometry
        w = weight.to(dtype)
        # The padded band-limited input and its gradient exist for a slice of the batch at a
        # time: the backward's working set stays near the plain convolution's at any compression.
        per_sample = 3 * c * grid[0] * grid[1] * torch.empty((), dtype=compute).element_size()
        grad_x = grad_w = grad_b = None
        for part in batch_slices(n, per_sample, _BACKWARD_BYTES):
            if source is not None:
                z = source[part] if ctx.source is None else reduce_input(source[part].to(compute), plan)
                x_band = band_input(z, plan).to(dtype)
                del z
            else:  # convolution_backward reads only the shape of the input for the input gradient
                x_band = grad.new_empty(part.stop - part.start, c, *grid, dtype=dtype)
            grad_band, gw, gb = torch.ops.aten.convolution_backward(
                grad[part].to(dtype),
                x_band,
                w,
                [weight.shape[0]] if ctx.has_bias else None,
                list(plan.conv_stride),
                [0, 0],
                list(g.dilation),
                False,
                [0, 0],
                g.groups,
                [need_x, need_w, need_b and ctx.has_bias],
            )
            del x_band
            if gw is not None:
                grad_w = gw if grad_w is None else grad_w.add_(gw)
            if gb is not None:
                grad_b = gb if grad_b is None else grad_b.add_(gb)
            if need_x:
                shape = (part.stop - part.start, *ctx.input_shape[1:])
                gx = band_input_adjoint(grad_band.to(compute), plan, torch.Size(shape)).to(ctx.input_dtype)
                if grad_x is None and part.stop - part.start == n:
                    grad_x = gx
                else:
                    if grad_x is None:
                        grad_x = gx.new_empty(ctx.input_shape)
                    grad_x[part] = gx
            del grad_band
        return (
            grad_x,
            None if grad_w is None else grad_w.to(weight.dtype),
            None if grad_b is None else grad_b.to(weight.dtype),
            *(None for _ in range(5 + ctx.extra)),
        )


def spatial_conv(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    plan: ProjectionPlan,
    conv_dtype: torch.dtype,
    memory_lean: bool,
    source: Source | None = None,
    source_tensors: tuple[torch.Tensor, ...] = (),
) -> torch.Tensor:
    """Band-limited 2-D convolution of a batched input by the spatial algorithm (module docstring).

    Args:
        input: ``(N, C, H, W)``; 1-D convolutions pass ``(N, C, 1, L)``.
        weight: ``(O, C / groups, kh, kw)``.
        bias: ``(O,)`` or ``None``.
        plan: the band projection of the call's geometry and compression.
        conv_dtype: the dtype the native convolution runs in (autocast's, if it applies).
        memory_lean: keep the smaller of ``source`` (the input's published recipe), the input's
            band coefficients and the input itself, instead of always the coefficients.
        source, source_tensors: the input's published recipe, if any.

    Returns:
        ``(N, O, P, Q)`` in ``conv_dtype``.
    """
    keep = KEEP_SMALLER if memory_lean else KEEP_COEFFICIENTS
    with torch.autocast(input.device.type, enabled=False):
        return SpatialConvFunction.apply(input, weight, bias, plan, conv_dtype, keep, source, *source_tensors)
