"""The kept band as a real projection on the padded grid, for the spatial algorithm.

Truncating the spectra of both input and filter to the same box ``M`` is the same as truncating
the input's alone (``M x M = M``), and the circular cross-correlation on the padded grid equals
the "valid" convolution of the padded input (the grid is exactly the padded input, nothing wraps
around). So a band-limited convolution is ``F.conv2d(P(pad(x)), w, stride, padding=0)``, with
``P`` the orthogonal projection onto the band: the native kernel does the channel mixing, and
only ``P`` is new. The box is separable, ``P = P_h (x) P_w``, and each factor has the real
orthonormal basis ``1, sqrt(2) cos(2 pi f p / G), sqrt(2) sin(2 pi f p / G)`` (``f = 1..n``, scaled
by ``1 / sqrt(G)``) of the kept frequencies ``|f| <= n``; the padding (any mode) is folded into
the analysis matrices as in :mod:`.dft_plan`. Per axis, ``analysis = B^T A`` (band coefficients
of the padded input) and ``synthesis = B`` (back onto the grid). Along an axis where the kernel
is one tap wide, the strided convolution reads only every ``stride``-th position, so the synthesis
is evaluated there alone and the convolution runs with stride 1 on that axis. On small maps the
two axes are one dense ``(G_h G_w, H W)`` matrix, :attr:`ProjectionPlan.dense` (one large matrix
product instead of many tiny ones).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from lightning_bandlimit.functional.band import SpectralBand, spectral_band
from lightning_bandlimit.functional.dft_plan import source_positions
from lightning_bandlimit.functional.geometry import ConvGeometry

__all__ = [
    "ProjectionPlan",
    "band_input",
    "band_input_adjoint",
    "projection_plan",
    "projection_plan_for",
    "reduce_input",
]

_DENSE_PIXELS = 100  # maps up to 10 x 10


@dataclass(frozen=True)
class ProjectionPlan:
    """Real matrices of the band projection of one geometry (see module docstring).

    Attributes:
        geometry: the convolution's geometry.
        band: the kept spectral band.
        analysis_h: ``(R, H)``: band coefficients along H of the padded input (``R`` kept
            two-sided frequencies, counted as real basis functions).
        analysis_w: ``(K, W)``: the same along W (``K = 2 * cols - 1``, or the whole grid).
        synthesis_h: ``(G_h, R)``: the basis along H at the grid positions the convolution reads.
        synthesis_w: ``(G_w, K)``: the basis along W, likewise.
        conv_stride: the stride of the native convolution on the synthesised input.
        dense: on small maps, ``synthesis (x) synthesis @ analysis (x) analysis`` as one
            ``(G_h G_w, H W)`` matrix; else ``None``.
    """

    geometry: ConvGeometry
    band: SpectralBand
    analysis_h: torch.Tensor
    analysis_w: torch.Tensor
    synthesis_h: torch.Tensor
    synthesis_w: torch.Tensor
    conv_stride: tuple[int, int]
    dense: torch.Tensor | None = None

    @property
    def coefficients(self) -> tuple[int, int]:
        """``(R, K)``: real band coefficients per channel."""
        return self.analysis_h.shape[0], self.analysis_w.shape[0]


def _basis(grid: int, half: int) -> torch.Tensor:
    """``(grid, 2 * half + 1)`` orthonormal real basis of frequencies ``|f| <= half`` (all if full)."""
    if 2 * half + 1 >= grid:
        return torch.eye(grid, dtype=torch.float64)
    p = torch.arange(grid)
    f = torch.arange(1, half + 1)
    # Reduce f * p modulo grid in integers first: exact phases for any size.
    angle = (p[:, None] * f[None, :]).remainder(grid).to(torch.float64) * (2 * math.pi / grid)
    scale = math.sqrt(2.0 / grid)
    dc = torch.full((grid, 1), 1.0 / math.sqrt(grid), dtype=torch.float64)
    return torch.cat([dc, scale * torch.cos(angle), scale * torch.sin(angle)], 1)


def _fold_padding(basis: torch.Tensor, size: int, pads: tuple[int, int], mode: str) -> torch.Tensor:
    """``(size, B)``: ``A^T basis``, the basis read as a function of the unpadded input."""
    source = source_positions(size, *pads, mode)
    used = source >= 0
    out = torch.zeros(size, basis.shape[1], dtype=basis.dtype)
    return out.index_add_(0, source[used], basis[used])


@functools.lru_cache(maxsize=512)
def _cpu_plan(geometry: ConvGeometry, band: SpectralBand) -> ProjectionPlan:
    grid_h, grid_w = geometry.grid
    half_h = band.half_rows if band.rows < grid_h else grid_h
    half_w = band.cols - 1 if band.cols < grid_w // 2 + 1 else grid_w
    b_h, b_w = _basis(grid_h, half_h), _basis(grid_w, half_w)
    (pad_h, pad_w), mode = geometry.pads, geometry.padding_mode
    a_h = _fold_padding(b_h, geometry.in_size[0], pad_h, mode).T
    a_w = _fold_padding(b_w, geometry.in_size[1], pad_w, mode).T
    synthesis, conv_stride = [], []
    for basis, extent, stride, out in zip(
        (b_h, b_w), geometry.dilated_kernel, geometry.stride, geometry.out_size
    ):
        one_tap = extent == 1
        synthesis.append(basis[: out * stride : stride] if one_tap else basis)
        conv_stride.append(1 if one_tap else stride)
    dense = None
    if geometry.in_size[0] * geometry.in_size[1] <= _DENSE_PIXELS:
        dense = torch.kron(synthesis[0] @ a_h, synthesis[1] @ a_w)
    return ProjectionPlan(geometry, band, a_h, a_w, *synthesis, tuple(conv_stride), dense)  # type: ignore[arg-type]


@functools.lru_cache(maxsize=512)
def projection_plan_for(
    geometry: ConvGeometry, band: SpectralBand, dtype: torch.dtype, device: torch.device
) -> ProjectionPlan:
    """The cached :class:`ProjectionPlan` for a geometry and a band resolved already (trusted)."""
    plan = _cpu_plan(geometry, band)
    return ProjectionPlan(
        plan.geometry,
        plan.band,
        *(
            t.to(device=device, dtype=dtype).contiguous()
            for t in (plan.analysis_h, plan.analysis_w, plan.synthesis_h, plan.synthesis_w)
        ),
        plan.conv_stride,
        None if plan.dense is None else plan.dense.to(device=device, dtype=dtype).contiguous(),
    )


def projection_plan(
    geometry: ConvGeometry, compression: float, dtype: torch.dtype, device: torch.device
) -> ProjectionPlan:
    """The cached :class:`ProjectionPlan` for a geometry and compression, in ``dtype`` on ``device``.

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
        >>> plan = projection_plan(g, 0.5, torch.float64, torch.device("cpu"))
        >>> plan.coefficients, tuple(plan.synthesis_h.shape)
        ((7, 7), (10, 7))
    """
    return projection_plan_for(geometry, spectral_band(geometry.grid, compression), dtype, device)


def band_input(kept: torch.Tensor, plan: ProjectionPlan) -> torch.Tensor:
    """The band-limited padded input from what :func:`reduce_input` returned."""
    if plan.dense is None:
        return expand(kept, plan)
    n, c = kept.shape[:2]
    out = kept.reshape(n * c, -1) @ plan.dense.T
    return out.view(n, c, plan.synthesis_h.shape[0], plan.synthesis_w.shape[0])


def reduce_input(x: torch.Tensor, plan: ProjectionPlan) -> torch.Tensor:
    """What the input is reduced to before :func:`band_input`: its coefficients, or (dense) itself."""
    return x if plan.dense is not None else project(x, plan)


def band_input_adjoint(grad: torch.Tensor, plan: ProjectionPlan, in_shape: torch.Size) -> torch.Tensor:
    """Transpose of ``band_input(reduce_input(x))``: the input gradient from the padded input's."""
    if plan.dense is None:
        return project_adjoint(expand_adjoint(grad, plan), plan)
    n, c = grad.shape[:2]
    return (grad.reshape(n * c, -1) @ plan.dense).view(in_shape)


def project(x: torch.Tensor, plan: ProjectionPlan) -> torch.Tensor:
    """``(N, C, H, W)`` input -> ``(N, C, R, K)`` band coefficients of its padded grid."""
    t = torch.matmul(x, plan.analysis_w.T)  # (N, C, H, K)
    return torch.matmul(plan.analysis_h, t)


def expand(z: torch.Tensor, plan: ProjectionPlan) -> torch.Tensor:
    """``(N, C, R, K)`` coefficients -> ``(N, C, G_h, G_w)``: the band-limited padded input."""
    t = torch.matmul(plan.synthesis_h, z)  # (N, C, G_h, K)
    return torch.matmul(t, plan.synthesis_w.T)


def expand_adjoint(g: torch.Tensor, plan: ProjectionPlan) -> torch.Tensor:
    """Transpose of :func:`expand`: ``(N, C, G_h, G_w)`` -> ``(N, C, R, K)``."""
    t = torch.matmul(g, plan.synthesis_w)  # (N, C, G_h, K)
    return torch.matmul(plan.synthesis_h.T, t)


def project_adjoint(z: torch.Tensor, plan: ProjectionPlan) -> torch.Tensor:
    """Transpose of :func:`project`: ``(N, C, R, K)`` -> ``(N, C, H, W)``."""
    t = torch.matmul(plan.analysis_h.T, z)  # (N, C, H, K)
    return torch.matmul(t, plan.analysis_w)
