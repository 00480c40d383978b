"""The DFT matrices of one band-limited convolution, built once per shape and cached.

Feature maps of convolutional networks are small (4 to 64 pixels a side), so each 1-D DFT is
done as a matrix product rather than an FFT: it runs at matrix-multiply speed, needs no
FFT-friendly grid size, and computes only the rows that are used: the kept band on the way in,
the (strided) output positions on the way out, the dilated kernel taps for the filter. Padding
(of any mode) is folded into the analysis matrices: a padded position that copies input position
``h`` adds its DFT column to column ``h``. The backward pass uses the transposes.

All matrices are real; a complex spectrum is stored as two real blocks ``(re, im)``. Along the
last axis the transform is one-sided (real FFT), along the other axis two-sided.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from lightning_bandlimit.functional.band import SpectralBand, spectral_band
from lightning_bandlimit.functional.geometry import ConvGeometry

__all__ = [
    "DFTPlan",
    "analysis",
    "analysis_adjoint",
    "band_frequencies",
    "batch_slices",
    "dft_plan",
    "dft_plan_for",
    "source_positions",
    "synthesis",
    "synthesis_adjoint",
]


@dataclass(frozen=True)
class DFTPlan:
    """Real matrices of one convolution geometry and band (see module docstring).

    Shapes, with input ``H x W``, band ``R x K`` (``F = R K`` kept frequencies), output
    ``P x Q`` and kernel ``kh x kw``. A "stacked" index ``(j, k)`` runs over re/im ``j`` first.

    Attributes:
        geometry: the convolution's geometry.
        band: the kept spectral band.
        analysis_w: ``(2K, W)``: one-sided DFT along W of a real row, stacked ``[re; im]``.
        analysis_h: ``(2R, 2H)``: complex DFT along H; rows ``(j, r)``, columns ``(h, j)``.
        synthesis_h: ``(2P, 2R)``: inverse DFT along H at the output rows; rows ``(p, j)``,
            columns ``(j, r)``.
        synthesis_w: ``(2K, Q)``: real inverse of the one-sided DFT at the output columns,
            including the ``1 / (H_grid W_grid)`` normalisation.
        filter_analysis: ``(2F, kh kw)``: 2-D DFT of the dilated kernel, rows ``(f, j)`` (re/im
            interleaved, so that a run of frequencies is one contiguous block of rows).
        analysis_h_t, synthesis_h_t: contiguous transposes, for the backward pass.
    """

    geometry: ConvGeometry
    band: SpectralBand
    analysis_w: torch.Tensor
    analysis_h: torch.Tensor
    synthesis_h: torch.Tensor
    synthesis_w: torch.Tensor
    filter_analysis: torch.Tensor
    analysis_h_t: torch.Tensor
    synthesis_h_t: torch.Tensor


def _phase(freqs: torch.Tensor, positions: torch.Tensor, size: int, sign: float) -> torch.Tensor:
    """``exp(sign * 2 pi i f p / size)`` as an ``(len(freqs), len(positions))`` complex matrix."""
    # Reduce f * p modulo size in integers first: keeps float64 phases exact for any size.
    angle = (freqs[:, None] * positions[None, :]).remainder(size).to(torch.float64)
    return torch.polar(torch.ones_like(angle), angle * (sign * 2 * math.pi / size))


def source_positions(size: int, before: int, after: int, mode: str) -> torch.Tensor:
    """For each padded position, the input position it copies (-1: a zero of zero padding)."""
    positions = torch.arange(-before, size + after)
    if mode == "zeros":
        return torch.where((positions >= 0) & (positions < size), positions, -1)
    if mode == "reflect":
        positions = positions.abs()
        return torch.where(positions >= size, 2 * (size - 1) - positions, positions)
    if mode == "replicate":
        return positions.clamp(0, size - 1)
    return positions.remainder(size)  # circular


def _analysis(freqs: torch.Tensor, size: int, grid: int, pads: tuple[int, int], mode: str) -> torch.Tensor:
    """Complex ``(len(freqs), size)``: DFT on the padded grid, as a function of the input."""
    source = source_positions(size, *pads, mode)
    full = _phase(freqs, torch.arange(grid), grid, -1.0)
    used = source >= 0
    out = torch.zeros(len(freqs), size, dtype=full.dtype)
    return out.index_add_(1, source[used], full[:, used])


def _complex_block(matrix: torch.Tensor) -> torch.Tensor:
    """Real ``[[re, -im], [im, re]]``: complex product on stacked ``[re; im]`` operands."""
    return torch.cat([torch.cat([matrix.real, -matrix.imag], 1), torch.cat([matrix.imag, matrix.real], 1)], 0)


def band_frequencies(band: SpectralBand) -> tuple[torch.Tensor, torch.Tensor]:
    """The band's row frequencies (two-sided, in spectrum order) and column frequencies."""
    height = band.grid[0]
    if band.rows < height:
        n = band.half_rows
        rows = torch.cat([torch.arange(0, n + 1), torch.arange(-n, 0)])
    else:
        rows = torch.arange(height)
    return rows, torch.arange(band.cols)


@functools.lru_cache(maxsize=512)
def _cpu_plan(geometry: ConvGeometry, band: SpectralBand) -> DFTPlan:
    grid_h, grid_w = geometry.grid
    rows, cols = band_frequencies(band)
    (pad_h, pad_w), mode = geometry.pads, geometry.padding_mode
    in_h, in_w = geometry.in_size
    out_h, out_w = geometry.out_size

    a_w = _analysis(cols, in_w, grid_w, pad_w, mode)
    analysis_w = torch.cat([a_w.real, a_w.imag], 0)
    a_h = _complex_block(_analysis(rows, in_h, grid_h, pad_h, mode))
    analysis_h = a_h.view(2 * len(rows), 2, in_h).transpose(1, 2).reshape(2 * len(rows), 2 * in_h)
    s_h = _complex_block(_phase(torch.arange(out_h) * geometry.stride[0], rows, grid_h, 1.0))
    synthesis_h = s_h.view(2, out_h, 2 * len(rows)).transpose(0, 1).reshape(2 * out_h, -1)
    # Real inverse of a one-sided spectrum: every column but DC and Nyquist stands for itself
    # and its Hermitian mirror.
    weight = torch.full((band.cols,), 2.0, dtype=torch.float64)
    weight[0] = 1.0
    if grid_w % 2 == 0 and band.cols == grid_w // 2 + 1:
        weight[-1] = 1.0
    s_w = _phase(cols, torch.arange(out_w) * geometry.stride[1], grid_w, 1.0)
    s_w = s_w * (weight[:, None] / (grid_h * grid_w))
    synthesis_w = torch.cat([s_w.real, -s_w.imag], 0)

    kh, kw = geometry.kernel
    e_h = _phase(rows, torch.arange(kh) * geometry.dilation[0], grid_h, -1.0)
    e_w = _phase(cols, torch.arange(kw) * geometry.dilation[1], grid_w, -1.0)
    e = (e_h[:, None, :, None] * e_w[None, :, None, :]).reshape(len(rows) * len(cols), kh * kw)
    filter_analysis = torch.stack([e.real, e.imag], 1).reshape(2 * e.shape[0], -1)
    return DFTPlan(
        geometry,
        band,
        analysis_w,
        analysis_h,
        synthesis_h,
        synthesis_w,
        filter_analysis,
        analysis_h.T,
        synthesis_h.T,
    )


def dft_plan(geometry: ConvGeometry, compression: float, dtype: torch.dtype, device: torch.device) -> DFTPlan:
    """The cached :class:`DFTPlan` for a geometry and compression, in ``dtype`` on ``device``.

    Args:
        geometry: the resolved convolution geometry.
        compression: requested compression (quantised by :func:`spectral_band`).
        dtype: ``torch.float32`` or ``torch.float64``.
        device: where the matrices live.

    Raises:
        ValueError: if ``compression`` is outside ``[0, 1)``.

    Example:
        >>> from lightning_bandlimit.functional.geometry import resolve_geometry
        >>> x, w = torch.zeros(1, 1, 8, 8), torch.zeros(1, 1, 3, 3)
        >>> g = resolve_geometry(x, w, None, 1, 1, 1, 1, "zeros", 2)
        >>> dft_plan(g, 0.0, torch.float32, torch.device("cpu")).analysis_w.shape
        torch.Size([12, 8])
    """
    return dft_plan_for(geometry, spectral_band(geometry.grid, compression), dtype, device)


@functools.lru_cache(maxsize=512)
def dft_plan_for(
    geometry: ConvGeometry, band: SpectralBand, dtype: torch.dtype, device: torch.device
) -> DFTPlan:
    """The cached :class:`DFTPlan` for a geometry and a band resolved already (trusted, not checked)."""
    plan = _cpu_plan(geometry, band)
    return DFTPlan(
        plan.geometry,
        plan.band,
        *(
            t.to(device=device, dtype=dtype).contiguous()
            for t in (
                plan.analysis_w,
                plan.analysis_h,
                plan.synthesis_h,
                plan.synthesis_w,
                plan.filter_analysis,
                plan.analysis_h_t,
                plan.synthesis_h_t,
            )
        ),
    )


# ------------------------------------------------- applying a plan
# Each transform passes through an intermediate about the size of a feature map (one axis done,
# the other not). It is made a batch slice at a time, so that a backward pass, whose peak is a
# few feature maps, does not hold a whole extra one.
_TRANSIENT_BYTES = 1 << 21


def batch_slices(n: int, per_sample_bytes: int, budget_bytes: int) -> list[slice]:
    """Slices of a batch of ``n`` whose per-sample temporaries stay within ``budget_bytes``.

    Example:
        >>> batch_slices(10, 4, 12)
        [slice(0, 3, None), slice(3, 6, None), slice(6, 9, None), slice(9, 10, None)]
    """
    step = max(1, min(n, budget_bytes // max(1, per_sample_bytes)))
    return [slice(i, min(i + step, n)) for i in range(0, n, step)]


def _maps_to_spectrum(maps: torch.Tensor, right: torch.Tensor, left: torch.Tensor) -> torch.Tensor:
    """``(N, C, A, B)`` -> ``(2, F, N, C)``: ``right`` ``(2K, B)`` along the last axis (batched
    over ``A``), then ``left`` ``(2R, 2A)`` along the other."""
    n, c, a, b = maps.shape
    k = right.shape[0] // 2
    pieces = batch_slices(n, a * 2 * k * c * maps.element_size(), _TRANSIENT_BYTES)
    out = maps.new_empty(left.shape[0], k, n, c) if len(pieces) > 1 else None
    for part in pieces:
        m = part.stop - part.start
        rows = maps[part].reshape(m * c, a, b).permute(1, 2, 0)  # (A, B, mC): a transposed GEMM operand
        t = torch.bmm(right.expand(a, 2 * k, b), rows)  # (A, 2K, mC) = (a, j, k, m, c)
        spec = left @ t.view(2 * a, k * m * c)
        if out is None:
            return spec.view(2, -1, n, c)
        out[:, :, part] = spec.view(-1, k, m, c)
    return out.view(2, -1, n, c)


def _spectrum_to_maps(spec: torch.Tensor, left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    """``(2, F, N, C)`` -> ``(N, C, A, B)``: ``left`` ``(2A, 2R)`` along the two-sided axis, then
    ``right`` ``(2K, B)`` along the last one."""
    _, _, n, c = spec.shape
    k, b, a = right.shape[0] // 2, right.shape[1], left.shape[0] // 2
    out = spec.new_empty(n, c, a, b)
    pieces = batch_slices(n, a * 2 * k * c * spec.element_size(), _TRANSIENT_BYTES)
    blocks = spec.view(left.shape[1], k, n, c)
    for part in pieces:
        m = part.stop - part.start
        piece = blocks if len(pieces) == 1 else blocks[:, :, part].contiguous()
        t = (left @ piece.view(left.shape[1], -1)).view(a, 2 * k, m * c)
        rows = out[part].view(m * c, a, b).permute(1, 0, 2)  # (A, mC, B) view of the result
        torch.bmm(t.transpose(1, 2), right.expand(a, 2 * k, b), out=rows)
    return out


def analysis(x: torch.Tensor, plan: DFTPlan) -> torch.Tensor:
    """``(N, C, H, W)`` real -> ``(2, F, N, C)`` kept spectrum."""
    return _maps_to_spectrum(x, plan.analysis_w, plan.analysis_h)


def analysis_adjoint(spec: torch.Tensor, plan: DFTPlan) -> torch.Tensor:
    """Transpose of :func:`analysis`: ``(2, F, N, C)`` -> ``(N, C, H, W)``."""
    return _spectrum_to_maps(spec, plan.analysis_h_t, plan.analysis_w)


def synthesis(spec: torch.Tensor, plan: DFTPlan) -> torch.Tensor:
    """``(2, F, N, O)`` -> ``(N, O, P, Q)`` real output at the strided output positions."""
    return _spectrum_to_maps(spec, plan.synthesis_h, plan.synthesis_w)


def synthesis_adjoint(grad: torch.Tensor, plan: DFTPlan) -> torch.Tensor:
    """Transpose of :func:`synthesis`: ``(N, O, P, Q)`` -> ``(2, F, N, O)``."""
    return _maps_to_spectrum(grad, plan.synthesis_w, plan.synthesis_h_t)
