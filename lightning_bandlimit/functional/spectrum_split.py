"""A band-limited convolution split at its kept input spectrum.

``conv_from_spectrum(analyse(x, plan), ...)`` computes what the spectral algorithm
(:mod:`.spectral_kernel`) computes from ``x``, the same operations, with the kept input
spectrum as a tensor between the two halves: a checkpointed block keeps that instead of its
input (:mod:`lightning_bandlimit.recompute.spectral`).
"""

from __future__ import annotations

import math

import torch
from torch.autograd.function import once_differentiable

from lightning_bandlimit.functional.autocast import autocast_off
from lightning_bandlimit.functional.band import SpectralBand, quantised_band
from lightning_bandlimit.functional.dft_plan import (
    DFTPlan,
    analysis,
    analysis_adjoint,
    dft_plan_for,
    synthesis_adjoint,
)
from lightning_bandlimit.functional.geometry import IntOrTuple, resolve_geometry
from lightning_bandlimit.functional.lean.handoff import publish
from lightning_bandlimit.functional.lean.regions import hands_spectrum_on
from lightning_bandlimit.functional.lean.sources import Saved
from lightning_bandlimit.functional.spectral_kernel import (
    Spectrum,
    as_2d,
    compute_dtypes,
    itemsize,
    output_of,
)
from lightning_bandlimit.functional.spectral_mixing import (
    filter_grad,
    input_grad_spectrum,
    output_spectrum,
    taps_of,
)

__all__ = [
    "SPECTRUM_PER_SAMPLE",
    "analyse",
    "conv_from_spectrum",
    "input_plan",
    "outgrows_input",
    "spectrum_bytes",
]


# ``algorithm="auto"`` keeps the full band (the convolution itself) where the kept spectrum would
# hold more than this many numbers per input sample: a small grid at a small compression, where
# the padded grid's band keeps nearly every coefficient. Band-limiting there costs transforms
# and backward working memory and drops almost nothing (the README's "What the compression
# means" gives the measured cost; ``benchmarks/memory/ladder_memory.py`` measures it).
SPECTRUM_PER_SAMPLE = 1.1


def input_plan(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    stride: IntOrTuple,
    padding: IntOrTuple | str,
    dilation: IntOrTuple,
    groups: int,
    padding_mode: str,
    compression: float,
    spatial_dims: int,
    algorithm: str = "spectral",
) -> DFTPlan:
    """The plan of the spectral algorithm for a batched ``input`` (arguments as :func:`fft_conv2d`).

    The convolution's band is resolved here, once, and every algorithm reads it from the plan:
    ``compression``'s band, or with ``algorithm="auto"`` the full band where that band would
    outgrow the input (:func:`outgrows_input`). ``compression`` is trusted: its public caller
    checked it.

    Raises:
        ValueError: as :func:`fft_conv2d`, for the geometry.
    """
    geometry = resolve_geometry(
        input, weight, bias, stride, padding, dilation, groups, padding_mode, spatial_dims
    )
    band = quantised_band(geometry.grid, compression)
    if algorithm == "auto" and _outgrows(band, input):
        band = quantised_band(geometry.grid, 0.0)
    return dft_plan_for(geometry, band, compute_dtypes(input)[0], input.device)


def outgrows_input(plan: DFTPlan, input: torch.Tensor) -> bool:
    """Whether ``plan``'s band, not the full one, keeps more than :data:`SPECTRUM_PER_SAMPLE`
    numbers per sample of a batched ``input`` (where ``algorithm="auto"`` keeps the full band).

    Example:
        >>> x, w = torch.randn(1, 1, 4, 4), torch.randn(1, 1, 3, 3)
        >>> plan = input_plan(x, w, None, 1, 1, 1, 1, "zeros", 0.2, 2)  # a 6 x 6 grid for 16 samples
        >>> auto = input_plan(x, w, None, 1, 1, 1, 1, "zeros", 0.2, 2, "auto")  # the full band
        >>> outgrows_input(plan, x), outgrows_input(auto, x), auto.band.is_full
        (True, False, True)
    """
    return _outgrows(plan.band, input)


def _outgrows(band: SpectralBand, input: torch.Tensor) -> bool:
    return not band.is_full and 2 * band.kept > SPECTRUM_PER_SAMPLE * math.prod(input.shape[2:])


def spectrum_bytes(input: torch.Tensor, plan: DFTPlan) -> int:
    """Bytes of ``input``'s kept spectrum under ``plan`` (what :func:`analyse` returns)."""
    return 2 * plan.band.kept * input.shape[0] * input.shape[1] * itemsize(plan.analysis_w.dtype)


class _Analyse(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input: torch.Tensor, plan: DFTPlan, spatial_dims: int) -> torch.Tensor:  # type: ignore[override]
        ctx.plan, ctx.spatial_dims, ctx.dtype = plan, spatial_dims, input.dtype
        return analysis(as_2d(input.to(plan.analysis_w.dtype), spatial_dims), plan)

    @staticmethod
    @once_differentiable
    @autocast_off
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        plan: DFTPlan = ctx.plan
        gx = analysis_adjoint(grad.contiguous(), plan)
        return (gx.squeeze(-2) if ctx.spatial_dims == 1 else gx).to(ctx.dtype), None, None


class _SpectralConv(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx,
        x_spec: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        plan: DFTPlan,
        spatial_dims: int,
        out_dtype: torch.dtype,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        w = as_2d(weight.to(plan.analysis_w.dtype), spatial_dims).contiguous()
        y_spec = output_spectrum(x_spec, w, taps_of(w), plan)
        out = output_of(y_spec, plan, bias, spatial_dims, out_dtype)
        ctx.plan, ctx.spatial_dims, ctx.has_bias = plan, spatial_dims, bias is not None
        ctx.save_for_backward(weight, x_spec)
        ctx.mark_non_differentiable(y_spec)
        return out, y_spec

    @staticmethod
    @once_differentiable
    @autocast_off
    def backward(ctx, grad_out: torch.Tensor, _: torch.Tensor):  # type: ignore[override]
        plan: DFTPlan = ctx.plan
        weight, x_spec = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        compute = plan.analysis_w.dtype
        w = as_2d(weight.to(compute), ctx.spatial_dims).contiguous()
        taps = taps_of(w)
        grad_taps = torch.zeros_like(taps) if need_w else None
        g_spec = synthesis_adjoint(as_2d(grad_out.to(compute), ctx.spatial_dims), plan)
        if grad_taps is not None:
            filter_grad(g_spec, x_spec, w, grad_taps, plan)
        gx_spec = input_grad_spectrum(g_spec, w, taps, plan) if need_x else None
        grad_b = None
        if need_b and ctx.has_bias:
            grad_b = grad_out.sum((0, *range(2, grad_out.dim())), dtype=compute).to(weight.dtype)
        grad_w = grad_taps.T.reshape(weight.shape).to(weight.dtype) if grad_taps is not None else None
        return gx_spec, grad_w, grad_b, None, None, None


def analyse(input: torch.Tensor, plan: DFTPlan, spatial_dims: int) -> torch.Tensor:
    """``input``'s kept spectrum under ``plan``, ``(2, F, N, C)``; differentiable, keeps nothing.

    Example:
        >>> x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
        >>> w = torch.randn(4, 3, 3, 3, dtype=torch.float64)
        >>> plan = input_plan(x, w, None, 1, 1, 1, 1, "zeros", 0.5, 2)
        >>> out = conv_from_spectrum(analyse(x, plan, 2), w, None, plan, 2, x.dtype)
        >>> from lightning_bandlimit.functional import fft_conv2d
        >>> torch.allclose(out, fft_conv2d(x, w, padding=1, compression=0.5, algorithm="spectral"))
        True
    """
    with torch.autocast(input.device.type, enabled=False):
        return _Analyse.apply(input, plan, spatial_dims)


def conv_from_spectrum(
    x_spec: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    plan: DFTPlan,
    spatial_dims: int,
    out_dtype: torch.dtype,
    memory_lean: bool = True,
) -> torch.Tensor:
    """The band-limited convolution of the input whose kept spectrum is ``x_spec`` (see :func:`analyse`).

    With ``memory_lean`` the output is offered to the next lean op as its kept spectrum, as
    :func:`fft_conv2d` does.
    """
    with torch.autocast(x_spec.device.type, enabled=False):
        out, y_spec = _SpectralConv.apply(x_spec, weight, bias, plan, spatial_dims, out_dtype)
    if memory_lean:
        if hands_spectrum_on(y_spec.nbytes, out.nbytes):
            spectrum = Spectrum(plan, bias is not None, spatial_dims, out_dtype)
            publish(out, spectrum, (y_spec,) if bias is None else (y_spec, bias))
        else:
            publish(out, Saved(), ())
    return out
