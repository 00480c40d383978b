"""Band-limited convolution computed in the frequency domain.

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
the op that consumes it (:mod:`.sources`, :mod:`.lean_ops`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from lightning_bandlimit.functional.algorithm import check_algorithm, choose_algorithm
from lightning_bandlimit.functional.band import check_compression
from lightning_bandlimit.functional.band_projection import projection_plan
from lightning_bandlimit.functional.dft_plan import DFTPlan, dft_plan
from lightning_bandlimit.functional.geometry import ConvGeometry, IntOrTuple, resolve_geometry
from lightning_bandlimit.functional.lean_ops import conv_dtype, lean_conv, lean_wanted
from lightning_bandlimit.functional.sources import Saved, Source, lookup, publish, rebuild, reuse
from lightning_bandlimit.functional.spatial_conv import spatial_conv

__all__ = ["fft_conv1d", "fft_conv2d"]


def _analyse(x: torch.Tensor, plan: DFTPlan) -> torch.Tensor:
    """``(N, C, H, W)`` real -> ``(2, F, N, C)`` kept spectrum."""
    n, c, h, w = x.shape
    k = plan.band.cols
    rows = x.reshape(n * c, h, w).permute(1, 2, 0)  # (H, W, NC): a transposed GEMM operand
    t = torch.bmm(plan.analysis_w.expand(h, 2 * k, w), rows)  # (H, 2K, NC) = (h, j, k, n, c)
    return (plan.analysis_h @ t.view(2 * h, k * n * c)).view(2, -1, n, c)


def _analyse_adjoint(spec: torch.Tensor, plan: DFTPlan, in_h: int) -> torch.Tensor:
    """Transpose of :func:`_analyse`: ``(2, F, N, C)`` -> ``(N, C, H, W)``."""
    _, _, n, c = spec.shape
    k = plan.band.cols
    t = (plan.analysis_h_t @ spec.reshape(2 * plan.band.rows, -1)).view(in_h, 2 * k, n * c)
    out = spec.new_empty(n, c, in_h, plan.analysis_w.shape[1])
    rows = out.view(n * c, in_h, -1).permute(1, 0, 2)  # (H, NC, W) view of the result
    torch.bmm(t.transpose(1, 2), plan.analysis_w.expand(in_h, 2 * k, -1), out=rows)
    return out


def _synthesise(spec: torch.Tensor, plan: DFTPlan) -> torch.Tensor:
    """``(2, F, N, O)`` -> ``(N, O, P, Q)`` real output at the strided output positions."""
    _, _, n, o = spec.shape
    k = plan.band.cols
    p, q = plan.geometry.out_size
    z = (plan.synthesis_h @ spec.reshape(2 * plan.band.rows, -1)).view(p, 2 * k, n * o)
    out = spec.new_empty(n, o, p, q)
    rows = out.view(n * o, p, q).permute(1, 0, 2)  # (P, NO, Q) view of the result
    torch.bmm(z.transpose(1, 2), plan.synthesis_w.expand(p, 2 * k, q), out=rows)
    return out


def _synthesise_adjoint(grad: torch.Tensor, plan: DFTPlan) -> torch.Tensor:
    """Transpose of :func:`_synthesise`: ``(N, O, P, Q)`` -> ``(2, F, N, O)``."""
    n, o, p, q = grad.shape
    k = plan.band.cols
    rows = grad.reshape(n * o, p, q).permute(1, 2, 0)  # (P, Q, NO)
    z = torch.bmm(plan.synthesis_w.expand(p, 2 * k, q), rows)  # (P, 2K, NO) = (p, j, k, n, o)
    return (plan.synthesis_h_t @ z.view(2 * p, k * n * o)).view(2, -1, n, o)


# The full filter spectrum (F x O x C/g complex) is larger than the activation for wide layers,
# so it is computed a chunk of frequencies at a time: a small buffer, reused. Every chunk
# re-reads the weight (and read-modify-writes its gradient), hence the cap on their number.
_FILTER_CHUNK_BYTES = 1 << 22
_MAX_FILTER_CHUNKS = 4
_SPECTRUM_TO_ACTIVATION = 2


def _chunks(plan: DFTPlan, weight_shape: torch.Size, element_size: int) -> list[tuple[int, int]]:
    n_freq = plan.band.kept
    per_freq = 2 * weight_shape[0] * weight_shape[1] * element_size
    step = max(1, _FILTER_CHUNK_BYTES // per_freq, -(-n_freq // _MAX_FILTER_CHUNKS))
    return [(f, min(f + step, n_freq)) for f in range(0, n_freq, step)]


def _filter_buffer(plan: DFTPlan, w: torch.Tensor, chunk: int) -> torch.Tensor:
    """Room for ``chunk`` frequencies of a filter spectrum, ``(chunk, 2, O, C/g)`` (re/im inner)."""
    return w.new_empty(chunk, 2, w.shape[0], w.shape[1])


def _filter_chunk(plan: DFTPlan, taps: torch.Tensor, f0: int, f1: int, buffer: torch.Tensor) -> torch.Tensor:
    """Frequencies ``f0:f1`` of the dilated kernel's spectrum, as a ``(2, f1 - f0, O, C/g)`` view.

    ``taps`` is the weight as a contiguous ``(kh kw, O C/g)`` matrix: one GEMM per chunk.
    """
    fc = f1 - f0
    out = buffer[:fc]
    torch.mm(plan.filter_analysis[2 * f0 : 2 * f1], taps, out=out.view(2 * fc, -1))
    return out.transpose(0, 1)


def _grad_chunk(buffer: torch.Tensor, fc: int) -> torch.Tensor:
    """A contiguous ``(2, fc, O, C/g)`` filter-gradient spectrum in the storage of ``buffer``."""
    return buffer.view(-1)[: 2 * fc * buffer[0, 0].numel()].view(2, fc, *buffer.shape[2:])


def _accumulate_filter_grad(
    grad_taps: torch.Tensor, plan: DFTPlan, spec: torch.Tensor, f0: int, f1: int
) -> None:
    """``grad_taps (kh kw, O C/g) += `` transpose of :func:`_filter_chunk` applied to ``spec``."""
    fc = f1 - f0
    grad_taps.addmm_(plan.filter_analysis[2 * f0 : 2 * f1 : 2].T, spec[0].view(fc, -1))
    grad_taps.addmm_(plan.filter_analysis[2 * f0 + 1 : 2 * f1 : 2].T, spec[1].view(fc, -1))


def _taps(w: torch.Tensor) -> torch.Tensor:
    """The weight ``(O, C/g, kh, kw)`` as a contiguous ``(kh kw, O C/g)`` matrix."""
    return w.reshape(w.shape[0] * w.shape[1], -1).T.contiguous()


def _group_slices(channels_in: int, channels_out: int, groups: int) -> list[tuple[slice, slice]]:
    ci, co = channels_in // groups, channels_out // groups
    return [(slice(g * ci, (g + 1) * ci), slice(g * co, (g + 1) * co)) for g in range(groups)]


def _mix(out: torch.Tensor, x: torch.Tensor, w: torch.Tensor, groups: int) -> None:
    """Per frequency ``Y = X conj(W)^T``: ``(2,F,N,C) x (2,F,O,C/g) -> out (2,F,N,O)``."""
    (xr, xi), (wr, wi) = x, w
    if groups == 1:
        wrt, wit = wr.transpose(1, 2), wi.transpose(1, 2)
        torch.bmm(xr, wrt, out=out[0]).baddbmm_(xi, wit)
        torch.bmm(xi, wrt, out=out[1]).baddbmm_(xr, wit, alpha=-1)
    elif w.shape[3] == 1:  # depthwise: every output channel reads one input channel
        mult = w.shape[2] // groups
        xr, xi = (t.repeat_interleave(mult, dim=-1) for t in (xr, xi))
        wr, wi = wr.transpose(1, 2), wi.transpose(1, 2)
        torch.mul(xr, wr, out=out[0]).addcmul_(xi, wi)
        torch.mul(xi, wr, out=out[1]).addcmul_(xr, wi, value=-1)
    else:
        for cs, os in _group_slices(x.shape[3], w.shape[2], groups):
            _mix(out[..., os], x[..., cs], w[:, :, os], 1)


def _mix_grad_input(out: torch.Tensor, g: torch.Tensor, w: torch.Tensor, groups: int) -> None:
    """Transpose of :func:`_mix` in ``X``: ``(2,F,N,O) x (2,F,O,C/g) -> out (2,F,N,C)``."""
    (gr, gi), (wr, wi) = g, w
    if groups == 1:
        torch.bmm(gr, wr, out=out[0]).baddbmm_(gi, wi, alpha=-1)
        torch.bmm(gr, wi, out=out[1]).baddbmm_(gi, wr)
    elif w.shape[3] == 1:
        mult = w.shape[2] // groups
        wr, wi = wr.transpose(1, 2), wi.transpose(1, 2)
        out[0] = (gr * wr - gi * wi).unflatten(-1, (groups, mult)).sum(-1)
        out[1] = (gr * wi + gi * wr).unflatten(-1, (groups, mult)).sum(-1)
    else:
        for cs, os in _group_slices(out.shape[3], w.shape[2], groups):
            _mix_grad_input(out[..., cs], g[..., os], w[:, :, os], 1)


def _mix_grad_filter(out: torch.Tensor, x: torch.Tensor, g: torch.Tensor, groups: int) -> None:
    """Transpose of :func:`_mix` in ``W``: ``(2,F,N,C) x (2,F,N,O) -> out (2,F,O,C/g)``."""
    (xr, xi), (gr, gi) = x, g
    if groups == 1:
        grt, git = gr.transpose(1, 2), gi.transpose(1, 2)
        torch.bmm(grt, xr, out=out[0]).baddbmm_(git, xi)
        torch.bmm(grt, xi, out=out[1]).baddbmm_(git, xr, alpha=-1)
    elif x.shape[3] == groups:  # depthwise
        mult = g.shape[3] // groups
        xr, xi = (t.repeat_interleave(mult, dim=-1) for t in (xr, xi))
        out[0] = (xr * gr + xi * gi).sum(1).unsqueeze(-1)
        out[1] = (xi * gr - xr * gi).sum(1).unsqueeze(-1)
    else:
        for cs, os in _group_slices(x.shape[3], g.shape[3], groups):
            _mix_grad_filter(out[:, :, os], x[..., cs], g[..., os], 1)


def _as_2d(t: torch.Tensor, spatial_dims: int) -> torch.Tensor:
    return t.unsqueeze(-2) if spatial_dims == 1 else t


def _output(
    y_spec: torch.Tensor, plan: DFTPlan, bias: torch.Tensor | None, spatial_dims: int, dtype: torch.dtype
) -> torch.Tensor:
    """The layer's output from its kept spectrum: the one computation forward and recompute share."""
    out = _synthesise(y_spec, plan)
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
        return reuse(y_spec, lambda: _output(y_spec, self.plan, bias, self.spatial_dims, self.dtype))


# What a band-limited convolution keeps of its input for the weight gradient.
KEEP_SPECTRUM = "spectrum"  # the kept input spectrum (always)
KEEP_SMALLER = "smaller"  # the input's published recipe if any, else spectrum or input, whichever is smaller


def _batch_slices(plan: DFTPlan, n: int, channels: int, activation_bytes: int, itemsize: int) -> list[slice]:
    """Batch slices whose spectral temporaries stay within twice the size of the activations.

    A spectrum on a padded grid can be several times its feature map (a stride-2 layer on a
    large map keeps a quarter of the pixels but the grid's whole band); computing it a slice of
    the batch at a time bounds the transient memory without changing the result. Every slice
    recomputes the filter spectrum, hence the factor of two before slicing starts.
    """
    per_sample = 2 * plan.band.kept * channels * itemsize
    step = max(1, min(n, _SPECTRUM_TO_ACTIVATION * activation_bytes // max(1, per_sample)))
    return [slice(i, min(i + step, n)) for i in range(0, n, step)]


def _output_spectrum(
    x_spec: torch.Tensor, w: torch.Tensor, taps: torch.Tensor, plan: DFTPlan
) -> torch.Tensor:
    """Output spectrum ``(2, F, N, O)`` from a kept input spectrum (compute dtype, 2-D form)."""
    y_spec = x_spec.new_empty(2, x_spec.shape[1], x_spec.shape[2], w.shape[0])
    chunks = _chunks(plan, w.shape, w.element_size())
    buffer = _filter_buffer(plan, w, chunks[0][1])
    for f0, f1 in chunks:
        w_spec = _filter_chunk(plan, taps, f0, f1, buffer)
        _mix(y_spec[:, f0:f1], x_spec[:, f0:f1], w_spec, plan.geometry.groups)
    return y_spec


def _spectra(
    x: torch.Tensor, w: torch.Tensor, taps: torch.Tensor, plan: DFTPlan
) -> tuple[torch.Tensor, torch.Tensor]:
    """Kept input spectrum and output spectrum of one batch slice ``x`` (compute dtype, 2-D form)."""
    x_spec = _analyse(x, plan)
    return x_spec, _output_spectrum(x_spec, w, taps, plan)


def _spectrum_backward(
    grad: torch.Tensor,
    x_spec: torch.Tensor | None,
    w: torch.Tensor,
    taps: torch.Tensor,
    grad_taps: torch.Tensor | None,
    plan: DFTPlan,
    need_x: bool,
) -> torch.Tensor | None:
    """Gradient of the kept input spectrum (if ``need_x``); adds the filter gradient to ``grad_taps``."""
    groups = plan.geometry.groups
    g_spec = _synthesise_adjoint(grad, plan)
    chunks = _chunks(plan, w.shape, w.element_size())
    buffer = _filter_buffer(plan, w, chunks[0][1])
    gx_spec = g_spec.new_empty(2, g_spec.shape[1], g_spec.shape[2], w.shape[1] * groups) if need_x else None
    for f0, f1 in chunks:
        if gx_spec is not None:
            w_spec = _filter_chunk(plan, taps, f0, f1, buffer)
            _mix_grad_input(gx_spec[:, f0:f1], g_spec[:, f0:f1], w_spec, groups)
        if grad_taps is not None and x_spec is not None:
            gw_spec = _grad_chunk(buffer, f1 - f0)
            _mix_grad_filter(gw_spec, x_spec[:, f0:f1], g_spec[:, f0:f1], groups)
            _accumulate_filter_grad(grad_taps, plan, gw_spec, f0, f1)
    return gx_spec


def _spectra_backward(
    grad: torch.Tensor,
    x_spec: torch.Tensor | None,
    w: torch.Tensor,
    taps: torch.Tensor,
    grad_taps: torch.Tensor | None,
    plan: DFTPlan,
    need_x: bool,
) -> torch.Tensor | None:
    """Input gradient of one batch slice (if ``need_x``); adds the filter gradient to ``grad_taps``."""
    gx_spec = _spectrum_backward(grad, x_spec, w, taps, grad_taps, plan, need_x)
    return None if gx_spec is None else _analyse_adjoint(gx_spec, plan, plan.geometry.in_size[0])


class _FFTConv(torch.autograd.Function):
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
        return_spectrum: bool,
        source: Source | None,
        *source_tensors: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        compute = plan.analysis_w.dtype
        x = _as_2d(input.to(compute), spatial_dims)
        w = _as_2d(weight.to(compute), spatial_dims).contiguous()
        n, channels = x.shape[:2]
        ctx.extra = len(source_tensors)  # tensor arguments after the nine fixed ones
        x_spec_bytes = 2 * plan.band.kept * n * channels * w.element_size()
        if not ctx.needs_input_grad[1]:
            source = None
        elif keep == KEEP_SMALLER and source is None and input.nbytes <= x_spec_bytes:
            source, source_tensors = Saved(), (input,)
        elif keep == KEEP_SPECTRUM or source is None:
            source = None
        keep_x_spec = ctx.needs_input_grad[1] and source is None

        out_shape = (n, w.shape[0], *plan.geometry.out_size[2 - spatial_dims :])
        out_bytes = w.element_size() * math.prod(out_shape)
        widest = max(channels, w.shape[0])
        slices = _batch_slices(plan, n, widest, max(input.nbytes, out_bytes), w.element_size())
        taps = _taps(w)
        if len(slices) == 1:
            x_spec, y_spec = _spectra(x, w, taps, plan)
            out = _output(y_spec, plan, bias, spatial_dims, out_dtype)
        else:
            out = x.new_empty(out_shape, dtype=out_dtype)
            x_spec = x.new_empty(2, plan.band.kept, n, channels) if keep_x_spec else None
            y_spec = x.new_empty(2, plan.band.kept, n, w.shape[0]) if return_spectrum else None
            for part in slices:
                xs, ys = _spectra(x[part], w, taps, plan)
                out[part] = _output(ys, plan, bias, spatial_dims, out_dtype)
                for full, piece in ((x_spec, xs), (y_spec, ys)):
                    if full is not None:
                        full[:, :, part] = piece

        kept = (x_spec,) if keep_x_spec else source_tensors if source is not None else ()
        ctx.plan, ctx.source, ctx.spatial_dims, ctx.slices = plan, source, spatial_dims, slices
        ctx.input_dtype, ctx.has_bias = input.dtype, bias is not None
        ctx.save_for_backward(weight, *kept)
        y_spec = y_spec if return_spectrum else x.new_empty(0)
        ctx.mark_non_differentiable(y_spec)
        return out, y_spec

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: torch.Tensor, _: torch.Tensor):  # type: ignore[override]
        plan: DFTPlan = ctx.plan
        spatial_dims = ctx.spatial_dims
        weight, *kept = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        compute = plan.analysis_w.dtype
        w = _as_2d(weight.to(compute), spatial_dims).contiguous()
        x_full = None
        if need_w and ctx.source is not None:
            x_full = _as_2d(rebuild(ctx.source, kept), spatial_dims)
        taps = _taps(w)
        grad_taps = torch.zeros_like(taps) if need_w else None
        grad_x = None
        for part in ctx.slices:
            grad = _as_2d(grad_out[part].to(compute), spatial_dims)
            x_spec = None
            if need_w:
                x_spec = kept[0][:, :, part] if x_full is None else _analyse(x_full[part].to(compute), plan)
            gx = _spectra_backward(grad, x_spec, w, taps, grad_taps, plan, need_x)
            if gx is not None:
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


def _dtypes(input: torch.Tensor) -> tuple[torch.dtype, torch.dtype]:
    """(dtype the frequency-domain math runs in, dtype of the result), as ``F.conv2d``."""
    compute = torch.float64 if input.dtype == torch.float64 else torch.float32
    return compute, conv_dtype(input)


def _fft_conv(
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
    memory_lean: bool = False,
    algorithm: str = "auto",
) -> torch.Tensor:
    compression = check_compression(compression)
    algorithm = check_algorithm(algorithm)
    if not isinstance(input, torch.Tensor):
        raise ValueError(f"conv{spatial_dims}d: input must be a tensor, got {type(input).__name__}")
    unbatched = input.dim() == spatial_dims + 1
    batched = input.unsqueeze(0) if unbatched else input
    plan = input_plan(
        batched, weight, bias, stride, padding, dilation, groups, padding_mode, compression, spatial_dims
    )
    geometry = plan.geometry
    compute_dtype, out_dtype = _dtypes(batched)
    lean = memory_lean and not unbatched and lean_wanted(batched, weight, bias)
    if algorithm == "auto" and plan.band.is_full and padding_mode == "zeros" and _symmetric(geometry):
        # The full band is the convolution itself: the native kernel is exact and cheapest.
        pads = tuple(p for p, _ in geometry.pads[2 - spatial_dims :])
        strides, dilations = geometry.stride[2 - spatial_dims :], geometry.dilation[2 - spatial_dims :]
        if lean and lookup(batched) is not None:  # else it would keep the input, as F.conv2d does
            return lean_conv(batched, weight, bias, strides, pads, dilations, groups)
        conv = F.conv1d if spatial_dims == 1 else F.conv2d
        return conv(input, weight, bias, strides, pads, dilations, groups)
    found = lookup(batched) if lean else None
    source, tensors = found if found is not None else (None, ())
    out_numel = batched.shape[0] * weight.shape[0] * geometry.out_size[0] * geometry.out_size[1]
    spectrum_numel = 2 * plan.band.kept * batched.shape[0] * weight.shape[0]
    publish_spectrum = lean and spectrum_numel * _itemsize(compute_dtype) < out_numel * _itemsize(out_dtype)
    if algorithm == "auto" and publish_spectrum:
        # Only the spectral algorithm can hand its output to the next BatchNorm as a spectrum
        # smaller than the output: memory-lean training keeps it there.
        algorithm = "spectral"
    if algorithm == "auto":
        grad = torch.is_grad_enabled()
        algorithm = choose_algorithm(
            geometry,
            plan.band,
            batched.shape[0],
            batched.shape[1],
            weight.shape[0],
            grad and batched.requires_grad,
            grad and weight.requires_grad,
        )
    if algorithm == "spatial":
        projection = projection_plan(geometry, compression, compute_dtype, batched.device)
        out = spatial_conv(
            _as_2d(batched, spatial_dims),
            _as_2d(weight, spatial_dims),
            bias,
            projection,
            out_dtype,
            lean,
            source,
            tensors,
        )
        out = out.squeeze(-2) if spatial_dims == 1 else out
        if lean:
            publish(out, Saved(), ())  # a band-limited activation: the lean modules after it act
        return out.squeeze(0) if unbatched else out
    with torch.autocast(batched.device.type, enabled=False):
        out, y_spec = _FFTConv.apply(
            batched,
            weight,
            bias,
            plan,
            spatial_dims,
            out_dtype,
            KEEP_SMALLER if lean else KEEP_SPECTRUM,
            publish_spectrum,
            source,
            *tensors,
        )
    if publish_spectrum:
        spectrum = Spectrum(plan, bias is not None, spatial_dims, out_dtype)
        publish(out, spectrum, (y_spec,) if bias is None else (y_spec, bias))
    elif lean:
        publish(out, Saved(), ())  # a band-limited activation: the lean modules after it act
    return out.squeeze(0) if unbatched else out


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _symmetric(geometry: ConvGeometry) -> bool:
    return all(before == after for before, after in geometry.pads)


# ------------------------------------------------- a convolution split at its kept input spectrum
# ``conv_from_spectrum(analyse(x, plan), ...)`` computes what the spectral algorithm computes from
# ``x`` (the same operations), with the kept input spectrum as a tensor between the two halves: a
# checkpointed block keeps that instead of its input (:mod:`lightning_bandlimit.spectral_checkpoint`).
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
) -> DFTPlan:
    """The plan of the spectral algorithm for a batched ``input`` (arguments as :func:`fft_conv2d`).

    Raises:
        ValueError: as :func:`fft_conv2d`.
    """
    geometry = resolve_geometry(
        input, weight, bias, stride, padding, dilation, groups, padding_mode, spatial_dims
    )
    return dft_plan(geometry, compression, _dtypes(input)[0], input.device)


def spectrum_bytes(input: torch.Tensor, plan: DFTPlan) -> int:
    """Bytes of ``input``'s kept spectrum under ``plan`` (what :func:`analyse` returns)."""
    return 2 * plan.band.kept * input.shape[0] * input.shape[1] * _itemsize(plan.analysis_w.dtype)


class _Analyse(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input: torch.Tensor, plan: DFTPlan, spatial_dims: int) -> torch.Tensor:  # type: ignore[override]
        ctx.plan, ctx.spatial_dims, ctx.dtype = plan, spatial_dims, input.dtype
        return _analyse(_as_2d(input.to(plan.analysis_w.dtype), spatial_dims), plan)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        plan: DFTPlan = ctx.plan
        gx = _analyse_adjoint(grad.contiguous(), plan, plan.geometry.in_size[0])
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
        w = _as_2d(weight.to(plan.analysis_w.dtype), spatial_dims).contiguous()
        y_spec = _output_spectrum(x_spec, w, _taps(w), plan)
        out = _output(y_spec, plan, bias, spatial_dims, out_dtype)
        ctx.plan, ctx.spatial_dims, ctx.has_bias = plan, spatial_dims, bias is not None
        ctx.save_for_backward(weight, x_spec)
        ctx.mark_non_differentiable(y_spec)
        return out, y_spec

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: torch.Tensor, _: torch.Tensor):  # type: ignore[override]
        plan: DFTPlan = ctx.plan
        weight, x_spec = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        compute = plan.analysis_w.dtype
        w = _as_2d(weight.to(compute), ctx.spatial_dims).contiguous()
        taps = _taps(w)
        grad_taps = torch.zeros_like(taps) if need_w else None
        grad = _as_2d(grad_out.to(compute), ctx.spatial_dims)
        gx_spec = _spectrum_backward(grad, x_spec if need_w else None, w, taps, grad_taps, plan, need_x)
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
        if y_spec.nbytes < out.nbytes:
            spectrum = Spectrum(plan, bias is not None, spatial_dims, out_dtype)
            publish(out, spectrum, (y_spec,) if bias is None else (y_spec, bias))
        else:
            publish(out, Saved(), ())
    return out


def fft_conv2d(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    stride: IntOrTuple = 1,
    padding: IntOrTuple | str = 0,
    dilation: IntOrTuple = 1,
    groups: int = 1,
    *,
    padding_mode: str = "zeros",
    compression: float = 0.0,
    memory_lean: bool = False,
    algorithm: str = "auto",
) -> torch.Tensor:
    """2-D convolution (cross-correlation) computed in the frequency domain, optionally band-limited.

    Same arguments and result as ``torch.nn.functional.conv2d``, plus ``padding_mode`` as in
    ``nn.Conv2d`` and ``compression``. At ``compression=0`` the result and its gradients equal
    ``F.conv2d`` up to round-off. With ``compression=c > 0`` the spectra of the input and of the
    filter, taken on the padded-input grid, are both truncated to the low-frequency box that
    discards about a fraction ``c`` of the one-sided coefficients; the result is the exact
    (circular) cross-correlation of the band-limited input with the band-limited filter on that
    grid, cropped and strided as ``F.conv2d`` would. The achieved, quantised rate is
    ``spectral_band(padded_input_size, c).compression``.

    Half-precision inputs (and autocast regions) run the frequency-domain math in float32 and
    return the dtype ``F.conv2d`` would return.

    Args:
        input: ``(N, C_in, H, W)`` or unbatched ``(C_in, H, W)``.
        weight: ``(C_out, C_in // groups, kH, kW)``.
        bias: optional ``(C_out,)``.
        stride: int or ``(sH, sW)``.
        padding: int, ``(pH, pW)``, ``"same"`` or ``"valid"``.
        dilation: int or ``(dH, dW)``.
        groups: number of blocked connections from input to output channels.
        padding_mode: ``"zeros"``, ``"reflect"``, ``"replicate"`` or ``"circular"``.
        compression: fraction of spectral coefficients to discard, in ``[0, 1)``.
        memory_lean: while gradients are recorded, keep for backward the smallest exact form of
            the input (the recipe an earlier lean op published for it, its kept spectrum, or the
            input itself), offer the output's kept spectrum to a following lean BatchNorm
            (:mod:`~lightning_bandlimit.functional.lean_ops`), and at a full band (e.g.
            ``compression=0``) run the native convolution, which is exact. The result and the
            gradients are the same either way (to round-off).
        algorithm: ``"auto"`` (default): a full band runs the native convolution, any other
            band the cheaper of ``"spectral"`` (this module's frequency-domain algorithm) and
            ``"spatial"`` (the input projected onto the band, then the native convolution),
            chosen per layer shape by a fixed cost model
            (:mod:`~lightning_bandlimit.functional.algorithm`). Naming one forces it, at every
            band. All three give the same result and gradients (to round-off).

    Returns:
        ``(N, C_out, H_out, W_out)`` (or unbatched), as ``F.conv2d``.

    Raises:
        ValueError: on a compression outside ``[0, 1)``, an unknown ``algorithm``, tensors of
            the wrong rank, a channel or group mismatch, or any argument ``F.conv2d`` would
            reject; the message names the expected and the given value.

    Example:
        >>> import torch.nn.functional as F
        >>> x = torch.randn(2, 3, 16, 16, dtype=torch.float64)
        >>> w = torch.randn(4, 3, 3, 3, dtype=torch.float64)
        >>> torch.allclose(fft_conv2d(x, w, padding=1), F.conv2d(x, w, padding=1))
        True
        >>> fft_conv2d(x, w, padding=1, compression=0.5).shape
        torch.Size([2, 4, 16, 16])
    """
    return _fft_conv(
        input,
        weight,
        bias,
        stride,
        padding,
        dilation,
        groups,
        padding_mode,
        compression,
        2,
        memory_lean,
        algorithm,
    )


def fft_conv1d(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    stride: IntOrTuple = 1,
    padding: IntOrTuple | str = 0,
    dilation: IntOrTuple = 1,
    groups: int = 1,
    *,
    padding_mode: str = "zeros",
    compression: float = 0.0,
    memory_lean: bool = False,
    algorithm: str = "auto",
) -> torch.Tensor:
    """1-D convolution (cross-correlation) computed in the frequency domain, optionally band-limited.

    The 1-D counterpart of :func:`fft_conv2d`, with the arguments of
    ``torch.nn.functional.conv1d``; the band keeps the lowest one-sided frequencies
    (achieved rate: ``spectral_band((1, padded_length), c).compression``).

    Args:
        input: ``(N, C_in, L)`` or unbatched ``(C_in, L)``.
        weight: ``(C_out, C_in // groups, k)``.
        bias: optional ``(C_out,)``.
        stride: int or ``(s,)``.
        padding: int, ``(p,)``, ``"same"`` or ``"valid"``.
        dilation: int or ``(d,)``.
        groups: number of blocked connections from input to output channels.
        padding_mode: ``"zeros"``, ``"reflect"``, ``"replicate"`` or ``"circular"``.
        compression: fraction of spectral coefficients to discard, in ``[0, 1)``.
        memory_lean: as :func:`fft_conv2d`.
        algorithm: as :func:`fft_conv2d`.

    Returns:
        ``(N, C_out, L_out)`` (or unbatched), as ``F.conv1d``.

    Raises:
        ValueError: as :func:`fft_conv2d`.

    Example:
        >>> import torch.nn.functional as F
        >>> x = torch.randn(2, 3, 50, dtype=torch.float64)
        >>> w = torch.randn(4, 3, 5, dtype=torch.float64)
        >>> torch.allclose(fft_conv1d(x, w, padding="same"), F.conv1d(x, w, padding="same"))
        True
    """
    return _fft_conv(
        input,
        weight,
        bias,
        stride,
        padding,
        dilation,
        groups,
        padding_mode,
        compression,
        1,
        memory_lean,
        algorithm,
    )
