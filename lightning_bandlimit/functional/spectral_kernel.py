"""The spectral kernel: a band-limited convolution computed in the frequency domain.

The convolution is a circular cross-correlation on the padded input grid, which equals
``F.conv2d`` at every output position: the grid is exactly the padded input, so no output wraps
around. Each 1-D DFT is a small real matrix product (:mod:`.dft_plan`); spectra are kept
frequency-major, ``(2, F, N, C)`` = (re/im, kept frequencies, batch, channels), so that the
per-frequency channel mixing is one batched matrix multiply.

With compression ``c > 0`` only a low-frequency box of the spectrum is kept
(:func:`~lightning_bandlimit.functional.band.spectral_band`), for the input, the filter and hence
the output; the backward pass works on the same box. Saved for backward: the input's kept
spectrum and the weight tensor itself (a parameter, alive anyway); the filter spectrum is
recomputed, because for wide layers it is larger than the activation. With ``memory_lean``
the input is kept in its smallest exact form instead and the output offered as its spectrum to
the op that consumes it (:mod:`lightning_bandlimit.functional.lean`).

This module holds the autograd Function (its forward and backward: what is kept, a batch slice
at a time) and the recipes of its output (:class:`Spectrum`, :class:`FromInput`), and trusts its
arguments; the per-frequency products it calls are in :mod:`.spectral_mixing`, and
:mod:`.fft_conv` is the public API, which checks the arguments and chooses the algorithm.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch.autograd.function import once_differentiable

from lightning_bandlimit.functional.autocast import autocast_off
from lightning_bandlimit.functional.dft_plan import (
    DFTPlan,
    analysis,
    analysis_adjoint,
    batch_slices,
    synthesis,
    synthesis_adjoint,
)
from lightning_bandlimit.functional.lean.conv import conv_dtype
from lightning_bandlimit.functional.lean.regions import held
from lightning_bandlimit.functional.lean.shared_rebuild import reuse
from lightning_bandlimit.functional.lean.sources import Saved, Source, rebuild
from lightning_bandlimit.functional.spectral_mixing import (
    filter_grad,
    input_grad_spectrum,
    output_spectrum,
    taps_of,
)

__all__ = ["KEEP_SMALLER", "KEEP_SPECTRUM", "FFTConvFunction", "Spectrum", "as_2d"]
__all__ += ["FromInput", "RETURN_KEPT_INPUT", "compute_dtypes", "itemsize", "output_of"]


def as_2d(t: torch.Tensor, spatial_dims: int) -> torch.Tensor:
    return t.unsqueeze(-2) if spatial_dims == 1 else t


def output_of(
    y_spec: torch.Tensor, plan: DFTPlan, bias: torch.Tensor | None, spatial_dims: int, dtype: torch.dtype
) -> torch.Tensor:
    """The layer's output from its kept spectrum: the one computation forward and recompute share."""
    out = synthesis(y_spec, plan)
    if bias is not None:
        out += bias.to(out.dtype).view(1, -1, 1, 1)
    if spatial_dims == 1:
        out = out.squeeze(-2)
    return out.to(dtype)


@dataclass(frozen=True)
class Spectrum(Source):
    """A band-limited convolution's output, rebuilt from its kept spectrum (and the bias)."""

    plan: DFTPlan
    has_bias: bool
    spatial_dims: int
    dtype: torch.dtype

    def rebuild(self, tensors: Iterator[torch.Tensor]) -> torch.Tensor:
        y_spec = next(tensors)
        bias = next(tensors) if self.has_bias else None
        return reuse(y_spec, lambda: output_of(y_spec, self.plan, bias, self.spatial_dims, self.dtype))


@dataclass(frozen=True)
class FromInput(Source):
    """A band-limited convolution's output, recomputed from what the convolution keeps of its
    input anyway (its kept spectrum, or the input itself) and its weight (and bias).

    For a layer that widens a narrow input, a network's stem reading an RGB image, this costs
    no memory at all beside what the convolution keeps, where the output's spectrum would cost
    more than the output. The recomputation runs the forward's operations, a batch slice at a
    time (equal to the forward's output to round-off).
    """

    plan: DFTPlan
    has_bias: bool
    spatial_dims: int
    dtype: torch.dtype
    is_spectrum: bool

    def rebuild(self, tensors: Iterator[torch.Tensor]) -> torch.Tensor:
        kept, weight = next(tensors), next(tensors)
        bias = next(tensors) if self.has_bias else None
        return reuse(kept, lambda: self.output_of(kept, weight, bias))

    def output_of(self, kept: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        compute = self.plan.analysis_w.dtype
        w = as_2d(weight.to(compute), self.spatial_dims).contiguous()
        taps = taps_of(w)
        n = kept.shape[2] if self.is_spectrum else kept.shape[0]
        out_bytes = w.element_size() * n * w.shape[0] * math.prod(self.plan.geometry.out_size)
        parts = []
        for part in _batch_slices(self.plan, n, w.shape[0], out_bytes, w.element_size()):
            if self.is_spectrum:
                x_spec = kept[:, :, part]
            else:
                x_spec = analysis(as_2d(kept[part].to(compute), self.spatial_dims), self.plan)
            y_spec = output_spectrum(x_spec, w, taps, self.plan)
            parts.append(output_of(y_spec, self.plan, bias, self.spatial_dims, self.dtype))
        return parts[0] if len(parts) == 1 else torch.cat(parts)


# What a band-limited convolution keeps of its input for the weight gradient.
KEEP_SPECTRUM = "spectrum"  # the kept input spectrum (always)
KEEP_SMALLER = "smaller"  # the input's published recipe if any, else spectrum or input, whichever is smaller
# ``return_spectrum`` value: the second output is the kept input spectrum (empty if the input is kept)
RETURN_KEPT_INPUT = "kept input"

# Batch slicing starts where the spectral temporaries would exceed this multiple of the activations.
_SPECTRUM_TO_ACTIVATION = 2


def _batch_slices(plan: DFTPlan, n: int, channels: int, activation_bytes: int, itemsize: int) -> list[slice]:
    """Batch slices whose spectral temporaries stay within twice the size of the activations.

    A spectrum on a padded grid can be several times its feature map (a stride-2 layer on a
    large map keeps a quarter of the pixels but the grid's whole band); computing it a slice of
    the batch at a time bounds the transient memory without changing the result. Every slice
    recomputes the filter spectrum, hence the factor of two before slicing starts.
    """
    return batch_slices(
        n, 2 * plan.band.kept * channels * itemsize, _SPECTRUM_TO_ACTIVATION * activation_bytes
    )


def _spectra(
    x: torch.Tensor, w: torch.Tensor, taps: torch.Tensor, plan: DFTPlan
) -> tuple[torch.Tensor, torch.Tensor]:
    """Kept input spectrum and output spectrum of one batch slice ``x`` (compute dtype, 2-D form)."""
    x_spec = analysis(x, plan)
    return x_spec, output_spectrum(x_spec, w, taps, plan)


class FFTConvFunction(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx,
        input: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        plan: DFTPlan,
        spatial_dims: int,
        out_dtype: torch.dtype,
        keep: str,
        return_spectrum: bool | str,
        source: Source | None,
        *source_tensors: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        compute = plan.analysis_w.dtype
        x = as_2d(input.to(compute), spatial_dims)
        w = as_2d(weight.to(compute), spatial_dims).contiguous()
        n, channels = x.shape[:2]
        ctx.extra = len(source_tensors)  # tensor arguments after the nine fixed ones
        x_spec_bytes = 2 * plan.band.kept * n * channels * w.element_size()
        if not ctx.needs_input_grad[1]:
            source = None
        elif keep == KEEP_SMALLER and source is None and (input.nbytes <= x_spec_bytes or held(input)):
            source, source_tensors = Saved(), (input,)
        elif keep == KEEP_SPECTRUM or source is None:
            source = None
        keep_x_spec = ctx.needs_input_grad[1] and source is None

        out_shape = (n, w.shape[0], *plan.geometry.out_size[2 - spatial_dims :])
        out_bytes = w.element_size() * math.prod(out_shape)
        widest = max(channels, w.shape[0])
        slices = _batch_slices(plan, n, widest, max(input.nbytes, out_bytes), w.element_size())
        taps = taps_of(w)
        if len(slices) == 1:
            x_spec, y_spec = _spectra(x, w, taps, plan)
            if not keep_x_spec:
                x_spec = None  # not kept: freed before the output is made
            out = output_of(y_spec, plan, bias, spatial_dims, out_dtype)
        else:
            out = x.new_empty(out_shape, dtype=out_dtype)
            x_spec = x.new_empty(2, plan.band.kept, n, channels) if keep_x_spec else None
            y_spec = x.new_empty(2, plan.band.kept, n, w.shape[0]) if return_spectrum is True else None
            for part in slices:
                xs, ys = _spectra(x[part], w, taps, plan)
                out[part] = output_of(ys, plan, bias, spatial_dims, out_dtype)
                for full, piece in ((x_spec, xs), (y_spec, ys)):
                    if full is not None:
                        full[:, :, part] = piece

        kept = (x_spec,) if keep_x_spec else source_tensors if source is not None else ()
        ctx.plan, ctx.source, ctx.spatial_dims, ctx.slices = plan, source, spatial_dims, slices
        ctx.input_dtype, ctx.has_bias = input.dtype, bias is not None
        ctx.save_for_backward(weight, *kept)
        if return_spectrum == RETURN_KEPT_INPUT:
            y_spec = x_spec if keep_x_spec else x.new_empty(0)
        elif return_spectrum is not True:
            y_spec = x.new_empty(0)
        ctx.mark_non_differentiable(y_spec)
        return out, y_spec

    @staticmethod
    @once_differentiable
    @autocast_off
    def backward(ctx, grad_out: torch.Tensor, _: torch.Tensor):  # type: ignore[override]
        plan: DFTPlan = ctx.plan
        spatial_dims = ctx.spatial_dims
        weight, *kept = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        compute = plan.analysis_w.dtype
        w = as_2d(weight.to(compute), spatial_dims).contiguous()
        x_full = None
        if need_w and ctx.source is not None:
            x_full = as_2d(rebuild(ctx.source, kept), spatial_dims)
        taps = taps_of(w)
        grad_taps = torch.zeros_like(taps) if need_w else None
        grad_x = None
        for part in ctx.slices:
            # The filter gradient first: the input and its spectrum are gone before the input
            # gradient exists (the backward's peak).
            g_spec = synthesis_adjoint(as_2d(grad_out[part].to(compute), spatial_dims), plan)
            if grad_taps is not None:
                x_spec = kept[0][:, :, part] if x_full is None else analysis(x_full[part].to(compute), plan)
                filter_grad(g_spec, x_spec, w, grad_taps, plan)
                del x_spec
            if len(ctx.slices) == 1:
                x_full = None
            if need_x:
                gx_spec = input_grad_spectrum(g_spec, w, taps, plan)
                del g_spec
                gx = analysis_adjoint(gx_spec, plan)
                del gx_spec
                gx = (gx.squeeze(-2) if spatial_dims == 1 else gx).to(ctx.input_dtype)
                if len(ctx.slices) == 1:
                    grad_x = gx
                else:
                    if grad_x is None:
                        grad_x = gx.new_empty(grad_out.shape[0], *gx.shape[1:])
                    grad_x[part] = gx
        grad_b = None
        if need_b and ctx.has_bias:
            grad_b = grad_out.sum((0, *range(2, grad_out.dim())), dtype=compute).to(weight.dtype)
        return (
            grad_x,
            grad_taps.T.reshape(weight.shape).to(weight.dtype) if grad_taps is not None else None,
            grad_b,
            *(None for _ in range(6 + ctx.extra)),
        )


def compute_dtypes(input: torch.Tensor) -> tuple[torch.dtype, torch.dtype]:
    """(dtype the frequency-domain math runs in, dtype of the result), as ``F.conv2d``.

    Example:
        >>> compute_dtypes(torch.zeros(1, dtype=torch.bfloat16))  # math in float32, result as the input
        (torch.float32, torch.bfloat16)
    """
    compute = torch.float64 if input.dtype == torch.float64 else torch.float32
    return compute, conv_dtype(input)


def itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()
