"""The per-frequency products of a band-limited convolution: output spectrum, input and filter gradients.

Spectra are kept frequency-major, ``(2, F, N, C)`` = (re/im, kept frequencies, batch, channels),
so that per kept frequency the channel mixing ``Y = X conj(W)^T`` is one batched matrix multiply
(grouped and depthwise convolutions have their own forms); its two transposes give the input's
and the filter's gradient spectra. The filter spectrum is never held whole: it is computed from
the weight a chunk of frequencies at a time, in a small buffer that is reused.

Both autograd Functions of a band-limited convolution call these products: the spectral kernel
(:mod:`.spectral_kernel`) and the convolution split at its kept input spectrum
(:mod:`.spectrum_split`). They trust their arguments: tensors in the compute dtype and the 2-D
form, a plan for the layer's geometry and band.
"""

from __future__ import annotations

import torch

from lightning_bandlimit.functional.dft_plan import DFTPlan

__all__ = ["filter_grad", "input_grad_spectrum", "output_spectrum", "taps_of"]

# The full filter spectrum (F x O x C/g complex) is larger than the activation for wide layers,
# so it is computed a chunk of frequencies at a time: a small buffer, reused. Every chunk
# re-reads the weight (and read-modify-writes its gradient), hence the cap on their number.
_FILTER_CHUNK_BYTES = 1 << 22
_MAX_FILTER_CHUNKS = 4


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


def taps_of(w: torch.Tensor) -> torch.Tensor:
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


def output_spectrum(x_spec: torch.Tensor, w: torch.Tensor, taps: torch.Tensor, plan: DFTPlan) -> torch.Tensor:
    """Output spectrum ``(2, F, N, O)`` from a kept input spectrum (compute dtype, 2-D form)."""
    y_spec = x_spec.new_empty(2, x_spec.shape[1], x_spec.shape[2], w.shape[0])
    chunks = _chunks(plan, w.shape, w.element_size())
    buffer = _filter_buffer(plan, w, chunks[0][1])
    for f0, f1 in chunks:
        w_spec = _filter_chunk(plan, taps, f0, f1, buffer)
        _mix(y_spec[:, f0:f1], x_spec[:, f0:f1], w_spec, plan.geometry.groups)
    return y_spec


def filter_grad(
    g_spec: torch.Tensor, x_spec: torch.Tensor, w: torch.Tensor, grad_taps: torch.Tensor, plan: DFTPlan
) -> None:
    """Adds the filter gradient of output-gradient spectrum ``g_spec`` to ``grad_taps``."""
    chunks = _chunks(plan, w.shape, w.element_size())
    buffer = _filter_buffer(plan, w, chunks[0][1])
    for f0, f1 in chunks:
        gw_spec = _grad_chunk(buffer, f1 - f0)
        _mix_grad_filter(gw_spec, x_spec[:, f0:f1], g_spec[:, f0:f1], plan.geometry.groups)
        _accumulate_filter_grad(grad_taps, plan, gw_spec, f0, f1)


def input_grad_spectrum(
    g_spec: torch.Tensor, w: torch.Tensor, taps: torch.Tensor, plan: DFTPlan
) -> torch.Tensor:
    """Gradient of the kept input spectrum from output-gradient spectrum ``g_spec``."""
    groups = plan.geometry.groups
    chunks = _chunks(plan, w.shape, w.element_size())
    buffer = _filter_buffer(plan, w, chunks[0][1])
    gx_spec = g_spec.new_empty(2, g_spec.shape[1], g_spec.shape[2], w.shape[1] * groups)
    for f0, f1 in chunks:
        w_spec = _filter_chunk(plan, taps, f0, f1, buffer)
        _mix_grad_input(gx_spec[:, f0:f1], g_spec[:, f0:f1], w_spec, groups)
    return gx_spec
