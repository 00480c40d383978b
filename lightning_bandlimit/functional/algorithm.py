"""Which algorithm computes a band-limited convolution: chosen per layer shape, deterministically.

Three exact algorithms share one band semantics:

* ``"native"``: the band keeps every coefficient of its grid (e.g. ``compression=0``), so the
  layer *is* the convolution: ``F.conv2d`` itself.
* ``"spectral"``: the frequency-domain algorithm of :mod:`.spectral_kernel` (DFT matrices, channel
  mixing per kept frequency). Its mixing shrinks with the band, but its transforms and its
  filter spectrum (``2 F`` coefficients per kernel, read and written once per pass, whatever the
  batch) do not.
* ``"spatial"``: :mod:`.spatial_conv`, the band projection of the input followed by the native
  convolution: native cost plus two small matrix products per input channel.

``"auto"`` estimates the time of one forward and backward pass of each from a fixed cost
model (multiply-adds at a measured rate per kind of kernel, plus the filter spectrum's memory
traffic) and takes the cheapest; the choice is cached per shape. The model was fitted on a
2-core x86 CPU with the ResNet-18 layer shapes of ``benchmarks/speed/conv.py``; it is deterministic
(no timing at run time), so every process and every rank makes the same choice. In memory-lean
training a layer whose kept output spectrum is smaller than its output stays spectral: only that
algorithm can hand the next BatchNorm its input as that spectrum (:mod:`.lean.sources`).
"""

from __future__ import annotations

import functools

from lightning_bandlimit.functional.band import SpectralBand
from lightning_bandlimit.functional.geometry import ConvGeometry

__all__ = ["ALGORITHMS", "check_algorithm", "choose_algorithm"]

ALGORITHMS = ("auto", "spectral", "spatial")

# Cost model, in seconds per operation (2-core CPU, float32). Native convolutions run near
# peak with wide input channels and far below it with a handful (an RGB stem); the batched
# small matrix products of the transforms and the mixing run at about half the native rate.
_CONV_FLOPS = 120e9
_FULL_WIDTH = 8  # input channels per group from which the native kernel reaches its rate
_GEMM_FLOPS = 80e9
_BYTES = 6e9  # filter spectrum traffic
_FULL_BATCH = 16  # batch from which the per-frequency channel mixing (batch rows) reaches its rate
_PADDED_INPUT = 1.15  # the native kernel on a pre-padded input, measured against the same with padding


def check_algorithm(algorithm: str) -> str:
    """Validate an ``algorithm`` argument.

    Raises:
        ValueError: if ``algorithm`` is not one of :data:`ALGORITHMS`.

    Example:
        >>> check_algorithm("auto")
        'auto'
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    return algorithm


def _native(g: ConvGeometry, n: int, c: int, o: int, passes: int) -> float:
    cg = c // g.groups
    flops = 2.0 * n * o * cg * g.kernel[0] * g.kernel[1] * g.out_size[0] * g.out_size[1]
    return passes * flops / (_CONV_FLOPS * min(1.0, cg / _FULL_WIDTH))


def _spatial(
    g: ConvGeometry, band: SpectralBand, n: int, c: int, o: int, need_x: bool, need_w: bool
) -> float:
    (h, w), (gh, gw) = g.in_size, g.grid
    rows = gh if band.rows == gh else band.rows
    cols = gw if band.cols == gw // 2 + 1 else 2 * band.cols - 1
    # Along a one-tap axis only the strided positions are synthesised.
    gh, gw = (o_ if k == 1 else g_ for o_, k, g_ in zip(g.out_size, g.dilated_kernel, (gh, gw)))
    project = 2.0 * n * c * (h * w * cols + rows * h * cols)
    expand = 2.0 * n * c * (gh * rows * cols + gh * cols * gw)
    transforms = (project + expand) * (1 + need_x) + expand * need_w
    return _PADDED_INPUT * _native(g, n, c, o, 1 + need_x + need_w) + transforms / _GEMM_FLOPS


def _spectral(
    g: ConvGeometry, band: SpectralBand, n: int, c: int, o: int, need_x: bool, need_w: bool
) -> float:
    (h, w), (p, q) = g.in_size, g.out_size
    r, k, f = band.rows, band.cols, band.kept
    analysis = 2.0 * n * c * (h * 2 * k * w + 2 * r * 2 * h * k)
    synthesis = 2.0 * n * o * (2 * r * 2 * p * k + p * 2 * k * q)
    mix = 8.0 * f * n * (c // g.groups) * o
    filter_bytes = 4.0 * 2 * f * o * (c // g.groups)
    transforms = analysis + 2 * synthesis + need_x * analysis
    mixing = mix * (1 + need_x + need_w) / min(1.0, n / _FULL_BATCH)
    passes = 1 + need_x + need_w
    return (transforms + mixing) / _GEMM_FLOPS + passes * filter_bytes / _BYTES


@functools.lru_cache(maxsize=4096)
def choose_algorithm(
    geometry: ConvGeometry,
    band: SpectralBand,
    batch: int,
    channels: int,
    out_channels: int,
    need_input_grad: bool,
    need_weight_grad: bool = True,
) -> str:
    """The cheaper of ``"spectral"`` and ``"spatial"`` for one layer shape (module docstring).

    A full band is left to the caller (the native convolution is exact there).

    Args:
        geometry: the convolution's geometry.
        band: the kept band on its grid.
        batch, channels, out_channels: ``N``, ``C_in``, ``C_out``.
        need_input_grad: whether the input's gradient is computed (not for a network's stem).
        need_weight_grad: whether the weight's gradient is computed (training).

    Example:
        >>> from lightning_bandlimit.functional.band import spectral_band
        >>> g = ConvGeometry((32, 32), ((1, 1), (1, 1)), (3, 3), (1, 1), (1, 1), 1, "zeros")
        >>> choose_algorithm(g, spectral_band(g.grid, 0.5), 32, 64, 64, True)
        'spectral'
        >>> g1 = ConvGeometry((32, 32), ((0, 0), (0, 0)), (1, 1), (2, 2), (1, 1), 1, "zeros")
        >>> choose_algorithm(g1, spectral_band(g1.grid, 0.5), 32, 64, 128, True)
        'spatial'
    """
    args = (geometry, band, batch, channels, out_channels, need_input_grad, need_weight_grad)
    return "spectral" if _spectral(*args) <= _spatial(*args) else "spatial"
